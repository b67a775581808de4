//! Out-of-memory capture: an allocation failure panics inside CubeCL (often on its server
//! thread); [`catch`] turns that panic into an [`OutOfMemory`] diagnosis naming the phase that
//! failed, instead of a backtrace. Other panics go on as they were.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;

use crate::config::Settings;
use crate::memory::diagnosis::{diagnose, OutOfMemory};
use crate::memory::{MemoryProbe, MemoryReport, Phase};

/// The last phase boundary a training step passed (0: none yet).
static LAST_PHASE: AtomicU8 = AtomicU8::new(0);

/// A probe that also remembers the last phase boundary, to name the failing phase.
pub struct Tracked<'a>(pub &'a mut dyn MemoryProbe);

impl MemoryProbe for Tracked<'_> {
    fn sample(&mut self, phase: Phase) {
        LAST_PHASE.store(phase as u8 + 1, Relaxed);
        self.0.sample(phase);
    }
    fn report(&self) -> MemoryReport {
        self.0.report()
    }
}

/// The phase that follows the last boundary passed.
fn failing_phase() -> &'static str {
    match LAST_PHASE.load(Relaxed) {
        0 => "while setting up (model, data)",
        x if x == Phase::AfterForward as u8 + 1 => "in backward",
        x if x == Phase::AfterBackward as u8 + 1 => "in the optimizer step or the next forward",
        _ => "in forward",
    }
}

fn message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Whether a panic message is an allocation failure (CubeCL's, or the CUDA driver's).
pub fn is_oom(message: &str) -> bool {
    let m = message.to_lowercase();
    ["out of memory", "out-of-memory", "outofmemory"]
        .iter()
        .any(|p| m.contains(p))
}

/// Runs `train`; an out-of-memory panic on any thread becomes an [`OutOfMemory`] diagnosis
/// instead of a backtrace. Other panics go on as they were.
pub fn catch<T>(
    settings: &Settings,
    cpu: bool,
    train: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    static FIRST_OOM: Mutex<Option<String>> = Mutex::new(None);
    let previous = std::sync::Arc::new(panic::take_hook());
    let chained = previous.clone();
    panic::set_hook(Box::new(move |info| {
        let text = message(info.payload());
        if is_oom(&text) {
            if let Ok(mut first) = FIRST_OOM.lock() {
                first.get_or_insert(text);
            }
        } else {
            chained(info);
        }
    }));
    let result = panic::catch_unwind(AssertUnwindSafe(train));
    let _ = panic::take_hook();
    if let Ok(hook) = std::sync::Arc::try_unwrap(previous) {
        panic::set_hook(hook);
    }
    let first = FIRST_OOM.lock().ok().and_then(|mut f| f.take());
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
            Err(diagnose(settings, cpu, failing_phase(), cause).into())
        }
        (Err(payload), None) => panic::resume_unwind(payload),
    }
}
