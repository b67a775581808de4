//! The end-of-run summary: a table on stdout and the same fields as JSON.

use std::path::Path;

use burn::tensor::backend::AutodiffBackend;
use oomlab_engine::dtype_name;
use serde::{Deserialize, Serialize};

use crate::backend::{BackendUsed, Selected};
use crate::config::{
    AutotuneCache, Checkpointing, DeviceSpec, FreeCache, Fuse, Mistakes, OptimizerName,
    PrecisionMode, ScheduleName, Settings, Shard,
};
use crate::memory::estimate::{estimate, Target};
use crate::memory::{human, MemoryReport};
use crate::model::Network;
use crate::training::loss_scale::ScaleNow;
use crate::training::record::{Record, Warmup};
use crate::training::step::Stepper;

/// What a training run did. `--summary-json` writes exactly these fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub config: String,
    pub model: String,
    pub parameters: usize,
    pub backend: BackendUsed,
    pub precision: PrecisionMode,
    /// dtype batch norm computes in; absent for models without batch norm.
    pub batch_norm: Option<String>,
    /// `off`, or the scaling kind and the scale at the end of the run.
    pub loss_scale: ScaleNow,
    /// Optimizer steps skipped because a gradient overflowed.
    pub skipped_steps: usize,
    /// Pure f16 only: mean fraction of weights a step left unchanged (updates rounded away).
    pub updates_lost: Option<f64>,
    pub optimizer: OptimizerName,
    /// Data-parallel peers' devices, rank 0 first (absent on one device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<String>>,
    /// Processes the peers ran in (absent on one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// What each peer kept of the optimizer state and gradients (absent on one device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// Bytes of optimizer state (moments, momentum buffers) this peer (rank 0) held at the
    /// end, counted in its record: with sharding, its own parameters' only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_state_bytes: Option<u64>,
    /// Micro-batch size (one forward/backward, on each peer).
    pub batch_size: usize,
    pub accum_steps: usize,
    /// Samples per optimizer step (over all peers).
    pub effective_batch: usize,
    pub lr_schedule: ScheduleName,
    /// Learning rate the next step would use.
    pub final_lr: f64,
    pub steps: usize,
    pub epochs: usize,
    /// Images per second after the warm-up (over all peers).
    #[serde(deserialize_with = "nan_if_null")]
    pub images_per_sec: f64,
    /// Data parallel: seconds rank 0 spent per optimizer step in collective calls (sums,
    /// shared weights), waiting for the others included (absent on one device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_seconds_per_step: Option<f64>,
    /// A language model's tokens per sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<usize>,
    /// A language model's tokens per second after the warm-up (`images_per_sec` counts its
    /// sequences).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_sec: Option<f64>,
    /// The first steps of the process: kernel compilation, autotune, pools growing.
    pub warmup: Warmup,
    #[serde(deserialize_with = "nan_if_null")]
    pub final_train_loss: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub eval_loss: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub eval_accuracy: f64,
    /// A language model's eval perplexity, `exp(eval_loss)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_perplexity: Option<f64>,
    /// The last evaluation's speed: images (a language model: tokens) per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_per_sec: Option<f64>,
    pub wall_seconds: f64,
    pub checkpoint: String,
    /// `memory.free_cache`: when cached device memory was released.
    pub free_cache: FreeCache,
    /// `memory.checkpointing`: which activations autodiff kept.
    pub checkpointing: Checkpointing,
    /// `memory.fuse`: whether the blocks ran as fused ops (summaries written before it
    /// existed ran without fusion: the default).
    #[serde(default)]
    pub fuse: Fuse,
    /// CubeCL's kernel search (`backend.autotune`, `autotune_cache`); `n/a` on the CPU.
    #[serde(default)]
    pub autotune: String,
    /// The `[mistakes]` switches made, written as their names comma-separated, or `none`
    /// (summaries written before `[mistakes]` existed made none: the default).
    #[serde(default, with = "mistakes_text")]
    pub mistakes: Mistakes,
    /// `trainer estimate`'s prediction of `peak_bytes`.
    pub predicted_peak_bytes: u64,
    /// `trainer estimate`'s prediction of `training_peak_bytes` (its device peak: no data).
    #[serde(default)]
    pub predicted_training_peak_bytes: u64,
    /// `trainer estimate`'s analytic floor: the least a step of this model can peak at
    /// (`memory::floor`), compared with `training_peak_bytes`.
    #[serde(default)]
    pub floor_bytes: u64,
    /// measured / predicted − 1, where the probe measured a peak.
    pub prediction_error: Option<f64>,
    /// Memory over the training steps (evaluation excluded).
    #[serde(flatten)]
    pub memory: MemoryReport,
}

