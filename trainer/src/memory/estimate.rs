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

use crate::config::{
    BackendKind, Checkpointing, ModelSpec, OptimizerName, PrecisionMode, Settings,
};
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

/// Values per slice of the fused ops' batch slices.
const SLICE_VALUES: u64 = oomlab_engine::slices::SLICE_VALUES as u64;

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

/// One op of the forward pass, per image: what it saves for backward (elements of the compute
/// dtype, and of max-pool indices: 8 bytes on Flex, 4 on CubeCL), its input and output sizes, the f32 elements the CPU
/// backend's bf16 path converts in its backward (Flex runs bf16 conv, max-pool and matmul
/// through f32 copies), and whether what it saves is a ReLU's output (balanced checkpointing
/// recomputes that instead of keeping it).
/// A fused op also saves `bytes` (one-byte window positions) and makes `scratch` elements of
/// the compute dtype in its backward beside its input and output gradients (the recomputed
/// values and masks it works from), or, when it works slice by slice, `slice` scratch elements
/// whatever the batch. On the CPU, `cpu_copy` elements of its input gradient exist twice for a
/// moment, 4 bytes each: Flex's matmul makes its output as a byte buffer that is copied to be
/// realigned (`FlexTensor::empty`), and in half precision makes it in f32 first.
struct Op {
    group: String,
    saves: u64,
    indices: u64,
    bytes: u64,
    input: u64,
    output: u64,
    scratch: u64,
    slice: u64,
    cpu_copy: u64,
    bf16_f32: u64,
    after_relu: bool,
    /// Weight elements whose gradient the op sums over batch slices before it makes its
    /// input gradient (`sliced_linear`).
    weight_sum: u64,
    /// `slice` on the CPU where it differs: Flex reads the first block's weight and bias
    /// gradients straight off the pooled gradient, with no full-resolution slice.
    cpu_slice: Option<u64>,
}

impl Op {
    /// What the op keeps for backward at micro-batch `b`, with `compute` bytes per activation
    /// element and `index` per max-pool index.
    fn saved_bytes(&self, b: u64, compute: u64, index: u64) -> u64 {
        b * (self.saves * compute + self.indices * index + self.bytes)
    }
}

fn op(group: &str, saves: u64, input: u64, output: u64) -> Op {
    Op {
        group: group.into(),
        saves,
        indices: 0,
        bytes: 0,
        input,
        output,
        scratch: 0,
        slice: 0,
        cpu_copy: 0,
        bf16_f32: 0,
        after_relu: false,
        weight_sum: 0,
        cpu_slice: None,
    }
}

