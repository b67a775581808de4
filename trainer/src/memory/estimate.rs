//! The analytic memory estimate: what is alive at the peak of a training step, predicted from
//! the config alone (no tensor is allocated).
//!
//! At the end of a micro-batch's forward pass every activation saved for backward is alive.
//! What Burn's autodiff saves, read from burn-autodiff 0.21's ops:
//! conv2d and linear keep their input and weight; ReLU keeps its *input*; max-pool keeps its
//! input and the argmax indices; adaptive average pooling keeps its input; casts keep nothing;
//! oomlab's batch norm keeps its input and two per-channel vectors. A tensor kept by two ops
//! (a ReLU output that is the next conv's input) is counted once.
//!
//! The peak is whichever is largest: the end of forward, a point in backward, where a layer's
//! incoming and outgoing gradients are alive beside the activations not yet freed, or the
//! optimizer step, where every gradient and the optimizer's state are alive (a large model at a
//! small batch peaks there).

use serde::Serialize;

use oomlab_engine::{Family, Footprint, Sizes};

use crate::config::{BackendKind, Checkpointing, OptimizerName, PrecisionMode, Settings, Shard};
use crate::distributed::{Owners, BUCKET_BYTES, PIECE_VALUES};
use crate::memory::floor::Floor;
use crate::memory::human;

/// What a measured peak counts, and so what the prediction must include.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// The CPU backend: the heap also holds the data set.
    CpuHeap,
    /// A GPU: its memory holds tensors only; the data set stays on the host.
    Device,
}

impl Target {
    /// The target of a run on `backend` (`auto` is taken for a GPU: that is where it runs
    /// when one is found, and the larger question).
    pub fn of(backend: BackendKind) -> Self {
        match backend {
            BackendKind::Cpu => Self::CpuHeap,
            BackendKind::Auto | BackendKind::Cuda | BackendKind::Wgpu => Self::Device,
        }
    }
}

/// One row of the breakdown.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// What the bytes hold.
    pub what: String,
    /// Elements.
    pub elements: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The breakdown for one config.
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    /// What [`predicted_peak`](Self::predicted_peak) is the peak of.
    pub target: Target,
    /// Trainable parameters.
    pub parameters: u64,
    /// Micro-batch the activations are sized for.
    pub micro_batch: usize,
    /// Parameters, BN buffers, gradients, optimizer state, half weight copies: sized by the
    /// model, independent of the batch.
    pub model_state: Vec<Line>,
    /// Saved for backward, one line per layer, for one micro-batch.
    pub activations: Vec<Line>,
    /// What backward adds on top of the saved activations at its own peak.
    pub in_flight: Line,
    /// What the optimizer step adds to the model state (less any half weight copies, freed by
    /// then): every gradient and the new value of the largest parameter.
    pub step: Line,
    /// Model state + `step`: the peak when it is above backward's (a large model at a small
    /// batch).
    pub step_peak_bytes: u64,
    /// The data set held in host memory (on the CPU backend, the same heap).
    pub host_data: Line,
    /// What the CPU runtime keeps from its first use on (gemm's packing slabs): made before
    /// the resident baseline, so in the heap peak and not in the training peak. `None` on a
    /// device.
    pub cpu_runtime: Option<Line>,
    /// Device bytes at the peak: model state + saved activations + backward's in-flight bytes.
    pub device_peak_bytes: u64,
    /// The least a step of this model can peak at (see [`Floor`]); `device_peak_bytes` and a
    /// measured training peak are compared with it.
    pub floor: Floor,
    /// The same bytes by the term each fix shrinks.
    pub terms: Terms,
}

/// The predicted peak by term, in bytes: what each fix of the book shrinks. The first four add
/// up to [`Estimate::device_peak_bytes`]; `data` is host memory (on the CPU, the same heap).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Terms {
    /// Parameters, batch-norm running statistics and half weight copies.
    pub parameters: u64,
    /// Gradients alive at the peak: backward's in flight, and a window's sum under accumulation.
    pub gradients: u64,
    /// Adam's moments or SGD's momentum.
    pub optimizer_state: u64,
    /// Saved for backward (and the logits).
    pub activations: u64,
    /// The data set in host memory.
    pub data: u64,
}

impl Estimate {
    /// The predicted peak as the probe of [`target`](Self::target) measures it: the CPU heap
    /// also holds the data.
    pub fn predicted_peak(&self) -> u64 {
        match self.target {
            Target::CpuHeap => self.heap_peak(),
            Target::Device => self.device_peak_bytes,
        }
    }

    /// The peak of the CPU heap: device bytes, the data set and the runtime's slabs.
    fn heap_peak(&self) -> u64 {
        let runtime = self.cpu_runtime.as_ref().map_or(0, |l| l.bytes);
        self.device_peak_bytes + self.host_data.bytes + runtime
    }

