//! `trainer`: the binary edge. Parses the command line, runs the command, and turns an error
//! into its message and exit code ([`trainer::exit`]).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use trainer::cli::Cli;
use trainer::commands::{self, child::Failure};
use trainer::exit::{self, Exit};
use trainer::memory::heap::CountingAllocator;
use trainer::training::interrupt::Interrupt;

/// Counts heap bytes so the CPU backend's memory peaks are exact.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn main() -> ExitCode {
    // First, before anything is made: a signal from here on stops the run cleanly.
    let interrupt = match Interrupt::install() {
        Ok(interrupt) => interrupt,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "error: installing the handler of Ctrl-C, SIGTERM and SIGHUP: {e}"
            );
            return Exit::Runtime.into();
        }
    };
    trainer::malloc::tune_for_training();
    trainer::backend::headless();
    let cli = Cli::parse();
    let failure_json = cli.failure_json.clone();
    match commands::run(cli, &interrupt) {
        Ok(exit) => exit.into(),
        Err(e) => {
            // Not eprintln!, which panics where the terminal is gone (after SIGHUP): the exit
            // code and the failure report must not depend on the line being shown.
            let mut err = std::io::stderr();
            let _ = writeln!(err, "{}", exit::describe(&e));
            if let Some(path) = failure_json {
                if let Err(write) = Failure::of(&e).write(&path) {
                    let _ = writeln!(err, "error: {write:#}");
                }
            }
            Exit::of(&e).into()
        }
    }
}
