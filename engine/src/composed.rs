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
