//! Out-of-memory capture: an allocation failure panics inside CubeCL (often on its server
//! thread); [`catch`] turns that panic into an
//! [`OutOfMemory`](crate::memory::diagnosis::OutOfMemory) diagnosis naming the phase that
//! failed, instead of a backtrace. Other panics go on as they were.

use std::panic;
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::Settings;
use crate::memory::diagnosis::diagnose;
use crate::memory::estimate::Target;
use crate::memory::timeline::Timeline;
use crate::memory::{MemoryProbe, MemoryReport, Phase};
use crate::panics::{self, Captured};

/// The last phase boundary one run's training passed: made by [`catch`] for the run it
/// watches, so that two runs in one process each name their own failing phase. Clones share
/// the cell.
#[derive(Debug, Clone, Default)]
pub struct LastPhase(Arc<Mutex<Option<Phase>>>);

impl LastPhase {
    /// `probe`, remembering in this cell each phase boundary it samples.
    pub fn track<'a>(&self, probe: &'a mut dyn MemoryProbe) -> Tracked<'a> {
        Tracked {
            probe,
            last: self.clone(),
        }
    }

    /// The last boundary passed, or `None` before the first.
    pub fn get(&self) -> Option<Phase> {
        // Only a Copy value is ever stored under the lock: a poisoned one still holds it.
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, phase: Phase) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(phase);
    }

    /// The phase that follows the last boundary passed.
    fn failing(&self) -> &'static str {
        match self.get() {
            None => "while setting up (model, data)",
            Some(Phase::AfterForward) => "in backward",
            Some(Phase::AfterBackward) => "in the optimizer step or the next forward",
            Some(Phase::EvalStart) => "in evaluation",
            Some(Phase::WindowStart | Phase::AfterStep | Phase::EvalEnd) => "in forward",
        }
    }
}

/// A probe that also remembers the last phase boundary in its run's [`LastPhase`], to name the
/// failing phase.
pub struct Tracked<'a> {
    probe: &'a mut dyn MemoryProbe,
    last: LastPhase,
}

impl MemoryProbe for Tracked<'_> {
    fn sample(&mut self, phase: Phase) {
        self.last.set(phase);
        self.probe.sample(phase);
    }
    fn resident(&mut self) {
        self.probe.resident();
    }
    fn report(&self) -> MemoryReport {
        self.probe.report()
    }
    fn timeline(&self) -> Option<Timeline> {
        self.probe.timeline()
    }
    fn last_step(&self) -> Option<crate::memory::probe::Reading> {
        self.probe.last_step()
    }
    fn listener(&self) -> Option<oomlab_engine::Listener> {
        self.probe.listener()
    }
}

/// Whether a panic message is an allocation failure (CubeCL's, or the CUDA driver's).
pub fn is_oom(message: &str) -> bool {
    let m = message.to_lowercase();
    ["out of memory", "out-of-memory", "outofmemory"]
        .iter()
        .any(|p| m.contains(p))
}

/// Runs `train`, handing it the run's own [`LastPhase`] (its probe goes through
/// [`LastPhase::track`]); an out-of-memory panic on any thread becomes an
/// [`OutOfMemory`](crate::memory::diagnosis::OutOfMemory) diagnosis naming the phase that
/// failed, instead of a backtrace. Other panics go on as they were.
pub fn catch<T>(
    settings: &Settings,
    target: Target,
    train: impl FnOnce(&LastPhase) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let last = LastPhase::default();
    let Captured { result, first } = panics::capture(is_oom, true, || train(&last));
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
            Err(diagnose(settings, target, last.failing(), cause).into())
        }
        (Err(payload), None) => panic::resume_unwind(payload),
    }
}