    /// A table for the terminal.
    pub fn table(&self) -> String {
        let width = self
            .model_state
            .iter()
            .chain(&self.activations)
            .map(|l| l.what.chars().count())
            .max()
            .unwrap_or(0);
        let mut out = format!(
            "memory estimate (micro-batch {}, {} trainable parameters)\n  {:<width$}  {:>14}  {:>10}\n",
            self.micro_batch, self.parameters, "what", "elements", "bytes"
        );
        let rows = self.model_state.iter().chain(&self.activations);
        for l in rows.chain(std::iter::once(&self.in_flight)) {
            out.push_str(&format!(
                "  {:<width$}  {:>14}  {:>10}\n",
                l.what,
                l.elements,
                human(l.bytes)
            ));
        }
        let activations: u64 = self.activations.iter().map(|l| l.bytes).sum();
        let held = match &self.cpu_runtime {
            Some(l) => format!(
                "host data {} and {} {}",
                human(self.host_data.bytes),
                l.what,
                human(l.bytes)
            ),
            None => format!("host data {}", human(self.host_data.bytes)),
        };
        let at = match self.step_peak_bytes >= self.device_peak_bytes {
            true => "at the optimizer step",
            false => "in backward",
        };
        out.push_str(&format!(
            "saved activations {}; device peak {} ({at}); {held} (the CPU heap peak also holds them: {})\n",
            human(activations),
            human(self.device_peak_bytes),
            human(self.heap_peak())
        ));
        out.push_str(&format!(
            "at the optimizer step: model state + {} ({}) = {}\n",
            self.step.what,
            human(self.step.bytes),
            human(self.step_peak_bytes)
        ));
        let f = &self.floor;
        out.push_str(&format!(
            "analytic floor {} = model state {} + the larger of gradients {} and, at backward's worst instant, the fused blocks' saved activations {} + one activation gradient {}; the device peak is {:.2}× the floor\n",
            human(f.total()),
            human(f.model_state),
            human(f.gradients),
            human(f.saved),
            human(f.gradient),
            f.ratio(self.device_peak_bytes)
        ));
        out
    }
}

/// Bytes per element of the layers' compute dtype and of the parameters.
fn dtype_bytes(settings: &Settings) -> (u64, u64) {
    let compute = if settings.precision.mode.half().is_some() {
        2
    } else {
        4
    };
    let params = if settings.precision.mode.master_weights() {
        4
    } else {
        2
    };
    (compute, params)
}

/// Bytes alive at the peak of backward beyond what the end of forward holds: walking the ops
/// backwards, each op's saved tensors are freed after its backward, while that backward has
/// its gradients and scratch alive ([`Footprint::backward`]). Under checkpointing a dropped
/// ReLU output is alive again in the backward that recomputes it. With `accumulating`, an op
/// that adds its weight gradient into the window's sum (which the model state counts) leaves
/// nothing more alive; otherwise that gradient stays, `param` bytes an element.
fn backward_excess(ops: &[Footprint], checkpointed: bool, param: u64, accumulating: bool) -> u64 {
    let dropped = |f: &Footprint| if checkpointed { f.recomputable } else { 0 };
    let saved = |f: &Footprint| f.saved - dropped(f);
    let mut alive: u64 = ops.iter().map(saved).sum();
    let forward_end = alive;
    let mut peak = forward_end;
    for f in ops.iter().rev() {
        peak = peak.max(alive + f.backward + dropped(f));
        // The op's weight gradient stays in the graph's gradients until backward ends, unless
        // it went into the window's sum at once (`oomlab_engine::RunContext::lend`).
        let fresh = if accumulating {
            0
        } else {
            f.weight_grad * param
        };
        alive = alive - saved(f) + fresh;
    }
    peak - forward_end
}

