//! What a model's forward pass holds for backward, op by op: the memory estimate's input.
//!
//! A model describes its forward as a [`Plan`]: the ops it runs, in order, each with its
//! per-image shapes and parameters ([`Layer`]). Each op states, beside its own code, what it
//! keeps for backward and what its backward has alive ([`Footprint`]) on each backend family,
//! where the kernels differ; Burn's own ops are stated in `composed.rs`, read from
//! burn-autodiff 0.21. The estimator walks a plan and adds these up; it knows no model.

use crate::kernels::Kernels;
use crate::{
    attention, batch_norm, composed, conv_bn_relu, conv_relu_pool, max_pool, sliced_linear,
};

/// Which kernels run an op, where they hold different bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Flex and the `flex-kernels` crate.
    Cpu,
    /// CubeCL (CUDA, wgpu).
    CubeCl,
}

impl Family {
    /// Values per slice of a batch that the family's kernels take: the
    /// [`Kernels::slice_values`] hook of its backends (`None`: the whole batch).
    pub fn slice_values(self) -> Option<usize> {
        match self {
            Family::Cpu => <burn::backend::Flex as Kernels>::slice_values(),
            Family::CubeCl => <burn::backend::Wgpu as Kernels>::slice_values(),
        }
    }
}

/// The units a footprint is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Images in the micro-batch.
    pub batch: u64,
    /// Bytes per activation element (the compute dtype).
    pub compute: u64,
    /// Bytes per element of the normalisation dtype (a transformer's residual stream and
    /// LayerNorms: f32 under mixed precision).
    pub norm: u64,
    /// Bytes per max-pool index (the backend's int: i64 on Flex, i32 on CubeCL).
    pub index: u64,
    /// Which kernels run the ops.
    pub family: Family,
    /// Whether the compute dtype is bf16 (the CPU runs its bf16 ops through f32 copies).
    pub bf16: bool,
    /// Bytes per weight element of the compute-dtype copies the composed layers make (2 under
    /// mixed precision, 0 when the weights already have the compute dtype): a recomputed
    /// block makes its copies again in backward.
    pub weight_copies: u64,
}

impl Sizes {
    /// Bytes of `elements` activation values per image, for the whole batch.
    pub fn acts(&self, elements: u64) -> u64 {
        self.batch * elements * self.compute
    }

    /// Bytes of `elements` normalisation-dtype values per sample, for the whole batch.
    pub fn norms(&self, elements: u64) -> u64 {
        self.batch * elements * self.norm
    }

    /// Bytes of `elements` f32 values per sample, for the whole batch.
    pub fn f32s(&self, elements: u64) -> u64 {
        self.batch * elements * 4
    }

    /// Bytes of the f32 copies the CPU's bf16 path makes of `elements` values per image
    /// (none elsewhere).
    pub fn cpu_bf16_f32(&self, elements: u64) -> u64 {
        match (self.family, self.bf16) {
            (Family::Cpu, true) => self.batch * elements * 4,
            _ => 0,
        }
    }

    /// Bytes of the realigning copy the CPU's matmul makes of its `elements`-per-image output
    /// (Flex makes it as a byte buffer and copies it; in bf16 after an f32 copy the bf16 path
    /// already counts); none on CubeCL.
    pub fn cpu_matmul_copy(&self, elements: u64) -> u64 {
        match (self.family, self.bf16) {
            (Family::Cpu, true) => self.batch * elements * 2,
            (Family::Cpu, false) => self.batch * elements * 4,
            (Family::CubeCl, _) => 0,
        }
    }
}

/// What one op holds, in bytes, at a micro-batch (see [`Sizes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Kept from its forward until its own backward.
    pub saved: u64,
    /// Values (activations, indices, bytes) in `saved`, for the estimate's element counts.
    pub saved_values: u64,
    /// The part of `saved` that is a ReLU's output: activation checkpointing drops it and the
    /// op's backward recomputes it (alive then instead).
    pub recomputable: u64,
    /// Alive during its backward beside what earlier ops keep: its output's gradient, its
    /// input's, and what the backward makes.
    pub backward: u64,
    /// Parameter elements whose fresh gradient the op makes in backward and the graph holds
    /// until backward ends (unless it goes into a lent window sum at once).
    pub weight_grad: u64,
    /// Its output's gradient.
    pub output_grad: u64,
}

impl Footprint {
    /// An element-wise op over `elements` values per image that keeps its input and whose
    /// backward has its output's and its input's gradients alive (ReLU, batch norm).
    pub fn keeps_input(s: &Sizes, elements: u64) -> Self {
        Self {
            saved: s.acts(elements),
            saved_values: s.batch * elements,
            recomputable: 0,
            backward: s.acts(2 * elements),
            weight_grad: 0,
            output_grad: s.acts(elements),
        }
    }
}