/// The forward tape per image, trainable conv/linear weight elements, trainable BN elements,
/// BN buffer elements, and the elements of the largest single weight tensor.
fn tape(spec: &ModelSpec, size: usize, classes: usize) -> (Vec<Op>, u64, u64, u64, u64) {
    let s = size as u64;
    let k = classes as u64;
    match spec {
        ModelSpec::Simple(_) => {
            let (c, pooled) = (burn_models::simple::CHANNELS as u64, (s / 2) * (s / 2));
            let weights = 3 * c * 9 + c + c * pooled * k + k;
            // The linear layer's weight: 64 channels × 16 × 16 pooled × the classes.
            let largest = (3 * c * 9).max(c * pooled * k);
            let linear = Op {
                // The weight gradient's matmul converts the input and the output gradient.
                bf16_f32: c * pooled + k,
                cpu_copy: c * pooled,
                ..op("linear (keeps its input)", c * pooled, c * pooled, k)
            };
            if spec.is_fused() {
                // The block keeps its output (for the ReLU's sign) until its own backward, after
                // the linear layer's: counted here, and the linear layer keeps nothing more.
                // Its backward works a slice of rows at a time (`sliced_linear`): the CPU's
                // realigning copy and bf16's f32 copies are a slice's, not the batch's.
                let linear = Op {
                    saves: 0,
                    bf16_f32: 0,
                    cpu_copy: 0,
                    slice: 2 * SLICE_VALUES,
                    weight_sum: c * pooled * k,
                    group: "linear (keeps its input: the block's output, counted above)".into(),
                    ..linear
                };
                let fused = Op {
                    bytes: c * pooled,
                    // Per slice of the batch: the conv output's gradient, the backend's weight
                    // gradient scratch (about twice that), the winners' mask and the output
                    // gradient's slice (3.5 slices).
                    slice: 7 * SLICE_VALUES / 2,
                    // The CPU reads the weight gradient off the pooled gradient: no slices.
                    cpu_slice: Some(0),
                    // The images get no gradient: nothing is made for the block's input.
                    ..op(
                        "conv+ReLU+max-pool (keeps the images, its output, 1 byte per output)",
                        3 * s * s + c * pooled,
                        0,
                        c * pooled,
                    )
                };
                return (vec![fused, linear], weights, 0, 0, largest);
            }
            let ops = vec![
                Op {
                    // x_backward and weight_backward each convert x and the output gradient.
                    bf16_f32: 2 * (3 * s * s + c * s * s),
                    ..op(
                        "conv (keeps its input, the images)",
                        3 * s * s,
                        3 * s * s,
                        c * s * s,
                    )
                },
                op(
                    "ReLU (keeps its input, the conv output)",
                    c * s * s,
                    c * s * s,
                    c * s * s,
                ),
                Op {
                    indices: c * pooled,
                    after_relu: true,
                    // x and the output gradient converted, the input gradient made in f32.
                    bf16_f32: 2 * c * s * s + c * pooled,
                    ..op(
                        "max-pool (keeps its input and argmax indices)",
                        c * s * s,
                        c * s * s,
                        c * pooled,
                    )
                },
                linear,
            ];
            (ops, weights, 0, 0, largest)
        }
        ModelSpec::MobileNet(m) => {
            let mut ops = Vec::new();
            let mut side = s.div_ceil(m.stem_stride as u64);
            let mut c_in = m.channels(burn_models::mobilenet::STEM_CHANNELS) as u64;
            let (mut weights, mut bn) = (3 * c_in * 9, 2 * c_in);
            let mut largest = weights;
            let fused = spec.is_fused();
            // conv keeps its input, BN its input (the conv output), ReLU its input (BN's);
            // fused, one op keeps the first two and recomputes the third in backward.
            let conv_bn_relu = |ops: &mut Vec<Op>, group: &str, input: u64, out: u64| {
                if fused {
                    ops.push(Op {
                        // The recomputed BN output, the masked gradient, the BN input's.
                        scratch: 3 * out,
                        bf16_f32: 2 * (input + out),
                        ..op(group, input + out, input, out)
                    });
                    return;
                }
                // Every conv but the stem's reads the previous ReLU's output.
                let after_relu = !ops.is_empty();
                ops.push(Op {
                    bf16_f32: 2 * (input + out),
                    after_relu,
                    ..op(group, input, input, out)
                });
                ops.push(op(group, out, out, out));
                ops.push(op(group, out, out, out));
            };
            let what = match fused {
                true => "fused conv+BN+ReLU: conv, BN inputs",
                false => "conv, BN, ReLU inputs",
            };
            conv_bn_relu(
                &mut ops,
                &format!("stem: {what}"),
                3 * s * s,
                c_in * side * side,
            );
            for (i, &(base, stride)) in burn_models::mobilenet::BLOCKS.iter().enumerate() {
                let c_out = m.channels(base) as u64;
                let input = c_in * side * side;
                side = side.div_ceil(stride as u64);
                let dw = c_in * side * side;
                let group = format!("block {:>2} depthwise: {what}", i + 1);
                conv_bn_relu(&mut ops, &group, input, dw);
                let group = format!("block {:>2} pointwise: {what}", i + 1);
                conv_bn_relu(&mut ops, &group, dw, c_out * side * side);
                weights += c_in * 9 + c_in * c_out;
                largest = largest.max(c_in * c_out);
                bn += 2 * c_in + 2 * c_out;
                c_in = c_out;
            }
            let last = c_in * side * side;
            ops.push(Op {
                after_relu: true,
                ..op("global pool (keeps its input)", last, last, c_in)
            });
            ops.push(Op {
                cpu_copy: c_in,
                ..op("linear (keeps its input)", c_in, c_in, k)
            });
            weights += c_in * k + k;
            (ops, weights, bn, bn, largest.max(c_in * k))
        }
    }
}