/// The estimate for `settings`, at its micro-batch size, as measured on `target`.
pub fn estimate(settings: &Settings, target: Target) -> Estimate {
    let (compute, pbytes) = dtype_bytes(settings);
    let t = &settings.train;
    let b = t.batch_size as u64;
    let plan = settings.model.plan();
    let (weights, bn, largest) = (plan.weights(), plan.batch_norm(), plan.largest_weight());
    let buffers = bn;
    let checkpointed = settings.memory.checkpointing == Checkpointing::Balanced;
    let params = weights + bn;
    let line = |what: &str, elements: u64, bytes_each: u64| Line {
        what: what.into(),
        elements,
        bytes: elements * bytes_each,
    };
    let mut model_state = vec![
        line("parameters", params, pbytes),
        line("batch-norm running statistics", buffers, pbytes),
    ];
    let moments = match t.optimizer {
        OptimizerName::Adam => 2,
        OptimizerName::Sgd if t.momentum > 0.0 => 1,
        OptimizerName::Sgd => 0,
    };
    // Sharded (ZeRO), a peer keeps its own parameters' state: rank 0's is predicted.
    let d = settings.distributed.as_ref();
    let (peers, shard) = d.map_or((1, Shard::None), |d| (d.world(), d.shard));
    let owned = match shard.optimizer() && peers > 1 {
        true => {
            let tensors: Vec<usize> = plan
                .parameter_tensors()
                .iter()
                .map(|n| *n as usize)
                .collect();
            Owners::balance(&tensors, peers).held(0) as u64
        }
        false => params,
    };
    if moments > 0 {
        let what = match owned < params {
            true => format!("optimizer state (rank 0's shard of {peers} peers)"),
            false => "optimizer state".into(),
        };
        model_state.push(line(&what, moments * owned, pbytes));
    }
    // Across processes on the CPU, burn-communication's websocket connections keep buffers as
    // large as the largest message (three, measured), and a message is copied four times in
    // flight: messages are one tensor, or a piece of one (`PIECE_VALUES`).
    let across_nodes = d.is_some_and(|d| d.nodes.is_some());
    if across_nodes && target == Target::CpuHeap {
        let piece = (PIECE_VALUES as u64).min(largest);
        model_state.push(line(
            "between nodes: websocket buffers and in-flight copies of one piece (7)",
            7 * piece,
            pbytes,
        ));
    }
    if t.accum_steps > 1 {
        // Earlier micro-batches' summed gradients are alive during the next forward.
        model_state.push(line("accumulated gradients", params, pbytes));
    }
    let mode = settings.precision.mode;
    // The least model state: the fused ops cast the f32 weights themselves and keep no half
    // copy, so the floor leaves the copies out.
    let least_state = model_state.clone();
    // The composed layers cast f32 master weights to the half type, and autodiff keeps each cast.
    let half_copies = mode.half().is_some() && mode.master_weights();
    if half_copies && !settings.model.is_fused() {
        // Composed, autodiff keeps each layer's input: the weight cast to half.
        model_state.push(line(
            "half copies of conv/linear weights",
            plan.cast_weights(),
            2,
        ));
    }
    // Max-pool argmax indices are the backend's int: i64 on Flex, i32 on CubeCL (CUDA, wgpu).
    let index = match target {
        Target::CpuHeap => 8,
        Target::Device => 4,
    };
    let sizes = Sizes {
        batch: b,
        compute,
        index,
        family: match target {
            Target::CpuHeap => Family::Cpu,
            Target::Device => Family::CubeCl,
        },
        norm: settings.precision.policy().batch_norm.size() as u64,
        weight_copies: if half_copies { 2 } else { 0 },
        bf16: mode == PrecisionMode::Bf16Mixed,
    };
    let ops = plan.footprints(&sizes);
    let mut activations: Vec<Line> = Vec::new();
    for (p, f) in plan.layers.iter().zip(&ops) {
        let dropped = if checkpointed { f.recomputable } else { 0 };
        let bytes = f.saved - dropped;
        let elements = f.saved_values - dropped / compute;
        // A transformer's blocks share their lines: a line gathers its group wherever it runs.
        match activations.iter_mut().find(|l| l.what == p.group) {
            Some(last) => {
                last.bytes += bytes;
                last.elements += elements;
            }
            None => activations.push(Line {
                what: p.group.clone(),
                elements,
                bytes,
            }),
        }
    }
    // The loss's log-softmax keeps its shifted logits in f32 (Burn's `exp` keeps its input;
    // the shift reuses the logits' buffer): small for a classifier, a language model's largest
    // single tensor at a large vocabulary.
    let classes = (settings.model.classes() * settings.model.predictions_per_sample()) as u64;
    activations.push(line(
        "loss: log-softmax keeps the shifted logits (f32)",
        b * classes,
        4,
    ));
    let bf16_f32 = target == Target::CpuHeap && mode == PrecisionMode::Bf16Mixed;
    let cpu = target == Target::CpuHeap;
    let excess = backward_excess(&ops, checkpointed, pbytes, t.accum_steps > 1);
    let what = if bf16_f32 {
        "backward: gradients in flight (+ CPU bf16 kernels' f32 copies)"
    } else {
        "backward: gradients in flight at its peak"
    };
    let in_flight = Line {
        what: what.into(),
        elements: excess / compute,
        bytes: excess,
    };
    let logits = activations.last().map_or(0, |l| l.bytes);
    // One set of gradients; with accumulation the model state holds it already.
    let gradients = match t.accum_steps {
        1 => params * pbytes,
        _ => 0,
    };
    let floor = floor(settings, &sizes, logits, gradients, &least_state);
    let backward_peak: u64 = model_state
        .iter()
        .chain(&activations)
        .chain(std::iter::once(&in_flight))
        .map(|l| l.bytes)
        .sum();
    // The optimizer step: the activations are gone, every gradient is alive (with ZeRO-2,
    // rank 0's own only), and each parameter's new value is written before its old one is
    // dropped (one tensor at a time: the largest counts). A large model at a small batch peaks
    // here, not in backward.
    let accumulated = if t.accum_steps > 1 {
        params * pbytes
    } else {
        0
    };
    let least: u64 = least_state.iter().map(|l| l.bytes).sum::<u64>() - accumulated;
    // Across nodes ZeRO-2's sums are all-reduced and the others' dropped (burn-collective has
    // no global reduce): every sum exists at the step, as with ZeRO-1.
    let stage2 = shard == Shard::OptimizerGradients && peers > 1 && !across_nodes;
    let (step_grads, what) = match stage2 {
        true => (
            owned,
            "rank 0's gradients + the largest parameter's new value",
        ),
        false => (params, "every gradient + the largest parameter's new value"),
    };
    let step = line(what, step_grads + largest, pbytes);
    // Sharded, the owners then send their new weights in buckets: zeros for the parameters
    // another peer owns and the sums arrive beside the model, one bucket at a time, while
    // ZeRO-1 still holds the other owners' gradients.
    let share_peak = match owned < params {
        true => {
            let bucket = (BUCKET_BYTES as u64)
                .max(largest * pbytes)
                .min(params * pbytes);
            let others = if stage2 { 0 } else { (params - owned) * pbytes };
            least + others + 2 * bucket
        }
        false => 0,
    };
    let step_peak = (least + step.bytes).max(share_peak);
    let device_peak_bytes = backward_peak.max(step_peak);
    let host_data = line(
        "data set (u8 images + labels)",
        super::host::data_bytes(settings),
        1,
    );
    let optimizer_state = moments * owned * pbytes;
    let activation_bytes = activations.iter().map(|l| l.bytes).sum::<u64>();
    let terms = match step_peak > backward_peak {
        // What is alive at the step: no activations; the replaced parameter is a parameter.
        true => Terms {
            parameters: step_peak - optimizer_state - step_grads * pbytes,
            gradients: step_grads * pbytes,
            optimizer_state,
            activations: 0,
            data: host_data.bytes,
        },
        false => {
            let gradient_bytes = in_flight.bytes + accumulated;
            Terms {
                parameters: device_peak_bytes - optimizer_state - gradient_bytes - activation_bytes,
                gradients: gradient_bytes,
                optimizer_state,
                activations: activation_bytes,
                data: host_data.bytes,
            }
        }
    };
    Estimate {
        target,
        parameters: params,
        micro_batch: t.batch_size,
        model_state,
        activations,
        in_flight,
        step,
        step_peak_bytes: step_peak,
        host_data,
        // Not the model's: what the CPU backend keeps once it has run.
        cpu_runtime: cpu.then(gemm_slabs),
        device_peak_bytes,
        floor,
        terms,
    }
}

