//! Ctrl-C and SIGTERM during training: the first signal lets the current window finish, then
//! the run writes a checkpoint, says where it is and how to resume, and exits with 130 (INT)
//! or 143 (TERM). A second signal exits at once.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::flag;

/// Whether, and by which signal, the run was asked to stop.
pub struct Interrupt {
    signal: Arc<AtomicUsize>,
}

impl Interrupt {
    /// Installs the handlers for SIGINT and SIGTERM.
    pub fn install() -> std::io::Result<Self> {
        let requested = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        for sig in [SIGINT, SIGTERM] {
            // Registered first, so it sees the flag as the *previous* signal left it: the
            // second signal finds it set and exits with the shell's code for that signal.
            flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&requested))?;
            flag::register(sig, Arc::clone(&requested))?;
            flag::register_usize(sig, Arc::clone(&signal), sig as usize)?;
        }
        Ok(Self { signal })
    }

    /// The signal received, if any.
    pub fn requested(&self) -> Option<i32> {
        match self.signal.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

/// The run stopped at a signal, after checkpointing.
#[derive(Debug, thiserror::Error)]
#[error(
    "interrupted by {}: stopped after step {step}; the checkpoint is in {}; continue with \
     --resume {}",
    name(*signal),
    checkpoint.display(),
    checkpoint.display()
)]
pub struct Interrupted {
    /// SIGINT or SIGTERM.
    pub signal: i32,
    /// Optimizer steps taken.
    pub step: usize,
    /// The checkpoint written.
    pub checkpoint: PathBuf,
}

fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT (Ctrl-C)",
        SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}
