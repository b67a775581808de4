//! MobileNet's pointwise (1×1) convolution on the CPU, forward and both gradients, as gemm
//! products over the whole batch of [channels-last](super::channels_last) activations; and
//! what the direct conv kernels share (the master weight rounded as it is read, the weight
//! gradient stored in the master's dtype). The depthwise conv has [its own
//! file](super::depthwise).
//!
//! Burn's generic backward runs every input gradient through `conv_transpose2d`, with strided
//! copies around it. Here, with `X [n·h·w, k]` and `Z [n·h·w, m]` the activations' rows:
//!
//! ```text
//! forward   Z = X · Wᵀ        input grad   dX = dZ · W        weight grad   dW = dZᵀ · X
//! ```
//! Arithmetic is f32; half-precision tensors are widened a task's rows (or a band of the
//! weight) at a time and the result rounded once, so no widened copy of a whole activation
//! exists. Anything else (other strides, padding, groups, dtypes) returns `None` and takes
//! Flex's ops.

use std::borrow::Cow;

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{bf16, f16, Bytes, DType, Shape};
use rayon::prelude::*;

use super::channels_last::{channels_last, relabel};
use super::half_slices::Half;
use super::values::{
    build, round_through, stored, supported, task_rows, values, values_in, widen_into,
};
use crate::gemm::{gemm_into, gemm_new};

/// Whether a backward kernel takes `weight` for a conv computed in `dtype`: the weight in that
/// dtype, or its f32 master copy, which forward rounded to `dtype` (the kernels round it as
/// they read it, so no half copy of it is made for backward).
pub(super) fn rounds_to(weight: &FlexTensor, dtype: DType) -> bool {
    weight.dtype() == dtype || weight.dtype() == DType::F32
}

/// Weight values `start..start + len` as f32, rounded to `dtype` as forward's cast rounded them
/// (borrowed when nothing changes).
pub(super) fn weight_values(
    w: &FlexTensor,
    dtype: DType,
    start: usize,
    len: usize,
) -> Cow<'_, [f32]> {
    let mut v = values(w, start, len);
    if w.dtype() != dtype {
        round_through(v.to_mut(), dtype);
    }
    v
}

/// A weight gradient summed in f32 for a conv computed in `dtype`, as that conv would have
/// returned it (rounded to `dtype`), stored in the weight's own dtype `master`.
pub(super) fn weight_grad(
    mut dw: Vec<f32>,
    shape: Vec<usize>,
    dtype: DType,
    master: DType,
) -> FlexTensor {
    if master != dtype {
        round_through(&mut dw, dtype);
    }
    stored(dw, shape, master)
}