/// One op of a forward pass, with its per-image sizes (elements) and its parameters: `input`
/// and `output` values per image, `weight` and `bias` elements, batch-norm `channels`.
// Each variant's doc names its fields; a doc line per field would repeat the one above.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layer {
    /// Burn's conv2d: `weight` elements (and `bias`), `input` → `output` values per image.
    Conv {
        input: u64,
        output: u64,
        weight: u64,
        bias: u64,
    },
    /// Burn's ReLU over `elements` values per image.
    Relu { elements: u64 },
    /// Max-pool with indices ([the engine's](crate::max_pool), Burn's computation), `input` →
    /// `output` values per image.
    MaxPool { input: u64, output: u64 },
    /// The engine's batch norm ([`batch_norm`](crate::batch_norm)) over `elements` values per
    /// image, `channels` of them.
    BatchNorm { elements: u64, channels: u64 },
    /// Burn's adaptive average pool to one value per channel.
    GlobalPool { input: u64, channels: u64 },
    /// Burn's linear layer.
    Linear {
        input: u64,
        output: u64,
        weight: u64,
        bias: u64,
    },
    /// The fused [conv → BN → ReLU](crate::conv_bn_relu).
    ConvBnRelu {
        input: u64,
        output: u64,
        weight: u64,
        channels: u64,
    },
    /// The fused [conv → ReLU → max-pool](crate::conv_relu_pool); `conv` values per image of
    /// the full-resolution conv output, `output` pooled ones.
    ConvReluPool {
        input: u64,
        conv: u64,
        output: u64,
        weight: u64,
        bias: u64,
    },
    /// The [sliced linear layer](crate::sliced_linear).
    SlicedLinear {
        input: u64,
        output: u64,
        weight: u64,
        bias: u64,
    },
    /// Burn's element-wise add of two `elements`-value tensors (a residual connection).
    Add { elements: u64 },
    /// Burn's embedding: `rows` vectors of `width` (trainable), looked up by `tokens` ids per
    /// sample (0: ids shared by the whole batch, as positions are).
    Embedding { tokens: u64, width: u64, rows: u64 },
    /// A LayerNorm composed from Burn's ops in the normalisation dtype, over `rows` vectors of
    /// `width` per sample, with a trainable scale and shift.
    LayerNorm { rows: u64, width: u64 },
    /// Causal multi-head [attention](crate::attention) over `seq` tokens of `width` (the three
    /// heads' inputs and the output), `heads` heads; naive or memory-efficient.
    Attention {
        seq: u64,
        width: u64,
        heads: u64,
        memory_efficient: bool,
    },
    /// Burn's GELU with the tanh approximation (composed) over `elements` values per sample.
    Gelu { elements: u64 },
    /// An add on a transformer's residual stream, in the normalisation dtype.
    Residual { elements: u64 },
    /// A block under whole-block checkpointing (run by the model: a GPT's `recomputed_grads`
    /// in burn-models): keeps its
    /// `input` values per sample (the residual stream, in the normalisation dtype); its
    /// backward runs `layers` forward again and then their backward.
    Recomputed { layers: Vec<Layer>, input: u64 },
    /// A language model's head tied to its token embedding: `input` → `output` values per
    /// sample through the embedding's `weight` elements (counted as the embedding's), cast to
    /// the compute dtype.
    TiedHead {
        input: u64,
        output: u64,
        weight: u64,
    },
}

impl Layer {
    /// A classifier with bias from `input` features to `output` classes: the sliced linear
    /// layer when `fused`, Burn's linear layer otherwise (as `layers::classifier` runs it).
    pub fn classifier(input: u64, output: u64, fused: bool) -> Self {
        let (weight, bias) = (input * output, output);
        match fused {
            true => Layer::SlicedLinear {
                input,
                output,
                weight,
                bias,
            },
            false => Layer::Linear {
                input,
                output,
                weight,
                bias,
            },
        }
    }
}

/// Where an op's input comes from.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// The output of the op before it (`None`: the images, which get no gradient).
    After(Option<&'a Layer>),
    /// An earlier tensor that an earlier op keeps for backward.
    Kept,
}

/// A [`Layer`] with the name the estimate shows for it (layers of one name are one line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// The line it is counted in.
    pub group: String,
    /// The op.
    pub layer: Layer,
    /// Whether its input is an earlier tensor than the previous op's output, one an earlier op
    /// keeps already (a residual block's input, read again by its downsample branch).
    pub reads_earlier: bool,
}

/// A model's forward pass as the estimate reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The ops, in forward order.
    pub layers: Vec<Planned>,
}

