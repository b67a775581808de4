//! One probe for every backend: a [`Meter`] says how many bytes are in use (and reserved) right
//! now; [`Probe`] reads it at every phase boundary and, through the boundary listener it
//! installs, at every layer boundary of forward and backward, and keeps the maxima, the
//! per-phase figures and the [`Timeline`] of the window that peaked.

use std::sync::{Arc, Mutex, MutexGuard};

use oomlab_engine::{Boundary, Listener, Pass};

use super::timeline::{Event, Timeline};
use super::{MemoryProbe, MemoryReport, Phase, PhaseMax, ProbeKind};

/// A reading: bytes in use and, where the allocator pools memory, bytes reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Bytes of live tensors.
    pub in_use: u64,
    /// Bytes the allocator holds from the device (`None`: it holds nothing back).
    pub reserved: Option<u64>,
}

/// Where a probe's readings come from.
pub trait Meter: Send + Sync + 'static {
    /// `memory_probe` in reports: which probe this meter is.
    fn kind(&self) -> ProbeKind;
    /// The state now; `None` when the device cannot say (the sample is skipped).
    fn read(&self) -> Option<Reading>;
    /// Makes the runtime's fixed workspace now, before the resident baseline is read, so that
    /// the training peak counts what training adds (on the CPU: gemm's packing slabs).
    fn settle(&self) {}
    /// A window begins (the heap restarts its exact peak here).
    fn window_start(&self) {}
    /// The exact peak since the window began, where the allocator keeps one.
    fn exact_peak(&self) -> Option<u64> {
        None
    }
    /// Device-wide bytes in use (the driver's view), read at phase boundaries only.
    fn device_used(&self) -> Option<u64> {
        None
    }
}

#[derive(Debug, Default)]
struct Figures {
    resident: Option<u64>,
    peak: u64,
    reserved_peak: Option<u64>,
    reserved_after_step: Option<u64>,
    device_used_peak: Option<u64>,
    samples: u64,
    phases: PhaseMax,
    timeline: Timeline,
    last_step: Option<Reading>,
    /// While an evaluation runs: what was in use when it began, and its largest sample.
    eval: Option<(u64, u64)>,
    eval_peak: Option<u64>,
    eval_added: Option<u64>,
}

impl Figures {
    fn record(&mut self, event: Event, r: Reading) {
        if let Some((_, largest)) = &mut self.eval {
            // Evaluation's forward crosses layer boundaries too: its own figure, not training's.
            *largest = (*largest).max(r.in_use);
            return;
        }
        self.peak = self.peak.max(r.in_use);
        if let Some(reserved) = r.reserved {
            self.reserved_peak = Some(self.reserved_peak.unwrap_or(0).max(reserved));
        }
        self.samples += 1;
        self.timeline.push(event, r.in_use, r.reserved);
    }
}

struct Shared<M> {
    meter: M,
    figures: Mutex<Figures>,
}

impl<M: Meter> Shared<M> {
    fn figures(&self) -> MutexGuard<'_, Figures> {
        // A panic while recording (an OOM being caught) leaves usable figures.
        self.figures.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sample(&self, event: Event) -> Option<Reading> {
        let reading = self.meter.read()?;
        self.figures().record(event, reading);
        Some(reading)
    }
}

/// Samples a [`Meter`] at phase and layer boundaries (the latter through the
/// [`listener`](MemoryProbe::listener) it gives the run's context).
pub struct Probe<M: Meter> {
    shared: Arc<Shared<M>>,
}

impl<M: Meter> Probe<M> {
    /// A probe reading `meter`.
    pub fn new(meter: M) -> Self {
        let shared = Arc::new(Shared {
            meter,
            figures: Mutex::default(),
        });
        Self { shared }
    }
}

impl<M: Meter> MemoryProbe for Probe<M> {
    fn listener(&self) -> Option<Listener> {
        let shared = Arc::clone(&self.shared);
        Some(Arc::new(move |at: Boundary, pass: Pass| {
            shared.sample(Event::crossing(at.0, pass));
        }))
    }

    fn resident(&mut self) {
        self.shared.meter.settle();
        if let Some(r) = self.shared.meter.read() {
            self.shared.figures().resident = Some(r.in_use);
        }
    }

    fn sample(&mut self, phase: Phase) {
        let event = match phase {
            Phase::WindowStart => {
                self.shared.meter.window_start();
                self.shared.figures().timeline.start_window();
                return;
            }
            Phase::EvalStart => {
                let meter = &self.shared.meter;
                let start = meter.read().map_or(0, |r| r.in_use);
                meter.window_start(); // the heap's exact peak restarts here
                self.shared.figures().eval = Some((start, start));
                return;
            }
            Phase::EvalEnd => {
                let exact = self.shared.meter.exact_peak();
                let mut f = self.shared.figures();
                if let Some((start, sampled)) = f.eval.take() {
                    let peak = exact.unwrap_or(0).max(sampled);
                    f.eval_peak = Some(f.eval_peak.unwrap_or(0).max(peak));
                    let added = peak.saturating_sub(start);
                    f.eval_added = Some(f.eval_added.unwrap_or(0).max(added));
                }
                return;
            }
            Phase::AfterForward => Event::Loss,
            Phase::AfterBackward => Event::Gradients,
            Phase::AfterStep => Event::Step,
        };
        let meter = &self.shared.meter;
        let Some(reading) = meter.read() else {
            return;
        };
        let (exact, used) = (meter.exact_peak(), meter.device_used());
        let mut f = self.shared.figures();
        f.record(event, reading);
        f.phases.record(phase, reading.in_use);
        if let Some(exact) = exact {
            f.peak = f.peak.max(exact);
        }
        if let Some(used) = used {
            f.device_used_peak = Some(f.device_used_peak.unwrap_or(0).max(used));
        }
        if phase == Phase::AfterStep {
            f.reserved_after_step = reading.reserved;
            f.last_step = Some(reading);
        }
    }

    fn report(&self) -> MemoryReport {
        let f = self.shared.figures();
        if f.samples == 0 {
            // Nothing was read: no allocator installed, or no device answer.
            return super::NullProbe.report();
        }
        let exact = self.shared.meter.exact_peak().is_some();
        MemoryReport {
            memory_probe: self.shared.meter.kind(),
            peak_bytes: Some(f.peak),
            peak_method: Some(match exact {
                true => "exact (counting allocator)".into(),
                false => format!(
                    "largest of {} samples at layer boundaries (forward and backward)",
                    f.samples
                ),
            }),
            reserved_peak_bytes: f.reserved_peak,
            reserved_after_step_bytes: f.reserved_after_step,
            device_used_peak_bytes: f.device_used_peak,
            resident_bytes: f.resident,
            training_peak_bytes: f.resident.map(|r| f.peak.saturating_sub(r)),
            live_after_forward_bytes: Some(f.phases.forward),
            live_after_backward_bytes: Some(f.phases.backward),
            live_after_step_bytes: Some(f.phases.step),
            eval_peak_bytes: f.eval_peak,
            eval_added_bytes: f.eval_added,
        }
    }

    fn timeline(&self) -> Option<Timeline> {
        Some(self.shared.figures().timeline.clone())
    }

    fn last_step(&self) -> Option<Reading> {
        self.shared.figures().last_step
    }
}
