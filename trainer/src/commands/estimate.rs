//! `trainer estimate`: the analytic memory breakdown of a config, without training.

use super::{dry_run_ok, settings};
use crate::cli::EstimateArgs;
use crate::config::Purpose;
use crate::memory::estimate::{estimate, Target};

/// Prints the estimate table (and writes `--json`).
pub fn run(args: EstimateArgs, dry: bool) -> anyhow::Result<()> {
    let settings = settings(
        args.config.config.as_deref(),
        &args.config.overrides,
        &[],
        Purpose::Estimate,
    )?;
    if let Some(path) = &args.json {
        crate::outputs::file::check("--json", path)?;
    }
    if dry {
        return dry_run_ok(&format!("{} loads", settings.path.display()));
    }
    let e = estimate(&settings, Target::of(settings.backend));
    print!("{}", e.table());
    if let Some(path) = &args.json {
        crate::report::write_atomic(path, (serde_json::to_string_pretty(&e)? + "\n").as_bytes())?;
    }
    Ok(())
}
