//! `trainer`: the binary edge. Errors become one line and an exit code.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use clap::Parser;
use trainer::backend::{
    self, CpuBackend, CpuCheckpointed, CudaBackend, CudaCheckpointed, Selected,
};
use trainer::batch_finder::{self, Search};
use trainer::cli::{Cli, Command, CompareArgs, ConfigArgs, EstimateArgs, FindArgs, RunArgs};
use trainer::compare::{self, Plan, Sweep};
use trainer::config::{self, Checkpointing, ConfigError, Purpose, Settings};
use trainer::data::DataError;
use trainer::memory::cuda::{device_memory, CudaProbe};
use trainer::memory::heap::{CountingAllocator, HeapProbe};
use trainer::memory::catch::{self, Tracked};
use trainer::memory::diagnosis::{self, OutOfMemory};
use trainer::report;
use trainer::training::{train, RunOptions};

/// Counts heap bytes so the CPU backend's memory peaks are exact.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The config `trainer` runs without `--config`: SimpleModel, f16 mixed precision, on the
/// built-in synthetic data.
const DEFAULT_CONFIG: &str = include_str!("../../configs/amp.toml");

fn main() -> ExitCode {
    trainer::malloc::tune_for_training();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(oom) = e.downcast_ref::<OutOfMemory>() {
                eprintln!("{oom}");
                return ExitCode::from(trainer::child::EXIT_OUT_OF_MEMORY as u8);
            }
            let bad_config = e.downcast_ref::<ConfigError>().is_some();
            let bad_data = e.downcast_ref::<DataError>().is_some();
            let prefix = if bad_config { "config error" } else { "error" };
            eprintln!("{prefix}: {e:#}");
            ExitCode::from(if bad_config || bad_data { 2 } else { 1 })
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let dry = cli.dry_run;
    match cli.command {
        Some(Command::Estimate(args)) => estimate(args, dry),
        Some(Command::Compare(args)) => compare(args, dry),
        Some(Command::FindBatchSize(args)) => find_batch_size(args, dry),
        None => train_run(cli.run, dry),
    }
}

/// `--dry-run`'s report: what was checked.
fn dry_run_ok(what: &str) -> anyhow::Result<()> {
    println!("dry run: {what}; nothing was run");
    Ok(())
}

/// The config at `path` (else the embedded default) with `overrides` applied.
fn settings(
    path: Option<&Path>,
    overrides: &[String],
    purpose: Purpose,
) -> Result<Settings, ConfigError> {
    match path {
        Some(path) => config::load_file_for(path, overrides, purpose),
        None => config::load_for(
            DEFAULT_CONFIG,
            "embedded/amp.toml".as_ref(),
            overrides,
            purpose,
        ),
    }
}

fn estimate(args: EstimateArgs, dry: bool) -> anyhow::Result<()> {
    let settings = settings(
        args.config.config.as_deref(),
        &args.config.overrides,
        Purpose::Estimate,
    )?;
    if dry {
        return dry_run_ok(&format!("{} loads", settings.path.display()));
    }
    let cpu = settings.backend == config::BackendKind::Cpu;
    let e = trainer::memory::estimate::estimate(&settings, cpu);
    print!("{}", e.table());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&e)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn train_run(cli: RunArgs, dry: bool) -> anyhow::Result<()> {
    let overrides = cli.all_overrides();
    let settings = settings(cli.config.config.as_deref(), &overrides, Purpose::Train)?;
    if dry {
        return dry_run_ok(&format!("{} loads", settings.path.display()));
    }
    if let Some(note) = &settings.precision.note {
        eprintln!("note: {note}");
    }
    let selected = backend::select(settings.backend, settings.cuda_index)?;
    let cpu = matches!(selected, Selected::Cpu);
    if !cli.trial {
        diagnosis::check_budget(&settings, cpu)?;
        if let Selected::Cuda(device) = &selected {
            if let Some((free, total)) = device_memory(device.index) {
                diagnosis::check_free(&settings, &selected.name(), free, total)?;
            }
        }
    }
    let options = RunOptions {
        resume: cli.resume.as_deref(),
        trial: cli.trial,
    };
    let name = selected.name();
    let balanced = settings.memory.checkpointing == Checkpointing::Balanced;
    let s = &settings;
    let summary = catch::catch(s, cpu, || match &selected {
        Selected::Cpu => {
            let (mut heap, device) = (HeapProbe::default(), Default::default());
            let probe = &mut Tracked(&mut heap);
            match balanced {
                false => train::<CpuBackend>(s, device, &name, options, probe),
                true => train::<CpuCheckpointed>(s, device, &name, options, probe),
            }
        }
        Selected::Cuda(device) => {
            let mut cuda = CudaProbe::new(device.clone());
            let (probe, device) = (&mut Tracked(&mut cuda), device.clone());
            match balanced {
                false => train::<CudaBackend>(s, device, &name, options, probe),
                true => train::<CudaCheckpointed>(s, device, &name, options, probe),
            }
        }
    })?;
    print!("{}", summary.table());
    if let Some(path) = &cli.summary_json {
        summary.write_json(path)?;
    }
    Ok(())
}

