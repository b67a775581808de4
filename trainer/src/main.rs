//! `trainer`: the binary edge. Errors become one line and an exit code.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use clap::Parser;
use trainer::backend::{self, CpuBackend, CudaBackend, Selected};
use trainer::cli::{Cli, Command, EstimateArgs, RunArgs};
use trainer::config::{self, ConfigError, Purpose, Settings};
use trainer::data::DataError;
use trainer::memory::cuda::CudaProbe;
use trainer::memory::heap::{CountingAllocator, HeapProbe};
use trainer::train::train;

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
            let bad_config = e.downcast_ref::<ConfigError>().is_some();
            let bad_data = e.downcast_ref::<DataError>().is_some();
            let prefix = if bad_config { "config error" } else { "error" };
            eprintln!("{prefix}: {e:#}");
            ExitCode::from(if bad_config || bad_data { 2 } else { 1 })
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Estimate(args)) => estimate(args),
        None => train_run(cli.run),
    }
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

fn estimate(args: EstimateArgs) -> anyhow::Result<()> {
    let settings = settings(args.config.as_deref(), &args.overrides, Purpose::Estimate)?;
    let cpu = settings.backend == config::BackendKind::Cpu;
    let e = trainer::memory::estimate::estimate(&settings, cpu);
    print!("{}", e.table());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&e)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn train_run(cli: RunArgs) -> anyhow::Result<()> {
    let overrides = cli.all_overrides();
    let settings = settings(cli.config.as_deref(), &overrides, Purpose::Train)?;
    if let Some(note) = &settings.precision.note {
        eprintln!("note: {note}");
    }
    let selected = backend::select(settings.backend, settings.cuda_index)?;
    let resume = cli.resume.as_deref();
    let summary = match &selected {
        Selected::Cpu => {
            let mut probe = HeapProbe::default();
            let device = Default::default();
            train::<CpuBackend>(&settings, device, &selected.name(), resume, &mut probe)?
        }
        Selected::Cuda(device) => {
            let mut probe = CudaProbe::new(device.clone());
            let name = selected.name();
            train::<CudaBackend>(&settings, device.clone(), &name, resume, &mut probe)?
        }
    };
    print!("{}", summary.table());
    if let Some(path) = &cli.summary_json {
        summary.write_json(path)?;
    }
    Ok(())
}
