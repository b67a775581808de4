//! MobileNet's two convolutions on the CPU, forward and backward: the depthwise 3×3 (one
//! filter per channel) as direct loops over each image's channel planes, and the pointwise
//! 1×1's gradients as one gemm per image.
//!
//! Burn's generic backward runs a depthwise conv's weight gradient as one small convolution
//! per channel group and every input gradient through `conv_transpose2d`, with strided copies
//! around them (about 40% of a MobileNet step on two cores). Here:
//!
//! ```text
//! depthwise   out[c] = Σ_t w[c,t] · x[c] shifted by tap t        (direct, per plane)
//!             dx[c]  = Σ_t w[c,t] · dz[c] shifted back             (direct, per plane)
//!             dw[c,t] = Σ_images Σ_positions dz[c] · x[c] shifted  (direct, per channel)
//! pointwise   dxᵢ = Wᵀ · dzᵢ       dW = Σᵢ dzᵢ · xᵢᵀ                (gemm)
//! ```
//! Arithmetic is f32; half-precision tensors are widened a plane or an image at a time and the
//! result rounded once, so no widened copy of a whole activation exists. Anything else (other
//! strides, dilation, groups, kernel sizes, dtypes) returns `None` and takes Flex's ops.

use std::borrow::Cow;

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{bf16, f16, Bytes, DType, Shape};
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::gemm_f32;

/// Values `start..start + len` of a contiguous float tensor, as f32 (borrowed when f32).
fn values(t: &FlexTensor, start: usize, len: usize) -> Cow<'_, [f32]> {
    let at = t.layout().start_offset() + start;
    let widened = |f: &dyn Fn(&mut [f32])| {
        let mut v = vec![0f32; len];
        f(&mut v);
        Cow::Owned(v)
    };
    match t.dtype() {
        DType::F16 => widened(&|d| t.storage::<f16>()[at..at + len].convert_to_f32_slice(d)),
        DType::BF16 => widened(&|d| t.storage::<bf16>()[at..at + len].convert_to_f32_slice(d)),
        _ => Cow::Borrowed(&t.storage::<f32>()[at..at + len]),
    }
}

