//! The memory timeline of one training window: a sample at every layer boundary of every
//! forward and backward pass (via [`oomlab_engine::boundary`]), after each micro-batch's forward
//! and backward, and after the optimizer step.
//!
//! A probe keeps the window whose largest sample is the largest of the run: the picture of
//! where the peak happens. `memory_timeline.csv` and `.svg` are written from it.

use std::fmt::Write as _;

use oomlab_engine::Pass;

/// The part of a training window a sample lies in: `phase` in `memory_timeline.csv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowPhase {
    /// A micro-batch's forward pass and its loss.
    Forward,
    /// A micro-batch's backward pass and the gradients' accumulation.
    Backward,
    /// The optimizer step.
    Step,
}

impl WindowPhase {
    /// The spelling in `memory_timeline.csv`: `forward`, `backward` or `step`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::Backward => "backward",
            Self::Step => "step",
        }
    }

    /// The phase [`name`](Self::name) spells, or `None`.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Forward, Self::Backward, Self::Step]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

/// What a sample follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The forward pass left this layer.
    Forward(&'static str),
    /// The loss of a micro-batch is computed (its forward pass is complete).
    Loss,
    /// The backward pass reached this layer (its output's gradient is alive).
    Backward(&'static str),
    /// A micro-batch's gradients are accumulated.
    Gradients,
    /// The optimizer step (or skip), after `free_cache` when it runs per step.
    Step,
}

impl Event {
    /// The event a layer boundary's crossing is.
    pub fn crossing(layer: &'static str, pass: Pass) -> Self {
        match pass {
            Pass::Forward => Self::Forward(layer),
            Pass::Backward => Self::Backward(layer),
        }
    }

    /// The phase of the window the event lies in.
    pub fn phase(self) -> WindowPhase {
        match self {
            Self::Forward(_) | Self::Loss => WindowPhase::Forward,
            Self::Backward(_) | Self::Gradients => WindowPhase::Backward,
            Self::Step => WindowPhase::Step,
        }
    }

    /// The layer, or what the event marks.
    pub fn label(self) -> &'static str {
        match self {
            Self::Forward(l) | Self::Backward(l) => l,
            Self::Loss => "loss",
            Self::Gradients => "gradients",
            Self::Step => "optimizer",
        }
    }
}

/// One reading of the device (or heap).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// What had just happened.
    pub event: Event,
    /// The micro-batch of the window (from 1).
    pub micro_batch: usize,
    /// Bytes in use (live tensors).
    pub in_use: u64,
    /// Bytes the allocator held from the device (`None` on the heap: it holds nothing back).
    pub reserved: Option<u64>,
}

/// The samples of the current window and of the window with the highest sample so far.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    current: Vec<Sample>,
    kept: Vec<Sample>,
    micro_batch: usize,
}

/// Samples kept per window at most: a window of many micro-batches keeps its first ones.
const MAX_SAMPLES: usize = 4096;

impl Timeline {
    /// A new window begins: the finished one is kept if it peaked higher.
    pub fn start_window(&mut self) {
        if peak(&self.current) > peak(&self.kept) {
            self.kept = std::mem::take(&mut self.current);
        }
        self.current.clear();
        self.micro_batch = 1;
    }

    /// Records `in_use` (and `reserved`) after `event`.
    pub fn push(&mut self, event: Event, in_use: u64, reserved: Option<u64>) {
        if self.current.len() < MAX_SAMPLES {
            self.current.push(Sample {
                event,
                micro_batch: self.micro_batch.max(1),
                in_use,
                reserved,
            });
        }
        if event == Event::Gradients {
            self.micro_batch += 1;
        }
    }

    /// The window that peaked highest (the current one included), in order.
    pub fn peak_window(&self) -> &[Sample] {
        match peak(&self.current) > peak(&self.kept) {
            true => &self.current,
            false => &self.kept,
        }
    }

    /// `memory_timeline.csv`: one row per sample of [`peak_window`](Self::peak_window).
    pub fn csv(&self) -> String {
        let mut out = String::from("index,phase,layer,micro_batch,in_use_bytes,reserved_bytes\n");
        for (i, s) in self.peak_window().iter().enumerate() {
            let reserved = s.reserved.map_or(String::new(), |r| r.to_string());
            let _ = writeln!(
                out,
                "{i},{},{},{},{},{reserved}",
                s.event.phase().name(),
                s.event.label(),
                s.micro_batch,
                s.in_use
            );
        }
        out
    }
}

fn peak(samples: &[Sample]) -> u64 {
    samples.iter().map(|s| s.in_use).max().unwrap_or(0)
}
