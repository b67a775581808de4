//! Working a batch a slice of images at a time, so that what an op makes for a slice (the
//! full-resolution conv output, a kernel's scratch, a matmul's output) never exists for the
//! whole batch at once. Results of a slice are written into one tensor allocated at the first
//! slice, or summed in f32.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Element, Int, Numeric, Tensor};

use crate::cast::{cast_prim, float, prim};
use crate::kernels::Kernels;

/// Values per slice on the CPU ([`Kernels::slice_values`] of Flex): about 2¹⁶ (256 KiB in f32)
/// of the largest tensor an op makes per slice (one SimpleModel image's conv output).
/// Flex's kernels make scratch in proportion to the batch they get (its conv weight gradient:
/// about twice the conv output; its matmul: a realigning copy of the output), so the fused ops
/// feed them one slice at a time. CubeCL runs the whole batch in one slice, except where the
/// slicing is an op's memory saving ([`bounded_slices`], sized by that saving).
pub const SLICE_VALUES: usize = 1 << 16;

/// Images per slice of a batch of `batch` images of `per_image` values, for slices of at most
/// `limit` values (`None`: the whole batch): at least one image.
fn per_slice(limit: Option<usize>, batch: usize, per_image: usize) -> usize {
    match limit {
        Some(limit) => (limit / per_image.max(1)).clamp(1, batch.max(1)),
        None => batch.max(1),
    }
}

/// `(start, length)` of each slice of a batch of `batch` images of `per_image` values, as
/// `B`'s kernels take them ([`Kernels::slice_values`]): every image in exactly one.
pub(crate) fn slices<B: Kernels>(
    batch: usize,
    per_image: usize,
) -> impl Iterator<Item = (usize, usize)> {
    slices_of(B::slice_values(), batch, per_image)
}

/// [`slices`] for an op whose slicing is its memory saving, not a kernel's tuning: the [fused
/// conv → ReLU → pool block](crate::conv_relu_pool), whose full-resolution tensors (`per_image`
/// values an image) exist a slice at a time, and whose `k`×`k` pool makes its output a k²-th of
/// them: the budget [`bounded_limit`] takes. At least one image a slice.
pub(crate) fn bounded_slices<B: Kernels>(
    batch: usize,
    per_image: usize,
    k: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let budget = batch * per_image / (k * k).max(1);
    slices_of(
        Some(bounded_limit(B::slice_values(), budget)),
        batch,
        per_image,
    )
}

/// Values per slice for [`bounded_slices`]: a backend's own slice size where it has one
/// (`limit`: the CPU's cache size, which the CPU keeps whatever the budget), else `budget`.
/// The fused block's budget is its pooled output for the whole batch, so that its
/// full-resolution tensors never outweigh what it keeps anyway: on CubeCL, k² slices for a k×k
/// pool when k² divides the batch (`batch` slices of one image below k² images). Measured on wgpu (llvmpipe, 2026-12-06, SimpleModel at batch 32; kernel launches
/// per training step in f32, peak reserved in f16-mixed): slices of [`SLICE_VALUES`] (16 of 2
/// images) 741 and 8 MiB; the whole batch at once 57 and 48 MiB (more than the composed
/// layers' 40); these 4 slices of 8 images 126 and 16 MiB.
pub fn bounded_limit(limit: Option<usize>, budget: usize) -> usize {
    limit.unwrap_or(budget).max(1)
}

/// `(start, length)` of each slice of a batch of `batch` images of `per_image` values, for
/// slices of at most `limit` values (`None`: the whole batch), each at least one image.
pub fn slices_of(
    limit: Option<usize>,
    batch: usize,
    per_image: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let per = per_slice(limit, batch, per_image);
    (0..batch)
        .step_by(per)
        .map(move |s| (s, per.min(batch - s)))
}

