//! Out-of-memory capture: an allocation failure panics inside CubeCL (often on its server
//! thread); [`catch`] turns that panic into an
//! [`OutOfMemory`](crate::memory::diagnosis::OutOfMemory) diagnosis naming the phase that
//! failed, instead of a backtrace. Other panics go on as they were.

use std::panic;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use crate::config::Settings;
use crate::memory::diagnosis::diagnose;
use crate::memory::estimate::Target;
use crate::memory::timeline::Timeline;
use crate::memory::{MemoryProbe, MemoryReport, Phase};
use crate::panics::{self, Captured};

/// The last phase boundary a training step passed (0: none yet).
static LAST_PHASE: AtomicU8 = AtomicU8::new(0);

/// A probe that also remembers the last phase boundary, to name the failing phase.
pub struct Tracked<'a>(pub &'a mut dyn MemoryProbe);

impl MemoryProbe for Tracked<'_> {
    fn sample(&mut self, phase: Phase) {
        LAST_PHASE.store(phase as u8 + 1, Relaxed);
        self.0.sample(phase);
    }
    fn resident(&mut self) {
        self.0.resident();
    }
    fn report(&self) -> MemoryReport {
        self.0.report()
    }
    fn timeline(&self) -> Option<Timeline> {
        self.0.timeline()
    }
    fn last_step(&self) -> Option<crate::memory::probe::Reading> {
        self.0.last_step()
    }
    fn listener(&self) -> Option<oomlab_engine::Listener> {
        self.0.listener()
    }
}

/// The phase that follows the last boundary passed.
fn failing_phase() -> &'static str {
    match LAST_PHASE.load(Relaxed) {
        0 => "while setting up (model, data)",
        x if x == Phase::AfterForward as u8 + 1 => "in backward",
        x if x == Phase::AfterBackward as u8 + 1 => "in the optimizer step or the next forward",
        x if x == Phase::EvalStart as u8 + 1 => "in evaluation",
        _ => "in forward",
    }
}

/// Whether a panic message is an allocation failure (CubeCL's, or the CUDA driver's).
pub fn is_oom(message: &str) -> bool {
    let m = message.to_lowercase();
    ["out of memory", "out-of-memory", "outofmemory"]
        .iter()
        .any(|p| m.contains(p))
}

/// Runs `train`; an out-of-memory panic on any thread becomes an
/// [`OutOfMemory`](crate::memory::diagnosis::OutOfMemory) diagnosis
/// instead of a backtrace. Other panics go on as they were.
pub fn catch<T>(
    settings: &Settings,
    target: Target,
    train: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let Captured { result, first } = panics::capture(is_oom, true, train);
    match (result, first) {
        (Ok(Ok(v)), _) => Ok(v),
        (Ok(Err(e)), None) => Err(e),
        (Ok(Err(_)) | Err(_), Some(text)) => {
            // CubeCL's message: a headline, "Caused by:" and a reason, then a backtrace.
            let cause = text
                .lines()
                .take_while(|l| !l.starts_with("Backtrace"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            Err(diagnose(settings, target, failing_phase(), cause).into())
        }
        (Err(payload), None) => panic::resume_unwind(payload),
    }
}
