//! MobileNet's pointwise (1×1) convolution on the CPU, forward for half precision and both
//! gradients, as gemm calls per image; and what the direct conv kernels share (the master
//! weight rounded as it is read, the weight gradient stored in the master's dtype). The
//! depthwise conv has [its own file](super::depthwise).
//!
//! Burn's generic backward runs every input gradient through `conv_transpose2d`, with strided
//! copies around it. Here:
//!
//! ```text
//! pointwise   dxᵢ = Wᵀ · dzᵢ       dW = Σᵢ dzᵢ · xᵢᵀ                (gemm)
//! ```
//! Arithmetic is f32; half-precision tensors are widened an image (or a band of the weight)
//! at a time and the result rounded once, so no widened copy of a whole activation exists.
//! Anything else (other strides, padding, groups, dtypes) returns `None` and takes Flex's ops.

use std::borrow::Cow;

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{bf16, f16, Bytes, DType, Shape};
use rayon::prelude::*;

use super::gemm_f32;
use super::half_slices::Half;
use super::values::{round_through, stored, supported, values, widen_into};

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

/// Pointwise conv forward on half-precision `x [n, k, s]`: `outᵢ [m, s] = W [m, k] · xᵢ [k, s]`
/// with the weight (in `x`'s dtype or its f32 master copy) widened and rounded a band of output
/// channels at a time, each band shared by every image's task, so neither a half nor a widened
/// copy of the whole weight exists. Each image is widened by the task that reads it.
pub(super) fn pointwise_half(
    x: &FlexTensor,
    weight: &FlexTensor,
    (n, k, m, s): (usize, usize, usize, usize),
    shape: Shape,
) -> FlexTensor {
    let dtype = x.dtype();
    let band = (WEIGHT_BAND / k).clamp(1, m);
    let make = |m0: usize, rows: usize, run: &mut dyn FnMut(&BandTask<'_>)| {
        let wt = weight_values(weight, dtype, m0 * k, rows * k);
        run(&|i, out| {
            let input = values(x, i * k * s, k * s);
            gemm_f32((rows, s, k), out, false, &wt, (k, 1), &input, (s, 1), false);
        });
    };
    let bytes = match dtype {
        DType::BF16 => banded(bf16::ZERO, bf16::narrow, (n, m, s), band, &make),
        _ => banded(f16::ZERO, f16::narrow, (n, m, s), band, &make),
    };
    FlexTensor::new(bytes, Layout::contiguous(shape), dtype)
}

/// Weight elements read for a band of the input gradient's channels: 64 KiB of f32.
const WEIGHT_BAND: usize = 1 << 14;

/// Pointwise conv input gradient: `dxᵢ [k, s] = Wᵀ [k, m] · dzᵢ [m, s]`, an image per task.
///
/// An f32 weight for an f32 conv is read in place. Otherwise `Wᵀ` is widened (and a master
/// copy rounded) a band of input channels at a time, each band shared by every image's task,
/// so neither a half nor a widened copy of the whole weight exists.
///
/// Like [`depthwise_x_backward`], reads only the input's shape and dtype, and drops `x` first.
pub(crate) fn pointwise_x_backward(
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
    let (weight, dz) = (weight.to_contiguous(), dz.to_contiguous());
    let band = match weight.dtype() == dtype && dtype == DType::F32 {
        true => k,
        false => (WEIGHT_BAND / m).clamp(1, k),
    };
    let make = |c0: usize, rows: usize, run: &mut dyn FnMut(&BandTask<'_>)| {
        dx_band(&weight, dtype, &dz, (k, m, s), c0, rows, run)
    };
    let bytes = match dtype {
        DType::F16 => banded(f16::ZERO, f16::narrow, (n, k, s), band, &make),
        DType::BF16 => banded(bf16::ZERO, bf16::narrow, (n, k, s), band, &make),
        _ => banded(0f32, |s, d| d.copy_from_slice(s), (n, k, s), band, &make),
    };
    Ok(FlexTensor::new(
        bytes,
        Layout::contiguous(Shape::from(shape)),
        dtype,
    ))
}

