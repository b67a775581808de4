//! Command-line flags, parsed and range-checked by clap; [`crate::commands`] turns them
//! into validated settings.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::BackendKind;

/// Trains a model and reports what it cost, to show the fixes for "CUDA out of memory".
#[derive(Debug, Parser)]
#[command(
    name = "trainer",
    version,
    args_conflicts_with_subcommands = true,
    after_help = after_help()
)]
pub struct Cli {
    /// Something other than training.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Training flags (the default command).
    #[command(flatten)]
    pub run: RunArgs,

    /// Check the flags and load the config(s), then stop: nothing is trained or written.
    #[arg(long, global = true)]
    pub dry_run: bool,

    /// Where a child run (of compare or find-batch-size) writes its failure as JSON.
    #[arg(long, global = true, hide = true, value_name = "PATH")]
    pub failure_json: Option<PathBuf>,
}

/// `trainer --help`'s epilogue: examples, then the exit codes.
fn after_help() -> String {
    format!("{EXAMPLES}\n\n{}", crate::exit::HELP)
}

const EXAMPLES: &str = "Examples:
  trainer                                        # embedded default: configs/amp.toml
  trainer --config configs/f32.toml
  trainer --config configs/amp-accum.toml --max-steps 20
  trainer estimate --config configs/mobilenet.toml --set model.input_size=224
  trainer compare configs/*.toml --backend cpu --steps 20 --out runs/compare
  trainer find-batch-size --config configs/mobilenet.toml --backend cpu --budget 2GiB
  trainer --config configs/mobilenet.toml --backend cpu --max-steps 50
  trainer --config configs/amp.toml --backend wgpu --max-steps 5   # Vulkan/Metal GPU, or llvmpipe
  trainer --config configs/gpt-small.toml --set memory.checkpointing=blocks
  trainer estimate --config configs/gpt-small.toml --set model.seq_len=1024
  trainer --config configs/f32.toml --set train.batch_size=32 --set train.lr=3e-4
  trainer --config configs/f32.toml --summary-json runs/f32.json
  trainer --config configs/f32.toml --resume runs/f32/checkpoint";

/// What `trainer` can do besides training.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Predict a config's memory without training: parameters, gradients, optimizer state,
    /// half copies and the activations saved for backward, per layer.
    #[command(after_help = "Examples:
  trainer estimate --config configs/amp.toml
  trainer estimate --config configs/mobilenet.toml --set model.input_size=224 \\
      --set model.num_classes=1000 --set model.width_multiplier=0.5
  trainer estimate --config configs/mobilenet-amp.toml --json runs/estimate.json
  trainer estimate --config configs/gpt-small.toml --set model.n_layer=12 --set model.n_head=12 \\
      --set model.d_model=768 --set model.seq_len=1024 --set model.vocab_size=50257")]
    Estimate(EstimateArgs),

    /// Run several configs, each in a fresh process, and compare memory, speed and accuracy:
    /// a table, and report.md, report.csv, report.json, memory.svg, terms.svg and the line
    /// charts (steps.svg, timeline.svg; batch.svg or seq_len.svg when sweeping the batch size
    /// or a GPT's sequence length) in --out.
    #[command(after_help = "Examples:
  trainer compare configs/*.toml --backend cpu --steps 20
  trainer compare configs/f32.toml configs/amp.toml configs/amp-accum.toml --out runs/amp
  trainer compare configs/mobilenet*.toml --set model.width_multiplier=0.5
  trainer compare configs/f32.toml configs/amp.toml --sweep train.batch_size=32,64,128
  trainer compare configs/gpt-small.toml configs/gpt-small-memory-efficient.toml \\
      --backend cpu --steps 2 --sweep model.seq_len=64,128,256,512
  trainer compare configs/amp.toml configs/amp-free-cache.toml --backend wgpu --steps 5")]
    Compare(CompareArgs),

    /// Find the largest micro-batch that fits, by two-step trials at growing then bisected sizes,
    /// each in a fresh process; suggests the accum_steps that keeps the effective batch. With
    /// `--search seq_len`, the longest sequence a GPT config fits at its micro-batch instead.
    #[command(after_help = "Examples:
  trainer find-batch-size --config configs/mobilenet.toml --backend cpu --budget 2GiB
  trainer find-batch-size --config configs/amp.toml --backend cuda      # the GPU decides
  trainer find-batch-size --config configs/amp.toml --backend wgpu --budget 1GiB
  trainer find-batch-size --config configs/f32.toml --budget 1GiB --margin 0.2
  trainer find-batch-size --config configs/gpt-small.toml --backend cpu --budget 1GiB \\
      --search seq_len --set model.attention=memory_efficient")]
    FindBatchSize(FindArgs),

    /// Train over several processes on this machine, as over several machines: starts the
    /// orchestrator and NODES `trainer` processes with the training flags that follow, each
    /// with its `distributed.node_rank` and a port of its own. Node 0 writes the outputs.
    #[command(after_help = "Examples:
  trainer launch --nodes 2 --config configs/amp.toml --backend cpu
  trainer launch --nodes 2 --config configs/f32.toml --backend cpu \\
      --set 'distributed.devices=[\"cpu\",\"cpu\"]' --set distributed.timeout_s=60
On several machines, start one trainer per machine instead, each with the same flags and
  --set distributed.nodes=N --set distributed.node_rank=R
  --set distributed.orchestrator=\"ws://HOST:PORT\" --set distributed.node_address=\"ws://ME:PORT\"
after `trainer orchestrator --port PORT` on HOST.")]
    Launch(LaunchArgs),

    /// Serve the orchestrator that the nodes of a multi-process run register with, until
    /// SIGINT or SIGTERM (`trainer launch` starts one itself).
    Orchestrator(OrchestratorArgs),
}

/// `trainer launch`
#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// Processes to start, 2 to 64.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..=64))]
    pub nodes: u32,

    /// The orchestrator's port on 127.0.0.1 [default: a free one].
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,

    /// The training flags every node gets, as `trainer` itself takes them.
    #[arg(
        value_name = "TRAINER FLAGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub flags: Vec<String>,
}

/// `trainer orchestrator`
#[derive(Debug, Args)]
pub struct OrchestratorArgs {
    /// The port to listen on (all interfaces).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
}

/// `trainer compare`
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Config files to compare, in report order.
    #[arg(required = true, value_name = "CONFIG")]
    pub configs: Vec<PathBuf>,

    /// Optimizer steps per config (at least 1).
    #[arg(long, default_value_t = 20, value_name = "N", value_parser = at_least_one)]
    pub steps: usize,

    /// Backend for every run, overriding each config's `backend.kind`.
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,

    /// Override one key in every config (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,

    /// Run every config once per value of one key, e.g. train.batch_size=32,64,128.
    #[arg(long, value_name = "KEY=V1,V2,…")]
    pub sweep: Option<String>,

    /// Folder for the reports and each run's outputs [default: runs/compare, or runs/compare-N
    /// when an earlier report is there].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// Replace the report of an earlier compare in a named --out.
    #[arg(long)]
    pub overwrite: bool,

    /// A line written under every chart, e.g. when, where and at which commit it was measured
    /// (one line, at most 300 characters).
    #[arg(long, value_name = "TEXT", value_parser = one_line_note)]
    pub note: Option<String>,
}

/// A chart note: one line of at most 300 characters.
fn one_line_note(s: &str) -> Result<String, String> {
    match s {
        _ if s.contains(['\n', '\r']) => Err("must be one line".into()),
        _ if s.chars().count() > 300 => Err("must be at most 300 characters".into()),
        _ => Ok(s.to_string()),
    }
}

/// `trainer find-batch-size`
#[derive(Debug, Args)]
pub struct FindArgs {
    /// The config and its overrides.
    #[command(flatten)]
    pub config: ConfigArgs,

    /// Backend, overriding `backend.kind`.
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,

    /// Memory a trial may peak at, e.g. 2GiB (else `memory.budget`; required on the CPU and
    /// wgpu, which report no device memory size).
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub budget: Option<u64>,

    /// Safety margin in [0, 1): a trial fits when its peak is within budget × (1 − margin).
    #[arg(long, default_value_t = 0.1, value_name = "FRACTION", value_parser = fraction)]
    pub margin: f64,

    /// What to search: the largest micro-batch, or the longest `model.seq_len` at the config's
    /// micro-batch (GPT configs).
    #[arg(long, value_enum, default_value_t = SearchKey::BatchSize)]
    pub search: SearchKey,

    /// Largest micro-batch to try (1 to 65,536, the bound of train.batch_size; trials also stop
    /// at the train split's size).
    #[arg(long, default_value_t = 4096, value_name = "N", value_parser = batch_bound)]
    pub max_batch: usize,

    /// Longest seq_len to try with `--search seq_len` (1 to 65,536, the bound of
    /// model.seq_len; trials also stop where the text holds a micro-batch of windows).
    #[arg(long, default_value_t = 65_536, value_name = "N", value_parser = seq_len_bound)]
    pub max_seq_len: usize,

    /// Also write the trials and the answer as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// `trainer estimate`
#[derive(Debug, Args)]
pub struct EstimateArgs {
    /// The config and its overrides.
    #[command(flatten)]
    pub config: ConfigArgs,

    /// Also write the estimate as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// `--config` and `--set`, shared by every command that reads one config.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// TOML config file (see configs/README.md); without it, the embedded default.
    #[arg(short, long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Override one config key, e.g. `--set train.batch_size=32` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

/// Flags of a training run.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The config and its overrides.
    #[command(flatten)]
    pub config: ConfigArgs,

    /// Backend, overriding `backend.kind`.
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,

    /// Stop after N optimizer steps (same as `--set train.max_steps=N`).
    #[arg(long, value_name = "N")]
    pub max_steps: Option<usize>,

    /// Also write the end-of-run summary as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    pub summary_json: Option<PathBuf>,

    /// Continue from a checkpoint folder (e.g. runs/f32/checkpoint).
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,

    /// Replace the checkpoint an earlier run left in `train.output_dir`.
    #[arg(long)]
    pub overwrite: bool,

    /// Train even when the estimate says the run exceeds `memory.budget` or the GPU's free
    /// memory: a real allocation failure then ends the run (exit 3, fixes ranked).
    #[arg(long)]
    pub skip_memory_check: bool,

    /// One measuring step for find-batch-size: no budget check, evaluation or checkpoint.
    #[arg(long, hide = true)]
    pub trial: bool,
}

impl RunArgs {
    /// The convenience flags as `key=value` overrides, applied after the `--set`s (which are
    /// validated without them first).
    pub fn flag_overrides(&self) -> Vec<String> {
        let mut flags = Vec::new();
        if let Some(b) = self.backend {
            flags.push(format!("backend.kind={}", b.name()));
        }
        if let Some(n) = self.max_steps {
            flags.push(format!("train.max_steps={n}"));
        }
        flags
    }
}

/// A count of at least 1 (`--steps`, `--max-batch`).
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A micro-batch for `--max-batch`: 1 to `train.batch_size`'s bound.
fn batch_bound(text: &str) -> Result<usize, String> {
    at_most(text, crate::config::MAX_BATCH, "train.batch_size")
}

/// At least 1, at most `max`, the bound of the config key `key`.
fn at_most(text: &str, max: usize, key: &str) -> Result<usize, String> {
    match at_least_one(text)? {
        n if n > max => Err(format!("must be at most {max} (the bound of {key})")),
        n => Ok(n),
    }
}

/// What `find-batch-size` searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SearchKey {
    /// The largest micro-batch (`train.batch_size`).
    #[value(name = "batch_size")]
    BatchSize,
    /// The longest sequence (`model.seq_len`) at the config's micro-batch.
    #[value(name = "seq_len")]
    SeqLen,
}

/// `--max-seq-len`: at least 1, at most model.seq_len's bound.
fn seq_len_bound(text: &str) -> Result<usize, String> {
    at_most(text, burn_models::gpt::MAX_SEQ_LEN, "model.seq_len")
}

/// A fraction in [0, 1) (`--margin`).
fn fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if (0.0..1.0).contains(&f) => Ok(f),
        Ok(_) => Err("must be in [0, 1)".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A size such as `2GiB` (`--budget`), in bytes.
fn size(text: &str) -> Result<u64, String> {
    crate::config::parse_size(text).ok_or_else(|| crate::config::SIZE_HELP.into())
}