/// Bytes per element: activations in the compute dtype, max-pool indices, parameters.
#[derive(Clone, Copy)]
struct Bytes {
    compute: u64,
    index: u64,
    param: u64,
}

/// Bytes alive at the peak of backward beyond what the end of forward holds: walking the tape
/// backwards, each op's saved tensors are freed after it, while the gradient arriving at its
/// output and the one it produces for its input are alive. `bf16_f32` adds the f32 copies that
/// the CPU backend's bf16 kernels make (Flex converts bf16 arguments to f32), `cpu` the
/// realigned copies of [`Op::cpu_copy`].
/// With `accumulating`, an op that adds its weight gradient into the window's sum (which the
/// model state counts) leaves nothing more alive.
fn backward_excess(
    ops: &[Op],
    b: u64,
    bytes: Bytes,
    (bf16_f32, cpu, accumulating): (bool, bool, bool),
) -> u64 {
    let Bytes {
        compute,
        index,
        param,
    } = bytes;
    let saved = |o: &Op| o.saved_bytes(b, compute, index);
    let mut alive: u64 = ops.iter().map(saved).sum();
    let forward_end = alive;
    let mut peak = forward_end;
    for o in ops.iter().rev() {
        let slice = match (cpu, o.cpu_slice) {
            (true, Some(slice)) => slice,
            _ => o.slice,
        };
        let mut in_flight = (b * (o.output + o.input + o.scratch) + slice) * compute;
        if o.after_relu && o.saves == 0 {
            // Checkpointed: the ReLU output is recomputed for this op's backward.
            in_flight += b * o.input * compute;
        }
        if bf16_f32 {
            in_flight += b * o.bf16_f32 * 4;
        }
        if cpu {
            // Under bf16 the f32 result and its realigned copy (8 bytes) come before the bf16
            // output (2 bytes), and `bf16_f32` already counts one f32 copy: 2 more.
            in_flight += b * o.cpu_copy * if bf16_f32 { 2 } else { 4 };
        }
        if o.weight_sum > 0 {
            // Before its input gradient, the op sums its weight gradient over slices. On a
            // GPU: the f32 sum and the add's result beside a slice's product. On the CPU gemm
            // adds into the sum in place, and in half precision the sum is rounded through the
            // compute dtype at the end (f32 and half, then half and f32).
            let each = match (cpu, compute) {
                (true, 2) => 6,
                (true, _) => 4,
                (false, c) => 8 + c,
            };
            in_flight = in_flight.max(b * o.output * compute + o.weight_sum * each);
        }
        peak = peak.max(alive + in_flight);
        // The op's weight gradient stays in the graph's gradients until backward ends, unless
        // it went into the window's sum at once (`oomlab_engine::Context::lend`).
        let fresh = if accumulating {
            0
        } else {
            o.weight_sum * param
        };
        alive = alive - saved(o) + fresh;
    }
    peak - forward_end
}