impl Summary {
    /// What a run of `settings` on `backend` did: its trained `model`, its `stepper` and
    /// `record`, the `epochs` completed and the `memory` its probe measured.
    pub fn from_run<B: AutodiffBackend>(
        settings: &Settings,
        backend: &Selected,
        model: &Network<B>,
        stepper: &Stepper<Network<B>, B>,
        record: &Record,
        epochs: usize,
        memory: MemoryReport,
    ) -> Self {
        let (t, m) = (&settings.train, &settings.memory);
        let e = estimate(settings, Target::of(backend.kind()));
        let predicted = e.predicted_peak();
        let eval = record.eval();
        let d = settings.distributed.as_ref();
        let peers = d.map_or(1, |d| d.world());
        let full = t.effective_batch() * peers;
        let window = record.largest_window().map_or(full, |w| w.min(full));
        Self {
            config: settings.path.display().to_string(),
            model: settings.model.name(),
            parameters: model.trainable_params(),
            backend: backend.used(),
            precision: settings.precision.mode,
            batch_norm: model
                .has_batch_norm()
                .then(|| dtype_name(settings.precision.policy().batch_norm).to_string()),
            loss_scale: stepper.scaler.now(),
            skipped_steps: stepper.skipped,
            updates_lost: record.updates_lost(),
            optimizer: t.optimizer,
            nodes: d.and_then(|d| d.nodes.as_ref()).map(|n| n.count),
            shard: d.map(|d| d.shard),
            optimizer_state_bytes: Some(stepper.optim.state_bytes()),
            // Every node's devices, node 0's first.
            peers: d.map(|d| {
                let name = |device: &DeviceSpec| match device {
                    DeviceSpec::Selected => backend.kind().name().to_string(),
                    device => device.to_string(),
                };
                let nodes = d.nodes.as_ref().map_or(1, |n| n.count as usize);
                (0..nodes)
                    .flat_map(|_| d.devices.iter().map(name))
                    .collect()
            }),
            // What the run really used: a split smaller than the window caps both.
            batch_size: t.batch_size.min(window),
            accum_steps: t.accum_steps,
            effective_batch: window,
            lr_schedule: t.lr_schedule,
            free_cache: m.free_cache,
            checkpointing: m.checkpointing,
            fuse: m.fuse,
            mistakes: settings.mistakes,
            autotune: match backend {
                Selected::Cpu => "n/a (CPU)".into(),
                _ => format!(
                    "{}, cache {}",
                    settings
                        .autotune
                        .map_or("as CubeCL's config says (default balanced)", |a| a.name()),
                    match settings.autotune_cache {
                        AutotuneCache::Shared => "shared",
                        AutotuneCache::Fresh => "fresh (this run only)",
                    }
                ),
            },
            final_lr: stepper.lr(),
            steps: stepper.step,
            epochs,
            images_per_sec: record.images_per_sec(),
            collective_seconds_per_step: None,
            seq_len: settings.model.tokens_per_sample(),
            tokens_per_sec: settings
                .model
                .tokens_per_sample()
                .map(|t| record.images_per_sec() * t as f64),
            warmup: record.warmup(),
            final_train_loss: record.final_train_loss(),
            eval_loss: eval.map_or(f64::NAN, |e| e.loss),
            eval_accuracy: eval.map_or(f64::NAN, |e| e.accuracy),
            eval_perplexity: eval.and_then(|e| e.perplexity),
            eval_per_sec: eval.map(|e| e.per_sec),
            wall_seconds: record.wall_seconds(),
            checkpoint: crate::training::checkpoint::dir(&t.output_dir)
                .display()
                .to_string(),
            predicted_peak_bytes: predicted,
            predicted_training_peak_bytes: e.device_peak_bytes,
            floor_bytes: e.floor.total(),
            // Peers on the CPU share the process's heap: its peak is theirs together, and the
            // estimate is one peer's.
            prediction_error: memory
                .peak_bytes
                .filter(|_| {
                    d.is_none_or(|d| d.devices.len() == 1) || !matches!(backend, Selected::Cpu)
                })
                .map(|b| error(b, predicted)),
            memory,
        }
    }

