//! `trainer`: the binary edge. Parses the command line, runs the command, and turns an error
//! into its message and exit code ([`trainer::exit`]).

use std::process::ExitCode;

use clap::Parser;
use trainer::cli::Cli;
use trainer::commands::{self, child::Failure};
use trainer::exit::{self, Exit};
use trainer::memory::heap::CountingAllocator;

/// Counts heap bytes so the CPU backend's memory peaks are exact.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn main() -> ExitCode {
    trainer::malloc::tune_for_training();
    trainer::backend::headless();
    let cli = Cli::parse();
    let failure_json = cli.failure_json.clone();
    match commands::run(cli) {
        Ok(exit) => exit.into(),
        Err(e) => {
            eprintln!("{}", exit::describe(&e));
            if let Some(path) = failure_json {
                if let Err(write) = Failure::of(&e).write(&path) {
                    eprintln!("error: {write:#}");
                }
            }
            Exit::of(&e).into()
        }
    }
}