/// Values in one slice of a batch of `batch` images of `per_image` values, as [`slices`]
/// makes them for slices of at most `limit` values (a family's
/// [`slice_values`](crate::footprint::Family::slice_values), or [`bounded_limit`]'s):
/// what an op that works slice by slice has alive per slice.
pub fn slice_values(limit: Option<usize>, batch: u64, per_image: u64) -> u64 {
    let per = per_slice(limit, batch as usize, per_image as usize) as u64;
    per * per_image
}

/// Images `start..start + len` of a float tensor (a view).
pub(crate) fn rows<B: Backend, const D: usize>(
    t: &FloatTensor<B>,
    start: usize,
    len: usize,
) -> FloatTensor<B> {
    prim(float::<B, D>(t.clone()).narrow(0, start, len))
}

/// Images `start..start + len` of an int tensor (a view).
pub(crate) fn int_rows<B: Backend>(
    t: &IntTensor<B>,
    start: usize,
    len: usize,
) -> Tensor<B, 4, Int> {
    Tensor::<B, 4, Int>::from_primitive(t.clone()).narrow(0, start, len)
}

/// `a + b` in f32, where `a` may not exist yet: half-precision slices are summed without
/// rounding to half at every slice.
pub(crate) fn accumulate<B: Kernels>(
    a: Option<FloatTensor<B>>,
    b: FloatTensor<B>,
) -> FloatTensor<B> {
    let b = cast_prim::<B>(b, DType::F32);
    match a {
        Some(a) => B::float_add(a, b),
        None => b,
    }
}

/// A parameter's gradient summed over slices in f32, as the composed layers would give it:
/// rounded to the `compute` dtype first (so a half-precision gradient that overflows is inf,
/// and the loss scaler skips the step as it would), then in the parameter's dtype `param`.
pub(crate) fn parameter_grad<B: Kernels>(
    sum: FloatTensor<B>,
    compute: DType,
    param: DType,
) -> FloatTensor<B> {
    cast_prim::<B>(cast_prim::<B>(sum, compute), param)
}

/// Writes slice `part` (images `start..`) into `whole`, made at the first slice with the
/// batch's `n` images and the slice's other dimensions and dtype, through
/// [`Kernels::float_write_rows`] (in place where the backend can), so that the whole
/// exists once, not beside a list of its slices.
pub(crate) fn assign<B: Kernels, const D: usize>(
    whole: Option<Tensor<B, D>>,
    n: usize,
    start: usize,
    part: Tensor<B, D>,
) -> Tensor<B, D> {
    let whole = match first(whole, n, &part) {
        Ok(whole) => whole,
        Err(()) => return part, // one slice is the whole
    };
    float(B::float_write_rows(prim(whole), start, prim(part)))
}

/// [`assign`] for int tensors.
pub(crate) fn assign_int<B: Kernels, const D: usize>(
    whole: Option<Tensor<B, D, Int>>,
    n: usize,
    start: usize,
    part: Tensor<B, D, Int>,
) -> Tensor<B, D, Int> {
    let whole = match first(whole, n, &part) {
        Ok(whole) => whole,
        Err(()) => return part,
    };
    let rows = B::int_write_rows(whole.into_primitive(), start, part.into_primitive());
    Tensor::from_primitive(rows)
}

/// `whole`, or at the first slice a tensor for the whole batch; `Err` when the first slice
/// is the whole batch already.
fn first<B: Backend, const D: usize, K>(
    whole: Option<Tensor<B, D, K>>,
    n: usize,
    part: &Tensor<B, D, K>,
) -> Result<Tensor<B, D, K>, ()>
where
    K: Numeric<B>,
    K::Elem: Element,
{
    if let Some(whole) = whole {
        return Ok(whole);
    }
    let mut dims = part.dims();
    if dims[0] == n {
        return Err(());
    }
    dims[0] = n;
    // `full`, not `empty`: Flex makes an empty tensor as a byte buffer and copies it to
    // realign it, so for a moment it would exist twice; `full` allocates it typed (and on a
    // GPU is one fill kernel).
    Ok(Tensor::full(dims, 0, (&part.device(), part.dtype())))
}