/// `(n, k_in, m_out, positions)` when `x [n, k, h, w]` and `weight [m, k, 1, 1]` (in `x`'s
/// dtype or its f32 [master copy](rounds_to)) make a pointwise conv (stride 1, no padding, one
/// group) whose output `[n, m, h, w]` has a countable size. An empty batch, channel set or
/// image has nothing for gemm to do: `None`, and Flex's ops take it.
pub(super) fn pointwise_dims(
    x: &FlexTensor,
    weight: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<(usize, usize, usize, usize)> {
    let (xd, wd) = (x.layout().shape(), weight.layout().shape());
    let ok = o.stride == [1, 1]
        && o.padding == [0, 0]
        && o.dilation == [1, 1]
        && o.groups == 1
        && xd.len() == 4
        && wd.len() == 4
        && wd[1] == xd[1]
        && wd[2] == 1
        && wd[3] == 1
        && supported(x)
        && rounds_to(weight, x.dtype());
    if !ok {
        return None;
    }
    let (n, k, m, s) = (xd[0], xd[1], wd[0], xd[2].checked_mul(xd[3])?);
    n.checked_mul(m)?.checked_mul(s)?;
    [n, k, m, s].iter().all(|&d| d > 0).then_some((n, k, m, s))
}

/// [`pointwise_dims`], when `dz` is also the `[n, m, h, w]` gradient of that conv's output.
fn pointwise(
    x: &FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<(usize, usize, usize, usize)> {
    let dims = pointwise_dims(x, weight, o)?;
    let (xd, dd) = (x.layout().shape(), dz.layout().shape());
    let fits = dd.to_vec() == [xd[0], dims.2, xd[2], xd[3]] && dz.dtype() == x.dtype();
    fits.then_some(dims)
}

/// Weight elements read for a band of output columns when the weight must be widened or
/// rounded: 256 KiB of f32 (a quarter of MobileNet's widest weight), so no widened copy of a
/// whole weight exists (at 64 KiB, the f16-mixed step widened each task's rows up to 16 times).
const WEIGHT_BAND: usize = 1 << 16;

/// Weight gradients with fewer elements than this are summed in `GROUPS` partial sums side
/// by side (at most 8 × 256 KiB of f32 beside the result); larger ones by gemm's own threads.
/// (The same value as `WEIGHT_BAND`, which this threshold used until it got its own name.)
const GROUPED_WEIGHT: usize = 1 << 16;

/// Weight gradients too small for gemm's threads to share are summed in this many partial
/// sums side by side.
pub(super) const GROUPS: usize = 8;

/// `size` f32 sums over `count` terms (rows, images) in [`GROUPS`] fixed ranges side by side:
/// `add(sum, range)` adds the terms of `range` into its zeroed `sum`, and the group sums are
/// added in range order, so the bits do not depend on the thread count.
pub(super) fn summed_in_groups(
    size: usize,
    count: usize,
    add: impl Fn(&mut [f32], std::ops::Range<usize>) + Sync,
) -> Vec<f32> {
    let per = count.div_ceil(GROUPS);
    let sums: Vec<Vec<f32>> = (0..GROUPS)
        .into_par_iter()
        .map(|g| {
            let mut sum = vec![0f32; size];
            add(&mut sum, (g * per).min(count)..((g + 1) * per).min(count));
            sum
        })
        .collect();
    let mut total = vec![0f32; size];
    for sum in &sums {
        total.iter_mut().zip(sum).for_each(|(t, v)| *t += v);
    }
    total
}

/// A band of the right-hand matrix: its f32 values and their (row, column) strides.
type Band<'a> = (Cow<'a, [f32]>, (usize, usize));

/// `a [rows, inner] · B [inner, cols]` for a channels-last `a` (f32 or half, widened
/// [a few rows](task_rows) per rayon task), the result in `a`'s dtype and channels last,
/// made `band` columns of `B` at a time: `band_of(c0, width)` gives columns `c0..c0 + width`.
fn rows_times<'w>(
    a: &FlexTensor,
    (rows, inner, cols): (usize, usize, usize),
    band: usize,
    band_of: impl Fn(usize, usize) -> Band<'w>,
    dims: [usize; 4],
) -> FlexTensor {
    let lhs = Rows {
        a,
        inner,
        per: task_rows(inner.max(cols)),
    };
    if band >= cols && a.dtype() == DType::F32 {
        // All f32: one product over the whole batch, written straight into the result (gemm
        // packs the weight once and shares the rows' tiles out over its threads).
        let (b, strides) = band_of(0, cols);
        let out = gemm_new(
            (rows, cols, inner),
            (&values(a, 0, rows * inner), (inner, 1)),
            (&b, strides),
            true,
        );
        let out = FlexTensor::new(
            Bytes::from_elems(out),
            Layout::contiguous(Shape::new(dims)),
            DType::F32,
        );
        return relabel(out, dims);
    }
    if band >= cols {
        // Half precision, one band: each task's rows widened, multiplied and rounded into
        // their place in the result (never zeroed first).
        let b = band_of(0, cols);
        let out = build(
            dims.to_vec(),
            lhs.per * cols,
            a.dtype(),
            Vec::new,
            |wide, i, dst| lhs.times(&b, cols, i, wide, dst),
        );
        return relabel(out, dims);
    }
    let shape = (rows * cols, cols, band);
    let bytes = match a.dtype() {
        DType::F16 => banded(f16::ZERO, f16::narrow, shape, &lhs, band_of),
        DType::BF16 => banded(bf16::ZERO, bf16::narrow, shape, &lhs, band_of),
        _ => banded(0f32, |s, d| d.copy_from_slice(s), shape, &lhs, band_of),
    };
    relabel(
        FlexTensor::new(bytes, Layout::contiguous(Shape::new(dims)), a.dtype()),
        dims,
    )
}