/// The estimate for `settings`, at its micro-batch size, as measured on `target`.
pub fn estimate(settings: &Settings, target: Target) -> Estimate {
    let (compute, pbytes) = dtype_bytes(settings);
    let t = &settings.train;
    let b = t.batch_size as u64;
    let (mut ops, weights, bn, buffers, largest) =
        tape(&settings.model, settings.input_size, settings.num_classes);
    if settings.memory.checkpointing == Checkpointing::Balanced {
        // ReLU is memory-bound: its output is recomputed in backward from its kept input.
        for o in ops.iter_mut().filter(|o| o.after_relu) {
            o.saves = 0;
        }
    }
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
    if moments > 0 {
        model_state.push(line("optimizer state", moments * params, pbytes));
    }
    if t.accum_steps > 1 {
        // Earlier micro-batches' summed gradients are alive during the next forward.
        model_state.push(line("accumulated gradients", params, pbytes));
    }
    let mode = settings.precision.mode;
    // The least model state: the fused ops cast the f32 weights themselves and keep no half
    // copy, so the floor leaves the copies out.
    let least_state = model_state.clone();
    if mode.half().is_some() && mode.master_weights() && !settings.model.is_fused() {
        // Composed, autodiff keeps each layer's input: the weight cast to half.
        model_state.push(line("half copies of conv/linear weights", weights, 2));
    }
    // Max-pool argmax indices are the backend's int: i64 on Flex, i32 on CubeCL (CUDA, wgpu).
    let index = match target {
        Target::CpuHeap => 8,
        Target::Device => 4,
    };
    let mut activations: Vec<Line> = Vec::new();
    for o in &ops {
        let bytes = o.saved_bytes(b, compute, index);
        let elements = b * (o.saves + o.indices + o.bytes);
        match activations.last_mut() {
            Some(last) if last.what == o.group => {
                last.bytes += bytes;
                last.elements += elements;
            }
            _ => activations.push(Line {
                what: o.group.clone(),
                elements,
                bytes,
            }),
        }
    }
    // Logits cast to f32, log-softmax output: small, but there.
    let classes = settings.num_classes as u64;
    activations.push(line(
        "logits and log-probabilities (f32)",
        2 * b * classes,
        4,
    ));
    let bf16_f32 = target == Target::CpuHeap && mode == PrecisionMode::Bf16Mixed;
    let cpu = target == Target::CpuHeap;
    let bytes = Bytes {
        compute,
        index,
        param: pbytes,
    };
    let excess = backward_excess(&ops, b, bytes, (bf16_f32, cpu, t.accum_steps > 1));
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
    let floor = floor(settings, b, compute, index, logits, gradients, &least_state);
    let backward_peak: u64 = model_state
        .iter()
        .chain(&activations)
        .chain(std::iter::once(&in_flight))
        .map(|l| l.bytes)
        .sum();
    // The optimizer step: the activations are gone, every gradient is alive, and each
    // parameter's new value is written before its old one is dropped (one tensor at a time:
    // the largest counts). A large model at a small batch peaks here, not in backward.
    let least: u64 = least_state.iter().map(|l| l.bytes).sum();
    let step = line(
        "every gradient + the largest parameter's new value",
        gradients / pbytes + largest,
        pbytes,
    );
    let step_peak = least + step.bytes;
    let device_peak_bytes = backward_peak.max(step_peak);
    let host_data = line(
        "data set (u8 images + labels)",
        super::host::data_bytes(settings),
        1,
    );
    let optimizer_state = moments * params * pbytes;
    let accumulated = if t.accum_steps > 1 {
        params * pbytes
    } else {
        0
    };
    let activation_bytes = activations.iter().map(|l| l.bytes).sum::<u64>();
    let terms = match step_peak > backward_peak {
        // What is alive at the step: no activations; the replaced parameter is a parameter.
        true => Terms {
            parameters: step_peak - optimizer_state - accumulated - gradients,
            gradients: gradients + accumulated,
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

/// The [`Floor`] of `settings`: its model state, and the worst instant of the fused tape's
/// backward at micro-batch `b` (see [`crate::memory::floor`]).
fn floor(
    settings: &Settings,
    b: u64,
    compute: u64,
    index: u64,
    logits: u64,
    gradients: u64,
    model_state: &[Line],
) -> Floor {
    let fused = settings.model.clone().fused(true);
    let (ops, ..) = tape(&fused, settings.input_size, settings.num_classes);
    let saved = |o: &Op| o.saved_bytes(b, compute, index);
    // Walking backward: before an op's backward, it and every op before it still hold theirs.
    let mut alive: u64 = ops.iter().map(saved).sum::<u64>() + logits;
    let (mut worst_saved, mut worst_gradient) = (alive, 0);
    for o in ops.iter().rev() {
        let gradient = b * o.output * compute;
        if alive + gradient > worst_saved + worst_gradient {
            (worst_saved, worst_gradient) = (alive, gradient);
        }
        alive -= saved(o);
    }
    Floor {
        model_state: model_state.iter().map(|l| l.bytes).sum(),
        gradients,
        saved: worst_saved,
        gradient: worst_gradient,
    }
}