impl Plan {
    /// Adds `layer`, reading the previous op's output, counted in the line `group`.
    pub fn push(&mut self, group: impl Into<String>, layer: Layer) {
        self.layers.push(Planned {
            group: group.into(),
            layer,
            reads_earlier: false,
        });
    }

    /// Adds `layer` reading an earlier tensor that an earlier op keeps (see
    /// [`Planned::reads_earlier`]).
    pub fn push_branch(&mut self, group: impl Into<String>, layer: Layer) {
        self.layers.push(Planned {
            group: group.into(),
            layer,
            reads_earlier: true,
        });
    }

    /// Trainable elements other than batch norm's: conv, linear, embedding and LayerNorm.
    pub fn weights(&self) -> u64 {
        self.layers.iter().map(|p| p.layer.weights()).sum()
    }

    /// Parameter elements the composed layers cast to the compute dtype, and autodiff keeps
    /// as a half copy under mixed precision: conv and linear weights and biases, a tied head.
    /// A recomputed block's copies live only while it is recomputed: they are not counted here.
    pub fn cast_weights(&self) -> u64 {
        self.layers.iter().map(|p| p.layer.cast_weights()).sum()
    }

    /// Trainable batch-norm elements (γ and β); the running statistics are as many.
    pub fn batch_norm(&self) -> u64 {
        self.layers.iter().map(|p| 2 * p.layer.channels()).sum()
    }

    /// Elements of each trainable tensor (weights, biases, batch norm's γ and β), in forward
    /// order: what ZeRO shares out among peers, one owner a tensor.
    pub fn parameter_tensors(&self) -> Vec<u64> {
        self.layers.iter().flat_map(|p| p.layer.tensors()).collect()
    }

    /// Elements of the largest single weight tensor (the optimizer step replaces one at a
    /// time).
    pub fn largest_weight(&self) -> u64 {
        self.layers
            .iter()
            .map(|p| p.layer.largest_weight())
            .max()
            .unwrap_or(0)
    }

    /// Each op's footprint at `sizes`, in forward order.
    pub fn footprints(&self, sizes: &Sizes) -> Vec<Footprint> {
        let mut out = Vec::with_capacity(self.layers.len());
        let mut previous: Option<&Layer> = None;
        for p in &self.layers {
            let input = match p.reads_earlier {
                true => Input::Kept,
                false => Input::After(previous),
            };
            out.push(p.layer.footprint(sizes, input));
            previous = Some(&p.layer);
        }
        out
    }
}

impl Layer {
    /// Elements of its largest weight tensor.
    fn largest_weight(&self) -> u64 {
        match *self {
            Layer::Conv { weight, .. }
            | Layer::Linear { weight, .. }
            | Layer::ConvBnRelu { weight, .. }
            | Layer::ConvReluPool { weight, .. }
            | Layer::SlicedLinear { weight, .. } => weight,
            Layer::Embedding { width, rows, .. } => width * rows,
            Layer::Recomputed { ref layers, .. } => {
                layers.iter().map(Layer::largest_weight).max().unwrap_or(0)
            }
            _ => 0,
        }
    }

    /// Parameter elements it casts to the compute dtype and autodiff keeps, once cast, for
    /// backward (none for a recomputed block: see [`Plan::cast_weights`]).
    fn cast_weights(&self) -> u64 {
        match *self {
            Layer::Conv { weight, bias, .. }
            | Layer::Linear { weight, bias, .. }
            | Layer::ConvReluPool { weight, bias, .. }
            | Layer::SlicedLinear { weight, bias, .. } => weight + bias,
            Layer::ConvBnRelu { weight, .. } | Layer::TiedHead { weight, .. } => weight,
            _ => 0,
        }
    }

    /// Trainable elements other than batch norm's.
    fn weights(&self) -> u64 {
        match *self {
            Layer::Recomputed { ref layers, .. } => layers.iter().map(Layer::weights).sum(),
            Layer::Conv { weight, bias, .. }
            | Layer::Linear { weight, bias, .. }
            | Layer::ConvReluPool { weight, bias, .. }
            | Layer::SlicedLinear { weight, bias, .. } => weight + bias,
            Layer::ConvBnRelu { weight, .. } => weight,
            Layer::Embedding { width, rows, .. } => width * rows,
            Layer::LayerNorm { width, .. } => 2 * width,
            _ => 0,
        }
    }

