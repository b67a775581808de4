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
use burn::tensor::{Bytes, Shape};
use rayon::prelude::*;

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

/// Whether `t` is a 4-D tensor whose buffer holds exactly its values, `[n, c, h, w]` in order.
pub(super) fn is_channels_first(t: &FlexTensor) -> bool {
    let size = t.bytes().len() / t.dtype().size().max(1);
    dims4(t).is_some()
        && t.layout().is_contiguous()
        && t.layout().start_offset() == 0
        && size == t.layout().num_elements()
}

/// `t` (4-D) channels last: itself (a shared reference to its buffer), or a transposed copy.
pub fn channels_last(t: &FlexTensor) -> FlexTensor {
    let Some(dims @ [n, c, h, w]) = dims4(t).filter(|_| !is_channels_last(t)) else {
        return t.clone();
    };
    // Each image's [c, h·w] planes as [h·w, c] rows; Flex's copy walks any other strides
    // value by value.
    let fast = is_channels_first(t)
        .then(|| transposed(t, (n, c, h * w)))
        .flatten();
    let copy = fast.unwrap_or_else(|| t.permute(&[0, 2, 3, 1]).to_contiguous());
    relabel(copy, dims)
}

/// `t` `[n, c, h, w]` in order, for Flex's ops, which copy any other layout value by value: a
/// transposed copy of a channels-last tensor, else `t` itself.
pub fn channels_first(t: FlexTensor) -> FlexTensor {
    match dims4(&t).filter(|_| is_channels_last(&t)) {
        Some([n, c, h, w]) => transposed(&t, (n, h * w, c)).unwrap_or_else(|| t.to_contiguous()),
        None => t,
    }
}

/// Each of `n` images of `t`'s buffer, `[rows, cols]`, as `[cols, rows]`, into a contiguous
/// tensor of `t`'s shape (which the caller relabels when the result is channels last);
/// `None` for elements of other sizes than 2 and 4 bytes, or a misaligned buffer.
fn transposed(t: &FlexTensor, (n, rows, cols): (usize, usize, usize)) -> Option<FlexTensor> {
    fn images<T: bytemuck::Pod + Send + Sync>(
        src: &[T],
        (n, rows, cols): (usize, usize, usize),
    ) -> Vec<T> {
        let image = rows * cols;
        let mut dst = vec![T::zeroed(); n * image];
        dst.par_chunks_mut(image.max(1))
            .zip(src.par_chunks(image.max(1)))
            .for_each(|(d, s)| {
                // Eight source rows side by side: eight reads, one contiguous run written.
                for r0 in (0..rows).step_by(8) {
                    let r1 = (r0 + 8).min(rows);
                    for col in 0..cols {
                        for r in r0..r1 {
                            d[col * rows + r] = s[r * cols + col];
                        }
                    }
                }
            });
        dst
    }
    // A buffer not aligned to its elements (none of Flex's are) takes Flex's copy.
    let bytes = match t.dtype().size() {
        4 => Bytes::from_elems(images(
            bytemuck::try_cast_slice::<u8, u32>(t.bytes()).ok()?,
            (n, rows, cols),
        )),
        2 => Bytes::from_elems(images(
            bytemuck::try_cast_slice::<u8, u16>(t.bytes()).ok()?,
            (n, rows, cols),
        )),
        _ => return None,
    };
    let shape = Layout::contiguous(t.layout().shape().clone());
    Some(FlexTensor::new(bytes, shape, t.dtype()))
}

/// A tensor of shape `dims` whose contiguous buffer was written channels last.
pub(super) fn relabel(t: FlexTensor, dims: [usize; 4]) -> FlexTensor {
    t.with_layout(layout(dims))
}