/// [`rows_times`]'s values, a band of `B`'s columns at a time: each task's rows times the
/// band in f32, rounded into the band's columns.
fn banded<'w, H: bytemuck::Pod + Send + Sync + burn::tensor::Element>(
    zero: H,
    narrow: fn(&[f32], &mut [H]),
    (len, cols, band): (usize, usize, usize),
    lhs: &Rows<'_>,
    band_of: impl Fn(usize, usize) -> Band<'w>,
) -> Bytes {
    let mut out = vec![zero; len];
    for c0 in (0..cols).step_by(band) {
        let width = band.min(cols - c0);
        let b = band_of(c0, width);
        out.par_chunks_mut(lhs.per * cols)
            .enumerate()
            .for_each_init(
                || (vec![0f32; lhs.per * width], Vec::new()),
                |(buf, wide), (i, o)| {
                    let buf = &mut buf[..o.len() / cols * width];
                    lhs.times(&b, width, i, wide, buf);
                    for (src, dst) in buf.chunks_exact(width).zip(o.chunks_exact_mut(cols)) {
                        narrow(src, &mut dst[c0..c0 + width]);
                    }
                },
            );
    }
    Bytes::from_elems(out)
}

/// The rows of a channels-last activation `a [rows, inner]` (f32 or half) in chunks of
/// `per`, as [`rows_times`] multiplies them.
struct Rows<'a> {
    a: &'a FlexTensor,
    inner: usize,
    per: usize,
}

impl Rows<'_> {
    /// `dst [n, width] = a[chunk i's n rows] · b` (`b` an f32 `[inner, width]` band).
    fn times(
        &self,
        (b, strides): &Band<'_>,
        width: usize,
        i: usize,
        wide: &mut Vec<f32>,
        dst: &mut [f32],
    ) {
        let (n, inner) = (dst.len() / width, self.inner);
        let lhs = values_in(self.a, i * self.per * inner, n * inner, wide);
        gemm_into(
            (n, width, inner),
            (dst, width),
            false,
            (lhs, (inner, 1)),
            (b, *strides),
            false,
        );
    }
}

/// Columns of `B` per band: all of them when the weight is read in place (an f32 weight of
/// an f32 conv), else `WEIGHT_BAND` elements' worth.
fn band(weight: &FlexTensor, dtype: DType, (inner, cols): (usize, usize)) -> usize {
    match weight.dtype() == dtype && dtype == DType::F32 {
        true => cols,
        false => (WEIGHT_BAND / inner).clamp(1, cols),
    }
}

/// A pointwise convolution — `weight [m, k, 1, 1]` over `x [n, k, h, w]`, stride 1, no
/// padding, one group, no bias — on [channels-last](super::channels_last) activations: one
/// product `out [n·h·w, m] = x [n·h·w, k] · Wᵀ` over the whole batch, a few
/// rows (`task_rows`) per rayon task. Half precision is widened a task's rows at a time and
/// rounded once; the weight (in `x`'s dtype or its f32 master copy) is read in place when
/// f32, else widened and rounded a band of output channels at a time. `None` for any other shape or dtype: the caller takes
/// Flex's conv.
pub fn pointwise_conv(
    x: &FlexTensor,
    weight: &FlexTensor,
    options: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let (n, k, m, s) = pointwise_dims(x, weight, options)?;
    let dims = [n, m, x.layout().shape()[2], x.layout().shape()[3]];
    let (x, weight, dtype) = (channels_last(x), weight.to_contiguous(), x.dtype());
    // Wᵀ [k, m]: element (ci, co) at co · k + ci; a band of columns is rows of W.
    let band_of = |c0: usize, width: usize| -> Band<'_> {
        (weight_values(&weight, dtype, c0 * k, width * k), (1, k))
    };
    let band = band(&weight, dtype, (k, m));
    Some(rows_times(&x, (n * s, k, m), band, band_of, dims))
}