/// gemm (Flex's matmul and conv) keeps a packing slab of one L2 cache's bytes per thread that
/// has run it, for the thread's life: each rayon worker and the calling thread (3 MiB on a
/// 2-core machine with 1 MiB of L2, found live beside the activations by an allocation trace).
/// The heap probe makes them before it reads the resident baseline.
fn gemm_slabs() -> Line {
    let threads = rayon::current_num_threads() as u64 + 1;
    let l2 = gemm_common::cache::CACHE_INFO[1].cache_bytes as u64;
    Line {
        what: "CPU matmul packing slabs (gemm, one L2 per thread)".into(),
        elements: threads,
        bytes: threads * l2,
    }
}

/// The [`Floor`] of `settings`: its model state, and the worst instant of the fused model's
/// backward at `sizes` (see [`crate::memory::floor`]).
fn floor(
    settings: &Settings,
    sizes: &Sizes,
    logits: u64,
    gradients: u64,
    model_state: &[Line],
) -> Floor {
    let ops = settings.model.clone().fused(true).plan().footprints(sizes);
    // Walking backward: before an op's backward, it and every op before it still hold theirs.
    let mut alive: u64 = ops.iter().map(|f| f.saved).sum::<u64>() + logits;
    let (mut worst_saved, mut worst_gradient) = (alive, 0);
    for f in ops.iter().rev() {
        if alive + f.output_grad > worst_saved + worst_gradient {
            (worst_saved, worst_gradient) = (alive, f.output_grad);
        }
        alive -= f.saved;
    }
    Floor {
        model_state: model_state.iter().map(|l| l.bytes).sum(),
        gradients,
        saved: worst_saved,
        gradient: worst_gradient,
    }
}