    /// Elements of each trainable tensor it holds ([`weights`](Self::weights) and batch
    /// norm's γ and β, tensor by tensor).
    fn tensors(&self) -> Vec<u64> {
        let tensors = match *self {
            Layer::Recomputed { ref layers, .. } => {
                return layers.iter().flat_map(Layer::tensors).collect()
            }
            Layer::Conv { weight, bias, .. }
            | Layer::Linear { weight, bias, .. }
            | Layer::ConvReluPool { weight, bias, .. }
            | Layer::SlicedLinear { weight, bias, .. } => vec![weight, bias],
            Layer::ConvBnRelu {
                weight, channels, ..
            } => vec![weight, channels, channels],
            Layer::BatchNorm { channels, .. } => vec![channels, channels],
            Layer::Embedding { width, rows, .. } => vec![width * rows],
            Layer::LayerNorm { width, .. } => vec![width, width],
            _ => Vec::new(),
        };
        tensors.into_iter().filter(|n| *n > 0).collect()
    }

    /// Batch-norm channels.
    fn channels(&self) -> u64 {
        match *self {
            Layer::Recomputed { ref layers, .. } => layers.iter().map(Layer::channels).sum(),
            Layer::BatchNorm { channels, .. } | Layer::ConvBnRelu { channels, .. } => channels,
            _ => 0,
        }
    }

    /// Whether its output is a ReLU's (what checkpointing recomputes in the next op).
    fn relu_output(&self) -> bool {
        matches!(self, Layer::Relu { .. } | Layer::ConvBnRelu { .. })
    }

    /// Whether it keeps its own output for backward (an op reading it keeps no second copy).
    /// Each op's footprint is derived from its own shapes; the first op's input (the images)
    /// gets no gradient.
    fn keeps_output(&self) -> bool {
        matches!(self, Layer::ConvReluPool { .. })
    }

    /// The op's footprint at `sizes`, given where its `input` comes from.
    pub fn footprint(&self, s: &Sizes, input: Input) -> Footprint {
        let (relu_input, shared_input, input_grad) = match input {
            Input::After(previous) => (
                previous.is_some_and(Layer::relu_output),
                previous.is_some_and(Layer::keeps_output),
                previous.is_some(),
            ),
            Input::Kept => (false, true, true),
        };
        match *self {
            Layer::Conv { input, output, .. } => {
                composed::conv2d(s, input, output, relu_input, shared_input)
            }
            Layer::Relu { elements } => composed::relu(s, elements),
            Layer::MaxPool { input, output } => max_pool::footprint(s, input, output, relu_input),
            Layer::BatchNorm { elements, .. } => batch_norm::footprint(s, elements),
            Layer::GlobalPool { input, channels } => {
                composed::global_pool(s, input, channels, relu_input)
            }
            Layer::Linear { input, output, .. } => composed::linear(s, input, output),
            Layer::ConvBnRelu { input, output, .. } => conv_bn_relu::footprint(s, input, output),
            Layer::ConvReluPool {
                input,
                conv,
                output,
                ..
            } => conv_relu_pool::footprint(s, input, conv, output, input_grad),
            Layer::SlicedLinear {
                input,
                output,
                weight,
                ..
            } => sliced_linear::footprint(s, input, output, weight, shared_input),
            Layer::Add { elements } => composed::add(s, elements),
            Layer::Embedding { tokens, width, .. } => composed::embedding(s, tokens, width),
            Layer::LayerNorm { rows, width } => composed::layer_norm(s, rows, width),
            Layer::Attention {
                seq,
                width,
                heads,
                memory_efficient,
            } => attention::footprint(s, seq, width, heads, memory_efficient),
            Layer::Gelu { elements } => composed::gelu(s, elements),
            Layer::Residual { elements } => composed::residual(s, elements),
            Layer::TiedHead { input, output, .. } => composed::linear(s, input, output),
            Layer::Recomputed { ref layers, input } => recomputed(s, layers, input),
        }
    }
}

/// A recomputed block: keeps its input; its backward holds the block's recomputed activations
/// and the compute-dtype copies of its weights, walks the block's backward (its worst instant:
/// the activations of the ops not yet reached, plus one op's backward), and has the block's
/// output and input gradients alive.
fn recomputed(s: &Sizes, layers: &[Layer], input: u64) -> Footprint {
    let plan = Plan {
        layers: layers
            .iter()
            .map(|l| Planned {
                group: String::new(),
                layer: l.clone(),
                reads_earlier: false,
            })
            .collect(),
    };
    let inner = plan.footprints(s);
    let mut alive: u64 = inner.iter().map(|f| f.saved).sum();
    let mut peak = alive;
    for f in inner.iter().rev() {
        peak = peak.max(alive + f.backward);
        alive -= f.saved;
    }
    let copies = s.weight_copies * layers.iter().map(Layer::cast_weights).sum::<u64>();
    Footprint {
        saved: s.norms(input),
        saved_values: s.batch * input,
        recomputable: 0,
        backward: peak + copies + s.norms(2 * input),
        weight_grad: 0,
        output_grad: s.norms(input),
    }
}
