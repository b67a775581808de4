//! Channels-last activations: the `[n, c, h, w]` tensors MobileNet's fused blocks hand each
//! other on the CPU are laid out in memory as `[n, h, w, c]` (PyTorch's `channels_last`
//! memory format), as strides on Flex's layout, so the shape every caller sees is unchanged.
//!
//! Channels innermost, every kernel of the block works on a `[rows, c]` matrix (`rows =
//! n·h·w`): the pointwise conv and both its gradients are one gemm over the whole batch, the
//! depthwise conv multiplies contiguous channel runs, and batch norm's per-channel sums run
//! down the rows, vectorised across channels, however small the planes. Plane by plane
//! (`[n, c, h, w]` contiguous), MobileNet's last 4×4 and 2×2 planes made every kernel jump
//! between 64-byte pieces, and the depthwise conv transposed each image in and out.
//!
//! Tensors in any other layout (the stem's conv output, the pooling's gradient) are
//! transposed once on entry; Flex's own ops read any strides, so they take these as they are.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::Shape;

/// The strides of a channels-last `[n, c, h, w]` layout, in elements.
fn strides([_, c, h, w]: [usize; 4]) -> Vec<isize> {
    [h * w * c, 1, w * c, c].map(|s| s as isize).to_vec()
}

/// A channels-last layout of shape `dims`, from offset 0.
pub(super) fn layout(dims: [usize; 4]) -> Layout {
    Layout::new(Shape::new(dims), strides(dims), 0)
}

/// The dims of a 4-D tensor.
pub(super) fn dims4(t: &FlexTensor) -> Option<[usize; 4]> {
    let s = t.layout().shape();
    (s.len() == 4).then(|| [s[0], s[1], s[2], s[3]])
}

/// Whether `t` is a 4-D tensor whose buffer holds exactly its values, channels last.
pub(super) fn is_channels_last(t: &FlexTensor) -> bool {
    let Some(dims) = dims4(t) else {
        return false;
    };
    let size = t.bytes().len() / t.dtype().size().max(1);
    t.layout().start_offset() == 0
        && t.layout().strides() == strides(dims).as_slice()
        && size == dims.iter().product::<usize>()
}

/// `t` (4-D) channels last: itself (a shared reference to its buffer), or a transposed copy.
pub(super) fn channels_last(t: &FlexTensor) -> FlexTensor {
    match (is_channels_last(t), dims4(t)) {
        (false, Some(dims)) => t
            .permute(&[0, 2, 3, 1])
            .to_contiguous()
            .with_layout(layout(dims)),
        _ => t.clone(),
    }
}

/// A tensor of shape `dims` whose contiguous buffer was written channels last.
pub(super) fn relabel(t: FlexTensor, dims: [usize; 4]) -> FlexTensor {
    t.with_layout(layout(dims))
}
