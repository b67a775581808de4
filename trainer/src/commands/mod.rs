//! One module per `trainer` command; [`run`] dispatches the parsed command line to them.

pub mod child;
pub mod compare;
pub mod estimate;
pub mod find_batch_size;
pub mod launch;
pub mod run;

use std::path::Path;

use crate::cli::{Cli, Command};
use crate::config::{self, ConfigError, Purpose, Settings};
use crate::exit::Exit;
use crate::training::interrupt::Interrupt;

/// The config `trainer` runs without `--config`: SimpleModel, f16 mixed precision, on the
/// built-in synthetic data.
const DEFAULT_CONFIG: &str = include_str!("../../../configs/amp.toml");

/// Runs the command `cli` names; `interrupt` is the process's signal handler, which a
/// training run polls and a parent forwards to its children. Every failure is an error;
/// [`Exit::of`] gives its code.
pub fn run(cli: Cli, interrupt: &Interrupt) -> anyhow::Result<Exit> {
    let dry = cli.dry_run;
    match cli.command {
        Some(Command::Estimate(args)) => estimate::run(args, dry),
        Some(Command::Compare(args)) => compare::run(args, dry, interrupt),
        Some(Command::FindBatchSize(args)) => find_batch_size::run(args, dry, interrupt),
        Some(Command::Launch(args)) => launch::run(args, dry, interrupt),
        Some(Command::Orchestrator(args)) => match dry {
            true => dry_run_ok(&format!("an orchestrator on port {}", args.port)),
            false => crate::distributed::serve_orchestrator(args.port),
        },
        None => run::run(cli.run, dry, interrupt),
    }?;
    Ok(Exit::Ok)
}

/// `--dry-run`'s report: what was checked.
pub(crate) fn dry_run_ok(what: &str) -> anyhow::Result<()> {
    println!("dry run: {what}; nothing was run");
    Ok(())
}

/// The config at `path` (else the embedded default) with the user's `overrides` applied, then
/// the command's own `flags` (`--backend`, `--max-steps`, written as `key=value`). The config
/// is validated before the flags are applied too, so a flag never hides an invalid value.
pub(crate) fn settings(
    path: Option<&Path>,
    overrides: &[String],
    flags: &[String],
    purpose: Purpose,
) -> Result<Settings, ConfigError> {
    let load = |sets: &[String]| match path {
        Some(path) => config::load_file_for(path, sets, purpose),
        None => config::load_for(DEFAULT_CONFIG, "embedded/amp.toml".as_ref(), sets, purpose),
    };
    let settings = load(overrides)?;
    if flags.is_empty() {
        return Ok(settings);
    }
    load(&[overrides, flags].concat())
}