    /// A two-column table, aligned.
    pub fn table(&self) -> String {
        let rows = [
            ("config", self.config.clone()),
            ("model", self.model.clone()),
            ("parameters", thousands(self.parameters)),
            ("backend", self.backend.to_string()),
            ("precision", self.precision.name().into()),
            (
                "batch norm",
                self.batch_norm
                    .clone()
                    .unwrap_or_else(|| "none in model".into()),
            ),
            ("loss scale", self.loss_scale.to_string()),
            ("skipped steps", self.skipped_steps.to_string()),
            (
                "updates lost",
                self.updates_lost
                    .map_or("n/a (f32 master weights)".into(), |f| {
                        format!("{:.1}% of weights unchanged per step", 100.0 * f)
                    }),
            ),
            ("optimizer", self.optimizer.name().into()),
            ("optimizer state", {
                let whose = match self.shard {
                    Some(Shard::Optimizer | Shard::OptimizerGradients) => " (rank 0's shard)",
                    _ => "",
                };
                (self.optimizer_state_bytes)
                    .map_or(String::new(), |b| format!("{}{whose}", human(b)))
            }),
            (
                "data parallel",
                self.peers.as_ref().map_or(String::new(), |p| {
                    let measured = match self.shared_heap() {
                        true => "memory below: this process's peers together",
                        false => "memory below: rank 0's device",
                    };
                    let nodes = match self.nodes {
                        Some(n) => format!(" over {n} processes"),
                        None => String::new(),
                    };
                    let shard = match self.shard {
                        Some(s @ (Shard::Optimizer | Shard::OptimizerGradients)) => {
                            format!(", sharded: {}", s.name())
                        }
                        _ => String::new(),
                    };
                    format!(
                        "{} peers ({}){nodes}{shard}; {measured}",
                        p.len(),
                        p.join(", ")
                    )
                }),
            ),
            (
                "batch",
                match &self.peers {
                    Some(p) => format!(
                        "{} × accum {} × {} peers = {} per step",
                        self.batch_size,
                        self.accum_steps,
                        p.len(),
                        self.effective_batch
                    ),
                    None => format!(
                        "{} × accum {} = {} per step",
                        self.batch_size, self.accum_steps, self.effective_batch
                    ),
                },
            ),
            (
                "lr schedule",
                format!(
                    "{} (final lr {:.3e})",
                    self.lr_schedule.name(),
                    self.final_lr
                ),
            ),
            ("steps", self.steps.to_string()),
            ("epochs", self.epochs.to_string()),
            match (self.tokens_per_sec, &self.peers) {
                (Some(t), _) => ("tokens/s", format!("{t:.0}")),
                (None, Some(p)) => (
                    "images/s",
                    format!(
                        "{:.0} in total, {:.0} per peer",
                        self.images_per_sec,
                        self.images_per_sec / p.len().max(1) as f64
                    ),
                ),
                (None, None) => ("images/s", format!("{:.0}", self.images_per_sec)),
            },
            (
                "collectives",
                self.collective_seconds_per_step.map_or(String::new(), |s| {
                    format!(
                        "{:.1} ms a step on rank 0 (waiting for the others included)",
                        1e3 * s
                    )
                }),
            ),
            ("warm-up", {
                let text = self.warmup.describe(&self.backend);
                match self.tokens_per_sec {
                    Some(_) => text.replace("images/s", "tokens/s"),
                    None => text,
                }
            }),
            ("autotune", self.autotune.clone()),
            ("final train loss", format!("{:.4}", self.final_train_loss)),
            ("eval loss", format!("{:.4}", self.eval_loss)),
            (
                "eval accuracy",
                format!("{:.2}%", 100.0 * self.eval_accuracy),
            ),
            (
                "eval perplexity",
                self.eval_perplexity
                    .map_or(String::new(), |p| format!("{p:.3}")),
            ),
            (
                "eval speed",
                self.eval_per_sec.map_or(String::new(), |r| {
                    let unit = if self.tokens_per_sec.is_some() {
                        "tokens/s"
                    } else {
                        "images/s"
                    };
                    format!("{r:.0} {unit}")
                }),
            ),
            ("wall time", format!("{:.1} s", self.wall_seconds)),
            ("checkpoint", self.checkpoint.clone()),
            ("free cache", self.free_cache.name().into()),
            ("act. checkpointing", self.checkpointing.name().into()),
            ("fused blocks", self.fuse.name().into()),
            ("mistakes (teaching)", mistakes_text::spell(self.mistakes)),
            ("memory probe", self.memory.memory_probe.name().into()),
            ("peak in use", bytes(self.memory.peak_bytes)),
            ("training peak", self.training_peak()),
            ("analytic floor", self.floor()),
            (
                "peak measured as",
                self.memory
                    .peak_method
                    .clone()
                    .unwrap_or_else(|| "n/a".into()),
            ),
            (
                "predicted peak",
                format!(
                    "{}{}",
                    human(self.predicted_peak_bytes),
                    self.prediction_error.map_or(String::new(), |e| format!(
                        " (measured is {:+.1}%)",
                        100.0 * e
                    ))
                ),
            ),
            ("peak reserved", bytes(self.memory.reserved_peak_bytes)),
            (
                "reserved after step",
                bytes(self.memory.reserved_after_step_bytes),
            ),
            (
                "device used peak",
                bytes(self.memory.device_used_peak_bytes),
            ),
            ("eval peak", self.eval_peak()),
            (
                "live after fwd/bwd/step",
                format!(
                    "{} / {} / {}",
                    bytes(self.memory.live_after_forward_bytes),
                    bytes(self.memory.live_after_backward_bytes),
                    bytes(self.memory.live_after_step_bytes)
                ),
            ),
        ];
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::from("summary\n");
        // A row with nothing to say for this run (perplexity for a CNN) is left out.
        for (key, value) in rows.into_iter().filter(|(_, v)| !v.is_empty()) {
            out.push_str(&format!("  {key:<width$}  {value}\n"));
        }
        out
    }