/// The work of one band for image `i`: fill its `[rows, s]` f32 gradient rows.
type BandTask<'a> = dyn Fn(usize, &mut [f32]) + Sync + 'a;

/// Makes one band `(first row, rows)`: prepares what the band's tasks share, then hands its
/// per-image task to the runner.
type BandMaker<'a> = dyn Fn(usize, usize, &mut dyn FnMut(&BandTask<'_>)) + 'a;

/// A `[n, k, s]` tensor made `band` channel rows at a time: `make(c0, rows, run)` prepares
/// what the band shares and hands `run` the per-image task that fills the band's f32 rows.
fn banded<H: bytemuck::Pod + Send + Sync + burn::tensor::Element>(
    zero: H,
    narrow: fn(&[f32], &mut [H]),
    (n, k, s): (usize, usize, usize),
    band: usize,
    make: &BandMaker<'_>,
) -> Bytes {
    let mut out = vec![zero; n * k * s];
    for c0 in (0..k).step_by(band) {
        let rows = band.min(k - c0);
        make(c0, rows, &mut |task| {
            out.par_chunks_mut(k * s).enumerate().for_each_init(
                || vec![0f32; rows * s],
                |buf, (i, image)| {
                    task(i, buf);
                    narrow(buf, &mut image[c0 * s..(c0 + rows) * s]);
                },
            );
        });
    }
    Bytes::from_elems(out)
}

/// One band of the pointwise input gradient: `Wᵀ` rows `c0..c0 + rows` (read in place, or
/// widened and rounded to `dtype`), then `dxᵢ[band] = Wᵀ[band] · dzᵢ` per image.
fn dx_band(
    weight: &FlexTensor,
    dtype: DType,
    dz: &FlexTensor,
    (k, m, s): (usize, usize, usize),
    c0: usize,
    rows: usize,
    run: &mut dyn FnMut(&BandTask<'_>),
) {
    // Wᵀ [rows, m]: element (ci, co) at co · k + c0 + ci in place, at co · rows + ci in a band.
    let (wt, strides): (Cow<'_, [f32]>, (usize, usize)) = match rows == k && weight.dtype() == dtype
    {
        true => (weight_values(weight, dtype, 0, m * k), (1, k)),
        false => {
            let mut wt = vec![0f32; m * rows];
            for (co, dst) in wt.chunks_mut(rows).enumerate() {
                widen_into(weight, co * k + c0, dst);
            }
            if weight.dtype() != dtype {
                round_through(&mut wt, dtype);
            }
            (Cow::Owned(wt), (1, rows))
        }
    };
    run(&|i, dx| {
        let grad = values(dz, i * m * s, m * s);
        gemm_f32((rows, s, m), dx, false, &wt, strides, &grad, (s, 1), false);
    });
}

/// Pointwise conv weight gradient: `dW [m, k] = Σᵢ dzᵢ [m, s] · xᵢᵀ [s, k]`, summed in f32 by
/// gemm into one buffer, in the dtype of `x`.
pub(crate) fn pointwise_weight_backward(
    x: &FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let (n, k, m, s) = pointwise(x, weight, dz, o)?;
    let (x, dz) = (x.to_contiguous(), dz.to_contiguous());
    let mut dw = vec![0f32; m * k];
    for i in 0..n {
        let (input, grad) = (values(&x, i * k * s, k * s), values(&dz, i * m * s, m * s));
        // xᵢᵀ: element (p, ci) at ci · s + p.
        gemm_f32(
            (m, k, s),
            &mut dw,
            i > 0,
            &grad,
            (s, 1),
            &input,
            (1, s),
            true,
        );
    }
    Some(weight_grad(dw, vec![m, k, 1, 1], x.dtype(), weight.dtype()))
}
