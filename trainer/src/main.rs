//! `trainer`: the binary edge. Errors become one line and an exit code.

use std::process::ExitCode;

use clap::Parser;
use trainer::cli::Cli;
use trainer::config::ConfigError;
use trainer::data::DataError;
use trainer::memory::diagnosis::OutOfMemory;
use trainer::memory::heap::CountingAllocator;

/// Counts heap bytes so the CPU backend's memory peaks are exact.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn main() -> ExitCode {
    trainer::malloc::tune_for_training();
    match trainer::commands::run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(oom) = e.downcast_ref::<OutOfMemory>() {
                eprintln!("{oom}");
                return ExitCode::from(trainer::commands::child::EXIT_OUT_OF_MEMORY as u8);
            }
            let bad_config = e.downcast_ref::<ConfigError>().is_some();
            let bad_data = e.downcast_ref::<DataError>().is_some();
            let prefix = if bad_config { "config error" } else { "error" };
            eprintln!("{prefix}: {e:#}");
            ExitCode::from(if bad_config || bad_data { 2 } else { 1 })
        }
    }
}
