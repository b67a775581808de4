//! What the composed layers keep for backward: Burn's own ops', read from burn-autodiff 0.21,
//! which the engine's composed [conv](crate::conv2d), [ReLU](crate::relu) and
//! [max-pool](crate::max_pool) keep too. conv2d and linear keep their input and weight; ReLU
//! keeps its input; adaptive average pooling keeps its input; an add keeps nothing; casts keep
//! nothing. Their backward has the output's and the input's gradient alive, and on the CPU
//! the copies Flex's kernels make where Flex's ops still run (linear: see [`Sizes`]).

use crate::footprint::{Footprint, Sizes};

/// Only the part of `saved` that is a ReLU's output can be recomputed instead of kept.
pub(crate) fn recomputable(relu_input: bool, bytes: u64) -> u64 {
    if relu_input {
        bytes
    } else {
        0
    }
}

/// `conv2d` ([the engine's composed conv](crate::conv2d)): keeps its input (counted by an
/// earlier op when it keeps the same tensor: `shared_input`). Its backward has the output's and
/// the input's gradients; on the CPU its kernels widen half values an image at a time (where
/// Flex's bf16 conv converted the whole input and output gradient to f32). Counted with an
/// input gradient even for the first layer (whose backward is never the peak).
pub(crate) fn conv2d(
    s: &Sizes,
    input: u64,
    output: u64,
    relu_input: bool,
    shared_input: bool,
) -> Footprint {
    let saved = if shared_input { 0 } else { s.acts(input) };
    Footprint {
        saved,
        saved_values: saved / s.compute,
        recomputable: recomputable(relu_input, saved),
        backward: s.acts(input + output),
        weight_grad: 0,
        output_grad: s.acts(output),
    }
}

/// ReLU: keeps its input.
pub(crate) fn relu(s: &Sizes, elements: u64) -> Footprint {
    Footprint::keeps_input(s, elements)
}

/// Adaptive average pooling to one value per channel: keeps its input.
pub(crate) fn global_pool(s: &Sizes, input: u64, channels: u64, relu_input: bool) -> Footprint {
    let saved = s.acts(input);
    Footprint {
        saved,
        saved_values: s.batch * input,
        recomputable: recomputable(relu_input, saved),
        backward: s.acts(input + channels),
        weight_grad: 0,
        output_grad: s.acts(channels),
    }
}

/// Linear: keeps its input. On the CPU the input gradient's matmul output is copied once to be
/// realigned, and in bf16 the weight gradient's matmul converts the input and the output
/// gradient.
pub(crate) fn linear(s: &Sizes, input: u64, output: u64) -> Footprint {
    Footprint {
        saved: s.acts(input),
        saved_values: s.batch * input,
        recomputable: 0,
        backward: s.acts(input + output)
            + s.cpu_bf16_f32(input + output)
            + s.cpu_matmul_copy(input),
        weight_grad: 0,
        output_grad: s.acts(output),
    }
}

/// An element-wise add (a residual connection): keeps nothing; its backward hands the output
/// gradient to both inputs, and the identity's copy is alive beside the branch's gradients
/// until the two meet again at the block's input.
pub(crate) fn add(s: &Sizes, elements: u64) -> Footprint {
    Footprint {
        saved: 0,
        saved_values: 0,
        recomputable: 0,
        backward: s.acts(2 * elements),
        weight_grad: 0,
        output_grad: s.acts(elements),
    }
}

/// An embedding lookup: keeps the ids (the backend's int) and the table (a parameter, no
/// extra bytes); its backward makes a dense gradient of the whole table (counted with the
/// gradients) from its output's gradient. Ids shared by the batch (`tokens` 0) count nothing.
pub(crate) fn embedding(s: &Sizes, tokens: u64, width: u64) -> Footprint {
    let saved = s.batch * tokens * s.index;
    let out = if tokens == 0 { 0 } else { width * tokens };
    Footprint {
        saved,
        saved_values: s.batch * tokens,
        recomputable: 0,
        backward: s.norms(out),
        weight_grad: 0,
        output_grad: s.norms(out),
    }
}

/// LayerNorm as the models compose it in the normalisation dtype: the variance's square keeps
/// the centred input, the division keeps a second centred copy and the row's deviation, and
/// the scale keeps the normalised values: three `rows × width` tensors and a value per row.
/// Its backward has about three of them alive: the output's gradient and two partial sums.
pub(crate) fn layer_norm(s: &Sizes, rows: u64, width: u64) -> Footprint {
    let values = 3 * rows * width + rows;
    Footprint {
        saved: s.norms(values),
        saved_values: s.batch * values,
        recomputable: 0,
        backward: s.norms(3 * rows * width),
        weight_grad: 0,
        output_grad: s.norms(rows * width),
    }
}

/// GELU with the tanh approximation, composed: the cube keeps the input, `tanh` keeps its
/// output and the product keeps `1 + tanh`: three tensors of the input's size. Its backward
/// has the output's and the input's gradients and a partial product alive.
pub(crate) fn gelu(s: &Sizes, elements: u64) -> Footprint {
    Footprint {
        saved: s.acts(3 * elements),
        saved_values: s.batch * 3 * elements,
        recomputable: 0,
        backward: s.acts(3 * elements),
        weight_grad: 0,
        output_grad: s.acts(elements),
    }
}

/// An add on the residual stream: [`add`] in the normalisation dtype.
pub(crate) fn residual(s: &Sizes, elements: u64) -> Footprint {
    Footprint {
        saved: 0,
        saved_values: 0,
        recomputable: 0,
        backward: s.norms(2 * elements),
        weight_grad: 0,
        output_grad: s.norms(elements),
    }
}