/// Pointwise conv input gradient, channels last: `dx [n·h·w, k] = dz [n·h·w, m] · W`.
///
/// Like [`depthwise_x_backward`](super::depthwise_x_backward), reads only the input's shape
/// and dtype, and drops `x` first.
pub fn pointwise_x_backward(
    x: FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Result<FlexTensor, FlexTensor> {
    let Some((n, k, m, s)) = pointwise(&x, weight, dz, o) else {
        return Err(x);
    };
    let (dtype, shape) = (x.dtype(), x.layout().shape().to_vec());
    drop(x);
    let dims = [shape[0], shape[1], shape[2], shape[3]];
    let (weight, dz) = (weight.to_contiguous(), channels_last(dz));
    // W [m, k]: a band of columns ci₀.. is read row by row (widened, rounded like forward).
    let band_of = |c0: usize, width: usize| -> Band<'_> {
        if width == k {
            return (weight_values(&weight, dtype, 0, m * k), (k, 1));
        }
        let mut band = vec![0f32; m * width];
        for (co, dst) in band.chunks_mut(width).enumerate() {
            widen_into(&weight, co * k + c0, dst);
        }
        if weight.dtype() != dtype {
            round_through(&mut band, dtype);
        }
        (Cow::Owned(band), (width, 1))
    };
    let band = band(&weight, dtype, (m, k));
    Ok(rows_times(&dz, (n * s, m, k), band, band_of, dims))
}

/// Pointwise conv weight gradient, channels last: `dW [m, k] = dzᵀ [m, n·h·w] · x [n·h·w, k]`,
/// summed in f32 by gemm and stored in the dtype of `x`, then the weight's.
///
/// A large weight is one gemm over all rows (rayon inside gemm, over the weight's tiles;
/// half precision a few rows at a time, widened). A small one has too few tiles to share:
/// `GROUPS` fixed row ranges run side by side, each into its own sum, added in order (so the
/// bits do not depend on the thread count).
pub fn pointwise_weight_backward(
    x: &FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let (n, k, m, s) = pointwise(x, weight, dz, o)?;
    let (x, dz, rows) = (channels_last(x), channels_last(dz), n * s);
    // dW += dzᵀ[r0..r0 + len] · x[r0..r0 + len]
    let add_rows = |dw: &mut [f32], r0: usize, len: usize, parallel, wide: &mut [Vec<f32>; 2]| {
        let [wx, wd] = wide;
        let (input, grad) = (
            values_in(&x, r0 * k, len * k, wx),
            values_in(&dz, r0 * m, len * m, wd),
        );
        gemm_into(
            (m, k, len),
            (dw, k),
            true,
            (grad, (1, m)),
            (input, (k, 1)),
            parallel,
        );
    };
    let per = match x.dtype() {
        DType::F32 => rows,
        _ => 4 * task_rows(m + k),
    };
    // Groups of at least 256 rows, or one sum.
    let dw = if m * k >= GROUPED_WEIGHT || rows < GROUPS * 256 {
        let mut dw = vec![0f32; m * k];
        let mut wide = [Vec::new(), Vec::new()];
        for r0 in (0..rows).step_by(per) {
            add_rows(&mut dw, r0, per.min(rows - r0), true, &mut wide);
        }
        dw
    } else {
        summed_in_groups(m * k, rows, |dw, range| {
            let mut wide = [Vec::new(), Vec::new()];
            for r0 in range.clone().step_by(per) {
                add_rows(dw, r0, per.min(range.end - r0), false, &mut wide);
            }
        })
    };
    Some(weight_grad(dw, vec![m, k, 1, 1], x.dtype(), weight.dtype()))
}
