//! The exit codes of `trainer`, in one place: what each means, which error maps to which, and
//! the one line (or, out of memory, the diagnosis) printed for it.

use std::process::ExitCode;

use serde::{Deserialize, Serialize};

use crate::backend::NoDevice;
use crate::config::ConfigError;
use crate::data::DataError;
use crate::distributed::DistributedError;
use crate::memory::diagnosis::OutOfMemory;
use crate::memory::host::{HostMemory, NothingFits};
use crate::training::checkpoint_set::CheckpointError;
use crate::training::interrupt::{Interrupted, Stopped};

/// How `trainer` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Exit {
    /// 0: done.
    Ok,
    /// 1: a runtime error (I/O, a diverged run).
    Runtime,
    /// 2: a bad config, flag or data file, or a backend this machine cannot run.
    BadInput,
    /// 3: out of memory (over `memory.budget`, over a GPU's free memory, or an allocation
    /// failed): the message ranks the fixes.
    OutOfMemory,
    /// 129: stopped by SIGHUP (the terminal closed) after writing a checkpoint.
    Hangup,
    /// 130: stopped by SIGINT (Ctrl-C) after writing a checkpoint.
    Interrupted,
    /// 143: stopped by SIGTERM after writing a checkpoint.
    Terminated,
}

/// The exit codes for `--help`.
pub const HELP: &str =
    "Exit codes: 0 done, 1 runtime error, 2 bad config, flag, data or checkpoint, or a backend this
machine lacks (no CUDA device, no Vulkan driver, a half type the device cannot do), 3 out of memory
(over memory.budget, or a GPU allocation failed): the message ranks the fixes; 130 / 143 / 129
stopped by Ctrl-C / SIGTERM / SIGHUP (terminal closed) after writing a checkpoint; compare and
find-batch-size stop their run and report what finished (a second signal stops at once, saying
what was kept).";

impl Exit {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::Runtime => 1,
            Self::BadInput => 2,
            Self::OutOfMemory => 3,
            Self::Hangup => 129,
            Self::Interrupted => 130,
            Self::Terminated => 143,
        }
    }

    /// Which exit an error means.
    pub fn of(error: &anyhow::Error) -> Self {
        let signal = (error.downcast_ref::<Interrupted>().map(|i| i.signal))
            .or_else(|| error.downcast_ref::<Stopped>().map(|s| s.signal));
        if let Some(signal) = signal {
            return match signal {
                signal_hook::consts::SIGTERM => Self::Terminated,
                signal_hook::consts::SIGHUP => Self::Hangup,
                _ => Self::Interrupted,
            };
        }
        if let Some(node) = error.downcast_ref::<crate::commands::launch::NodeFailed>() {
            return node.exit;
        }
        if error.downcast_ref::<OutOfMemory>().is_some()
            || error.downcast_ref::<HostMemory>().is_some()
            || error.downcast_ref::<NothingFits>().is_some()
        {
            Self::OutOfMemory
        } else if error.downcast_ref::<ConfigError>().is_some()
            || error.downcast_ref::<DataError>().is_some()
            || error.downcast_ref::<CheckpointError>().is_some()
            || error.downcast_ref::<NoDevice>().is_some()
            || (error.downcast_ref::<DistributedError>())
                .is_some_and(DistributedError::is_bad_input)
        {
            Self::BadInput
        } else {
            Self::Runtime
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit.code())
    }
}

/// What is printed for `error` on stderr: out of memory (the diagnosis) and a stop by a signal
/// speak for themselves; anything else is one line, `config error: …` for a bad config and
/// `error: …` otherwise.
pub fn describe(error: &anyhow::Error) -> String {
    // A path or value may hold an escape sequence or a newline: it reaches the terminal
    // escaped, and a one-line error stays one line. The diagnosis keeps its own lines.
    match Exit::of(error) {
        Exit::OutOfMemory | Exit::Hangup | Exit::Interrupted | Exit::Terminated => {
            format!("{error:#}")
                .lines()
                .map(crate::report::printable)
                .collect::<Vec<_>>()
                .join("\n")
        }
        _ => crate::report::printable(&match error.downcast_ref::<ConfigError>() {
            Some(_) => format!("config error: {error:#}"),
            None => format!("error: {error:#}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_every_code() {
        for exit in [
            Exit::Ok,
            Exit::Runtime,
            Exit::BadInput,
            Exit::OutOfMemory,
            Exit::Hangup,
            Exit::Interrupted,
            Exit::Terminated,
        ] {
            let listed = HELP
                .split(|c: char| !c.is_ascii_digit())
                .any(|n| n == exit.code().to_string());
            assert!(listed, "{exit:?}");
        }
    }
}
