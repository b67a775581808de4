//! MobileNet's depthwise conv (one k×k filter per channel) on the CPU, forward and backward,
//! an image per rayon task, on [channels-last](super::channels_last) activations.
//!
//! A task copies its image, row by row, into `[h + 2·pad, w + 2·pad, c]` (padded), so
//! every tap at every output place is one multiply-add over a contiguous run of `c` channels
//! against the tap's `c` weights: vectors across channels, however small the plane.
//! MobileNet's last planes are 4×4 and 2×2 with 256 or 512 channels: plane by plane, the
//! per-plane bookkeeping cost more than the arithmetic. The loops are
//! compiled for AVX2 too (`wide_simd!`, in `values.rs`).
//!
//! ```text
//! forward      out[y, x, :]  = Σ_t w[t, :] · in[s·y + ky, s·x + kx, :]      (taps in order)
//! input grad   dx[s·y + ky, s·x + kx, :] += w[t, :] · dz[y, x, :]          (then unpadded)
//! weight grad  dwᵢ[t, :] += dz[y, x, :] · in[s·y + ky, s·x + kx, :]  per image; Σᵢ in order
//! ```
//! Arithmetic is f32; half-precision images are widened as they are laid out and results
//! rounded once. Other geometries (dilation, non-square strides) return `None` for Flex's ops.

use burn::backend::flex::FlexTensor;
use burn::tensor::ops::ConvOptions;
use rayon::prelude::*;

use super::channels_last::{channels_last, relabel};
use super::conv::{rounds_to, weight_grad, weight_values};
use super::values::{build, supported, values_in, wide_simd};

/// A depthwise conv's geometry: `c` channels, `h×w` in, `ho×wo` out, `k×k` taps, the padded
/// input `hp × wp`.
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
    hp: usize,
    wp: usize,
}

impl Depthwise {
    /// The geometry when `x [n, c, h, w]` and `weight [c, 1, k, k]` (in `x`'s dtype or its
    /// f32 [master copy](rounds_to)) make a depthwise conv with square stride and padding and
    /// no dilation.
    fn of(x: &FlexTensor, weight: &FlexTensor, o: &ConvOptions<2>) -> Option<Self> {
        let (xd, wd) = (x.layout().shape(), weight.layout().shape());
        let ok = xd.len() == 4
            && wd.len() == 4
            && o.groups == xd[1]
            && o.groups > 1
            && wd[0] == xd[1]
            && wd[1] == 1
            && wd[2] == wd[3]
            && wd[2] > 0
            && o.stride[0] == o.stride[1]
            && o.stride[0] >= 1
            && o.padding[0] == o.padding[1]
            && o.dilation == [1, 1]
            && supported(x)
            && rounds_to(weight, x.dtype());
        if !ok {
            return None;
        }
        let (k, stride, pad) = (wd[2], o.stride[0], o.padding[0]);
        Self::new([xd[0], xd[1], xd[2], xd[3]], k, stride, pad)
    }