fn compare(args: CompareArgs, dry: bool) -> anyhow::Result<()> {
    if args.steps == 0 {
        return Err(config::out_of_range("--steps", 0, "must be at least 1").into());
    }
    let backend = args.backend.map(|b| b.name().to_string());
    let plan = Plan {
        configs: args.configs,
        steps: args.steps,
        backend: backend.clone(),
        sets: args.overrides,
        sweep: args.sweep.as_deref().map(Sweep::parse).transpose()?,
        out: args.out,
    };
    if dry {
        let n = compare::check(&plan)?;
        return dry_run_ok(&format!("{n} runs, every config loads"));
    }
    let rows = compare::run(&plan)?;
    let heading = format!(
        "`trainer compare {}` — {} optimizer steps per config, backend {}",
        plan.configs
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        plan.steps,
        backend.as_deref().unwrap_or("as each config says")
    );
    print!("{}", report::markdown(&rows));
    report::write_all(&rows, &plan.out, &heading)?;
    let failed = rows.iter().filter(|r| r.error.is_some()).count();
    println!(
        "{} configs, {failed} failed; report.md, report.csv, report.json and memory.svg in {}",
        rows.len(),
        plan.out.display()
    );
    if failed == rows.len() {
        anyhow::bail!("every config failed (see the error column)");
    }
    Ok(())
}

fn find_batch_size(args: FindArgs, dry: bool) -> anyhow::Result<()> {
    let FindArgs {
        config: ConfigArgs {
            config,
            overrides: sets,
        },
        ..
    } = &args;
    let mut overrides = sets.clone();
    if let Some(b) = args.backend {
        overrides.push(format!("backend.kind={}", b.name()));
    }
    let settings = settings(config.as_deref(), &overrides, Purpose::Train)?;
    if !(0.0..1.0).contains(&args.margin) {
        return Err(config::out_of_range("--margin", args.margin, "must be in [0, 1)").into());
    }
    let budget = match &args.budget {
        Some(text) => Some(
            config::parse_size(text)
                .ok_or_else(|| config::out_of_range("--budget", text, config::SIZE_HELP))?,
        ),
        None => settings.memory.budget,
    };
    if dry {
        return dry_run_ok(&format!("{} loads", settings.path.display()));
    }
    let selected = backend::select(settings.backend, settings.cuda_index)?;
    if budget.is_none() && matches!(selected, Selected::Cpu) {
        return Err(config::out_of_range(
            "--budget",
            "(none)",
            "the CPU has no memory limit to find: give --budget SIZE or memory.budget",
        )
        .into());
    }
    let limit = budget.map(|b| (b as f64 * (1.0 - args.margin)) as u64);
    let mut trial_args = Vec::new();
    if let Some(c) = config {
        trial_args.extend(["--config".to_string(), c.display().to_string()]);
    }
    trial_args.extend(["--backend".into(), selected.kind().name().into()]);
    for set in sets {
        trial_args.extend(["--set".to_string(), set.clone()]);
    }
    let search = Search {
        args: trial_args,
        limit,
        effective_batch: settings.train.effective_batch(),
        max_batch: args.max_batch.max(1),
        scratch: settings.train.output_dir.join("find-batch-size"),
    };
    let found = batch_finder::find(&search)?;
    let shown = config
        .as_ref()
        .map_or_else(|| "configs/amp.toml".into(), |c| c.display().to_string());
    print!("{}", found.describe(&shown));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&found)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