    /// Whether the memory figures are several peers' together (CPU peers share one heap).
    fn shared_heap(&self) -> bool {
        let per_process =
            (self.peers.as_ref()).map_or(1, |p| p.len() / self.nodes.unwrap_or(1) as usize);
        per_process > 1 && self.backend == BackendUsed::Cpu
    }

    /// The peak above what was resident before the model, with what that was and the
    /// prediction: comparable across backends (a GPU's in-use figure holds no data set).
    fn training_peak(&self) -> String {
        let m = &self.memory;
        let (Some(peak), Some(resident)) = (m.training_peak_bytes, m.resident_bytes) else {
            return "n/a".into();
        };
        if self.shared_heap() {
            // The estimate is one peer's; the heap holds them all.
            return format!("{} above {} resident", human(peak), human(resident));
        }
        let predicted = self.predicted_training_peak_bytes;
        format!(
            "{} above {} resident before the model (predicted {}, measured is {:+.1}%)",
            human(peak),
            human(resident),
            human(predicted),
            100.0 * error(peak, predicted)
        )
    }

    /// The evaluation's peak and what evaluating added to what was in use before it.
    fn eval_peak(&self) -> String {
        match (self.memory.eval_peak_bytes, self.memory.eval_added_bytes) {
            (Some(peak), Some(added)) => {
                format!("{} ({} added by evaluation)", human(peak), human(added))
            }
            _ => "n/a".into(),
        }
    }