    /// The geometry of `[n, c, h, w]` inputs, with countable phases.
    fn new([n, c, h, w]: [usize; 4], k: usize, stride: usize, pad: usize) -> Option<Self> {
        let padded = |s: usize| s.checked_add(pad.checked_mul(2)?);
        let side = |s: usize| padded(s)?.checked_sub(k).map(|v| v / stride + 1);
        let (hp, wp) = (padded(h)?, padded(w)?);
        // A task's padded image must be countable.
        hp.checked_mul(wp)?.checked_mul(c)?;
        Some(Self {
            n,
            c,
            h,
            w,
            ho: side(h)?,
            wo: side(w)?,
            k,
            stride,
            pad,
            hp,
            wp,
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

    /// Where output `(y, x)` reads tap `(ky, kx)` in the padded image, in channel runs.
    fn at(&self, y: usize, x: usize, ky: usize, kx: usize) -> usize {
        ((y * self.stride + ky) * self.wp + x * self.stride + kx) * self.c
    }

    /// The `[taps, c]` layout of a `[c, taps]` filter bank.
    fn by_tap(&self, ws: &[f32]) -> Vec<f32> {
        let taps = self.k * self.k;
        (0..taps * self.c)
            .map(|i| ws[(i % self.c) * taps + i / self.c])
            .collect()
    }

    /// A task's buffers: the padded image (whose padding stays zero) and room for a widened
    /// image.
    fn scratch(&self) -> Scratch {
        Scratch {
            padded: vec![0.0; self.hp * self.wp * self.c],
            wide: Vec::new(),
        }
    }
}

/// One task's buffers.
struct Scratch {
    /// `[hp, wp, c]`.
    padded: Vec<f32>,
    /// A half-precision image widened.
    wide: Vec<f32>,
}

/// `image [rows, cols, c]` into `padded [.., pitch, c]` at row and column `pad` (the places
/// around it are not written): a row of places is one contiguous run.
fn pad_into(
    image: &[f32],
    (rows, cols, c): (usize, usize, usize),
    pad: usize,
    pitch: usize,
    padded: &mut [f32],
) {
    let run = cols * c;
    for (r, src) in image.chunks_exact(run).take(rows).enumerate() {
        let at = ((r + pad) * pitch + pad) * c;
        padded[at..at + run].copy_from_slice(src);
    }
}

/// The inverse of [`pad_into`]: the `[rows, cols, c]` image at row and column `pad` of
/// `padded [.., pitch, c]`.
fn unpad(
    padded: &[f32],
    (rows, cols, c): (usize, usize, usize),
    pad: usize,
    pitch: usize,
    image: &mut [f32],
) {
    let run = cols * c;
    for (r, dst) in image.chunks_exact_mut(run).take(rows).enumerate() {
        let at = ((r + pad) * pitch + pad) * c;
        dst.copy_from_slice(&padded[at..at + run]);
    }
}

/// Depthwise conv forward (no bias), channels last.
pub fn depthwise_conv(
    x: &FlexTensor,
    weight: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Depthwise::of(x, weight, o)?;
    let (x, weight) = (channels_last(x), weight.to_contiguous());
    let wt = g.by_tap(&weight_values(&weight, x.dtype(), 0, g.c * g.k * g.k));
    let (image_in, image_out, c) = (g.c * g.h * g.w, g.c * g.ho * g.wo, g.c);
    let dims = [g.n, g.c, g.ho, g.wo];
    let scratch = || g.scratch();
    let out = build(dims.to_vec(), image_out, x.dtype(), scratch, |s, i, out| {
        let image = values_in(&x, i * image_in, image_in, &mut s.wide);
        pad_into(image, (g.h, g.w, c), g.pad, g.wp, &mut s.padded);
        out.fill(0.0); // the taps add into it
        taps_forward(g, &wt, &s.padded, out);
    });
    Some(relabel(out, dims))
}

/// Depthwise conv input gradient, channels last: each output gradient spread back over its
/// taps.
///
/// Only the input's shape and dtype are read: `x` is dropped before `dx` is made (so its
/// values can go first when this holds the last reference), or handed back in `Err` when the
/// conv is not one this runs.
pub fn depthwise_x_backward(
    x: FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Result<FlexTensor, FlexTensor> {
    let Some(g) = Depthwise::with_gradient(&x, weight, dz, o) else {
        return Err(x);
    };
    let dtype = x.dtype();
    drop(x);
    let (weight, dz) = (weight.to_contiguous(), channels_last(dz));
    let wt = g.by_tap(&weight_values(&weight, dtype, 0, g.c * g.k * g.k));
    let (image_in, image_out, c) = (g.c * g.h * g.w, g.c * g.ho * g.wo, g.c);
    let dims = [g.n, g.c, g.h, g.w];
    let scratch = || g.scratch();
    let dx = build(dims.to_vec(), image_in, dtype, scratch, |s, i, dx| {
        let grad = values_in(&dz, i * image_out, image_out, &mut s.wide);
        s.padded.fill(0.0);
        taps_backward(g, &wt, grad, &mut s.padded);
        unpad(&s.padded, (g.h, g.w, c), g.pad, g.wp, dx);
    });
    Ok(relabel(dx, dims))
}

/// Depthwise conv weight gradient, summed over the batch in f32 (each image's sum added in
/// image order, so the bits do not depend on the thread count), in the dtype of `x`.
pub fn depthwise_weight_backward(
    x: &FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Depthwise::with_gradient(x, weight, dz, o)?;
    let (x, dz) = (channels_last(x), channels_last(dz));
    let (image_in, image_out, taps, c) = (g.c * g.h * g.w, g.c * g.ho * g.wo, g.k * g.k, g.c);
    let per_image: Vec<Vec<f32>> = (0..g.n)
        .into_par_iter()
        .map_init(
            || (g.scratch(), Vec::new()),
            |(s, wide_dz), i| {
                let image = values_in(&x, i * image_in, image_in, &mut s.wide);
                pad_into(image, (g.h, g.w, c), g.pad, g.wp, &mut s.padded);
                let grad = values_in(&dz, i * image_out, image_out, wide_dz);
                let mut dw = vec![0f32; taps * c];
                taps_weight(g, grad, &s.padded, &mut dw);
                dw
            },
        )
        .collect();
    // [taps, c] per image, summed in image order, then back to the weight's [c, taps].
    let mut sum = vec![0f32; taps * c];
    for dw in &per_image {
        sum.iter_mut().zip(dw).for_each(|(s, v)| *s += v);
    }
    let dw = (0..c * taps)
        .map(|i| sum[(i % taps) * c + i / taps])
        .collect();
    Some(weight_grad(
        dw,
        vec![g.c, 1, g.k, g.k],
        x.dtype(),
        weight.dtype(),
    ))
}

// Each place's taps, one multiply-add over a run of `c` channels per tap, for an image.

wide_simd! {
    /// `out[y, x, :] += Σ_t w[t, :] · padded[s·y + ky, s·x + kx, :]`.
    fn taps_forward(g: Depthwise, wt: &[f32], padded: &[f32], out: &mut [f32]) {
        let c = g.c;
        for (place, acc) in out.chunks_exact_mut(c).enumerate() {
            let (y, x) = (place / g.wo, place % g.wo);
            for (t, w) in wt.chunks_exact(c).enumerate() {
                let src = &padded[g.at(y, x, t / g.k, t % g.k)..][..c];
                for i in 0..c {
                    acc[i] += w[i] * src[i];
                }
            }
        }
    }
}

wide_simd! {
    /// `padded[s·y + ky, s·x + kx, :] += w[t, :] · grad[y, x, :]`.
    fn taps_backward(g: Depthwise, wt: &[f32], grad: &[f32], padded: &mut [f32]) {
        let c = g.c;
        for (place, gv) in grad.chunks_exact(c).enumerate() {
            let (y, x) = (place / g.wo, place % g.wo);
            for (t, w) in wt.chunks_exact(c).enumerate() {
                let dst = &mut padded[g.at(y, x, t / g.k, t % g.k)..][..c];
                for i in 0..c {
                    dst[i] += w[i] * gv[i];
                }
            }
        }
    }
}

wide_simd! {
    /// `dw[t, :] += grad[y, x, :] · padded[s·y + ky, s·x + kx, :]`.
    fn taps_weight(g: Depthwise, grad: &[f32], padded: &[f32], dw: &mut [f32]) {
        let c = g.c;
        for (place, gv) in grad.chunks_exact(c).enumerate() {
            let (y, x) = (place / g.wo, place % g.wo);
            for (t, acc) in dw.chunks_exact_mut(c).enumerate() {
                let src = &padded[g.at(y, x, t / g.k, t % g.k)..][..c];
                for j in 0..c {
                    acc[j] += gv[j] * src[j];
                }
            }
        }
    }
}