fn supported(t: &FlexTensor) -> bool {
    matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

/// A `dtype` tensor of `shape` whose `n` chunks of `per` values are made in f32 by `f(i, out)`
/// (given zeros), in parallel, and rounded chunk by chunk.
fn build(
    shape: Vec<usize>,
    n: usize,
    per: usize,
    dtype: DType,
    f: impl Fn(usize, &mut [f32]) + Sync,
) -> FlexTensor {
    fn narrowed<H: bytemuck::Pod + Send + Sync + burn::tensor::Element>(
        n: usize,
        per: usize,
        zero: H,
        narrow: fn(&[f32], &mut [H]),
        f: &(impl Fn(usize, &mut [f32]) + Sync),
    ) -> Bytes {
        let mut out = vec![zero; n * per];
        out.par_chunks_mut(per.max(1)).enumerate().for_each_init(
            || vec![0f32; per],
            |buf, (i, o)| {
                buf.fill(0.0);
                f(i, buf);
                narrow(buf, o);
            },
        );
        Bytes::from_elems(out)
    }
    let bytes = match dtype {
        DType::F16 => narrowed(n, per, f16::ZERO, |s, d| d.convert_from_f32_slice(s), &f),
        DType::BF16 => narrowed(n, per, bf16::ZERO, |s, d| d.convert_from_f32_slice(s), &f),
        _ => {
            let mut out = vec![0f32; n * per];
            out.par_chunks_mut(per.max(1))
                .enumerate()
                .for_each(|(i, o)| f(i, o));
            Bytes::from_elems(out)
        }
    };
    FlexTensor::new(bytes, Layout::contiguous(Shape::from(shape)), dtype)
}

/// f32 `values` stored as `dtype`, shaped `shape`.
fn stored(values: Vec<f32>, shape: Vec<usize>, dtype: DType) -> FlexTensor {
    let bytes = match dtype {
        DType::F16 => Bytes::from_elems(values.into_iter().map(f16::from_f32).collect::<Vec<_>>()),
        DType::BF16 => {
            Bytes::from_elems(values.into_iter().map(bf16::from_f32).collect::<Vec<_>>())
        }
        _ => Bytes::from_elems(values),
    };
    FlexTensor::new(bytes, Layout::contiguous(Shape::from(shape)), dtype)
}

/// A depthwise conv's geometry: `c` channels, `h×w` in, `ho×wo` out, `k×k` taps.
#[derive(Clone, Copy)]
struct Depthwise {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
    k: usize,
    stride: usize,
    pad: usize,
}

impl Depthwise {
    /// The geometry when `x [n, c, h, w]` and `weight [c, 1, k, k]` make a depthwise conv with
    /// square stride and padding and no dilation, and `out_dims` (if given) match it.
    fn of(x: &FlexTensor, weight: &FlexTensor, o: &ConvOptions<2>) -> Option<Self> {
        let (xd, wd) = (x.layout().shape(), weight.layout().shape());
        let ok = xd.len() == 4
            && wd.len() == 4
            && o.groups == xd[1]
            && o.groups > 1
            && wd[0] == xd[1]
            && wd[1] == 1
            && wd[2] == wd[3]
            && o.stride[0] == o.stride[1]
            && o.stride[0] >= 1
            && o.padding[0] == o.padding[1]
            && o.dilation == [1, 1]
            && supported(x)
            && weight.dtype() == x.dtype();
        if !ok {
            return None;
        }
        let (k, stride, pad) = (wd[2], o.stride[0], o.padding[0]);
        let side = |s: usize| (s + 2 * pad).checked_sub(k).map(|v| v / stride + 1);
        Some(Self {
            n: xd[0],
            c: xd[1],
            h: xd[2],
            w: xd[3],
            ho: side(xd[2])?,
            wo: side(xd[3])?,
            k,
            stride,
            pad,
        })
    }

    /// [`of`](Self::of), when `dz` is also the gradient of that conv's output.
    fn with_gradient(
        x: &FlexTensor,
        weight: &FlexTensor,
        dz: &FlexTensor,
        o: &ConvOptions<2>,
    ) -> Option<Self> {
        let g = Self::of(x, weight, o)?;
        let fits =
            dz.layout().shape().to_vec() == [g.n, g.c, g.ho, g.wo] && dz.dtype() == x.dtype();
        fits.then_some(g)
    }

    /// Output positions `a..b` along an axis of `out` outputs whose input `pos · stride + t −
    /// pad` lies in `0..size`, for tap `t`.
    fn range(&self, t: usize, out: usize, size: usize) -> (usize, usize) {
        // pos · s + t ≥ pad  ⇔  pos ≥ ⌈(pad − t) / s⌉;   pos · s + t − pad < size.
        let a = self.pad.saturating_sub(t).div_ceil(self.stride);
        let b = match (size + self.pad).checked_sub(t) {
            Some(v) if v > 0 => (v - 1) / self.stride + 1,
            _ => 0,
        };
        (a.min(out), b.min(out).max(a.min(out)))
    }

    /// `f(tap weight index, ky, kx, y-range, x-range)` for every tap with a non-empty overlap.
    fn taps(&self, mut f: impl FnMut(usize, usize, usize, (usize, usize), (usize, usize))) {
        for ky in 0..self.k {
            let ys = self.range(ky, self.ho, self.h);
            for kx in 0..self.k {
                let xs = self.range(kx, self.wo, self.w);
                if ys.0 < ys.1 && xs.0 < xs.1 {
                    f(ky * self.k + kx, ky, kx, ys, xs);
                }
            }
        }
    }
}

/// Depthwise conv forward (no bias).
pub(crate) fn depthwise_conv(
    x: &FlexTensor,
    weight: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Depthwise::of(x, weight, o)?;
    let (x, weight) = (x.to_contiguous(), weight.to_contiguous());
    let ws = values(&weight, 0, g.c * g.k * g.k);
    let (plane_in, plane_out) = (g.h * g.w, g.ho * g.wo);
    let shape = vec![g.n, g.c, g.ho, g.wo];
    Some(build(shape, g.n * g.c, plane_out, x.dtype(), |p, out| {
        let input = values(&x, p * plane_in, plane_in);
        let wc = &ws[(p % g.c) * g.k * g.k..][..g.k * g.k];
        g.taps(|t, ky, kx, (y0, y1), (x0, x1)| {
            let wv = wc[t];
            for y in y0..y1 {
                let row = &input[(y * g.stride + ky - g.pad) * g.w..][..g.w];
                let dst = &mut out[y * g.wo..][..g.wo];
                for xo in x0..x1 {
                    dst[xo] += wv * row[xo * g.stride + kx - g.pad];
                }
            }
        });
    }))
}

/// Depthwise conv input gradient: each output gradient spread back over its taps.
pub(crate) fn depthwise_x_backward(
    x: &FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Depthwise::with_gradient(x, weight, dz, o)?;
    let (weight, dz) = (weight.to_contiguous(), dz.to_contiguous());
    let ws = values(&weight, 0, g.c * g.k * g.k);
    let (plane_in, plane_out) = (g.h * g.w, g.ho * g.wo);
    let shape = vec![g.n, g.c, g.h, g.w];
    Some(build(shape, g.n * g.c, plane_in, x.dtype(), |p, dx| {
        let grad = values(&dz, p * plane_out, plane_out);
        let wc = &ws[(p % g.c) * g.k * g.k..][..g.k * g.k];
        g.taps(|t, ky, kx, (y0, y1), (x0, x1)| {
            let wv = wc[t];
            for y in y0..y1 {
                let src = &grad[y * g.wo..][..g.wo];
                let row = &mut dx[(y * g.stride + ky - g.pad) * g.w..][..g.w];
                for xo in x0..x1 {
                    row[xo * g.stride + kx - g.pad] += wv * src[xo];
                }
            }
        });
    }))
}

/// Depthwise conv weight gradient, summed over the batch in f32, in the dtype of `x`.
pub(crate) fn depthwise_weight_backward(
    x: &FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Depthwise::with_gradient(x, weight, dz, o)?;
    let (x, dz) = (x.to_contiguous(), dz.to_contiguous());
    let (plane_in, plane_out, taps) = (g.h * g.w, g.ho * g.wo, g.k * g.k);
    let mut dw = vec![0f32; g.c * taps];
    dw.par_chunks_mut(taps).enumerate().for_each(|(c, dwc)| {
        for img in 0..g.n {
            let p = img * g.c + c;
            let input = values(&x, p * plane_in, plane_in);
            let grad = values(&dz, p * plane_out, plane_out);
            g.taps(|t, ky, kx, (y0, y1), (x0, x1)| {
                let mut acc = 0f32;
                for y in y0..y1 {
                    let row = &input[(y * g.stride + ky - g.pad) * g.w..][..g.w];
                    let src = &grad[y * g.wo..][..g.wo];
                    for xo in x0..x1 {
                        acc += src[xo] * row[xo * g.stride + kx - g.pad];
                    }
                }
                dwc[t] += acc;
            });
        }
    });
    Some(stored(dw, vec![g.c, 1, g.k, g.k], x.dtype()))
}

/// `(n, k_in, m_out, positions)` when `x [n, k, h, w]` and `weight [m, k, 1, 1]` make a
/// pointwise conv (stride 1, no padding, one group) and `dz` is its `[n, m, h, w]` gradient.
fn pointwise(
    x: &FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<(usize, usize, usize, usize)> {
    let (xd, wd, dd) = (
        x.layout().shape(),
        weight.layout().shape(),
        dz.layout().shape(),
    );
    let ok = o.stride == [1, 1]
        && o.padding == [0, 0]
        && o.dilation == [1, 1]
        && o.groups == 1
        && xd.len() == 4
        && wd.len() == 4
        && wd[1] == xd[1]
        && wd[2] == 1
        && wd[3] == 1
        && dd.to_vec() == [xd[0], wd[0], xd[2], xd[3]]
        && supported(x)
        && weight.dtype() == x.dtype()
        && dz.dtype() == x.dtype();
    let dims = ok.then(|| (xd[0], xd[1], wd[0], xd[2] * xd[3]))?;
    // An empty batch, channel set or image has nothing for gemm to do: Flex's ops take it.
    let (n, k, m, s) = dims;
    [n, k, m, s].iter().all(|&d| d > 0).then_some(dims)
}

/// Pointwise conv input gradient: `dxᵢ [k, s] = Wᵀ [k, m] · dzᵢ [m, s]`, an image per task.
pub(crate) fn pointwise_x_backward(
    x: &FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let (n, k, m, s) = pointwise(x, weight, dz, o)?;
    let (weight, dz) = (weight.to_contiguous(), dz.to_contiguous());
    let ws = values(&weight, 0, m * k);
    let shape = x.layout().shape().to_vec();
    Some(build(shape, n, k * s, x.dtype(), |i, dx| {
        let grad = values(&dz, i * m * s, m * s);
        // Wᵀ: element (ci, co) at co · k + ci.
        gemm_f32((k, s, m), dx, false, &ws, (1, k), &grad, (s, 1), false);
    }))
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
    Some(stored(dw, vec![m, k, 1, 1], x.dtype()))
}