    /// The floor, and how many times it the training peak is.
    fn floor(&self) -> String {
        let ratio = match (self.memory.training_peak_bytes, self.floor_bytes) {
            (Some(peak), floor) if floor > 0 => {
                format!(
                    " (the training peak is {:.2}× it)",
                    peak as f64 / floor as f64
                )
            }
            _ => String::new(),
        };
        format!("{}{ratio}", human(self.floor_bytes))
    }

    /// Writes the JSON form to `path`.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(self)?;
        super::write_atomic(path, (json + "\n").as_bytes())
    }
}

impl Warmup {
    /// `first 1 step: 12.3 s (kernel compilation, …; excluded from images/s)`. Only CubeCL
    /// (CUDA, wgpu) compiles and autotunes kernels; the CPU only grows its heap.
    fn describe(&self, backend: &BackendUsed) -> String {
        let steps = match self.steps {
            1 => "1 step".to_string(),
            n => format!("{n} steps"),
        };
        let how = match self.excluded {
            true => "excluded from images/s",
            false => "images/s includes it: no step followed",
        };
        let what = match backend {
            BackendUsed::Cuda { .. } | BackendUsed::Wgpu { .. } => {
                "kernel compilation, autotune, pools growing"
            }
            BackendUsed::Cpu => "first allocations",
        };
        format!("first {steps}: {:.1} s ({what}; {how})", self.seconds)
    }
}

/// JSON has no NaN (serde_json writes `null`): read `null` back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Bytes in binary units, or `n/a` where the probe cannot measure it.
fn bytes(b: Option<u64>) -> String {
    b.map_or_else(|| "n/a".into(), human)
}

/// 165642 → "165,642".
fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `[mistakes]` as reports write it: the switches on, comma-separated, or `none`.
pub mod mistakes_text {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::config::Mistakes;

    /// `none`, or the switches on: `eval_with_autograd, keep_losses`.
    pub fn spell(m: Mistakes) -> String {
        let on: Vec<&str> = m
            .switches()
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| name)
            .collect();
        match on.is_empty() {
            true => "none".into(),
            false => on.join(", "),
        }
    }

    /// Writes [`spell`]'s text.
    pub fn serialize<S: Serializer>(m: &Mistakes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&spell(*m))
    }

    /// [`serialize`] for a value that may be absent (`null`).
    pub fn serialize_option<S: Serializer>(m: &Option<Mistakes>, s: S) -> Result<S::Ok, S::Error> {
        match m {
            Some(m) => serialize(m, s),
            None => s.serialize_none(),
        }
    }

    /// Reads [`spell`]'s text back.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Mistakes, D::Error> {
        let text = String::deserialize(d)?;
        let made = match text.as_str() {
            "none" => Some(Mistakes::default()),
            list => Mistakes::from_names(list.split(", ")),
        };
        made.ok_or_else(|| {
            D::Error::custom(format!(
                "mistakes {text:?}: expected \"none\" or [mistakes] switches, comma-separated"
            ))
        })
    }
}

/// measured / predicted − 1.
fn error(measured: u64, predicted: u64) -> f64 {
    measured as f64 / predicted.max(1) as f64 - 1.0
}
