//! The fused conv → batch norm → ReLU block's backward through batch norm and the ReLU, for
//! half-precision activations with batch norm kept in f32, in two passes over the saved input.
//!
//! ```text
//! pass 1 (per channel)  y = x̂·γ + β, x̂ = (z − μ)·r   dy = dout·[y > 0]   Σ dy,  Σ dy·x̂
//! pass 2 (per plane)    dz = γ·r·(dy − mean(dy) − x̂·mean(dy·x̂))            rounded to z's dtype
//! ```
//! The composed path (Flex's tensor ops) widens the f16 input and its gradient to f32 and makes
//! x̂, the mask and the products as whole f32 tensors: four f32 copies of the activation at
//! backward's busiest moment. Here only planes are widened, so the pass holds nothing larger
//! than its f16 result. f32 activations keep the composed path: Flex's SIMD kernels are faster
//! there, and they work in place.

use burn::backend::flex::FlexTensor;
use burn::tensor::{bf16, f16, DType};
use rayon::prelude::*;

use super::values::{build, stored, values, widen_into};

/// `[dz, dγ, dβ]` for a `[n, c, h, w]` half-precision `z` (the conv output batch norm
/// normalised) and `dout` (the ReLU output's gradient, same dtype), with f32 `gamma`, `beta`
/// and the saved f32 per-channel `mean` and `rstd`. `None` for anything else (f32 or strided
/// activations, other dtypes or shapes): the caller takes the composed path.
pub(crate) fn bn_relu_backward(
    z: &FlexTensor,
    dout: &FlexTensor,
    [gamma, beta, mean, rstd]: [&FlexTensor; 4],
) -> Option<[FlexTensor; 3]> {
    let dims = z.layout().shape().to_vec();
    let half = matches!(z.dtype(), DType::F16 | DType::BF16);
    let vectors = [gamma, beta, mean, rstd];
    let ok = half
        && dims.len() == 4
        && dout.dtype() == z.dtype()
        && dout.layout().shape().to_vec() == dims
        && z.layout().is_contiguous()
        && dout.layout().is_contiguous()
        && vectors.iter().all(|v| {
            v.dtype() == DType::F32
                && v.layout().is_contiguous()
                && v.layout().shape().to_vec() == [dims[1]]
        });
    let (n, c, plane) = (dims[0], dims[1], dims[2] * dims[3]);
    if !ok || n * c * plane == 0 {
        return None;
    }
    let [gamma, beta, mean, rstd] = vectors.map(|v| values(v, 0, c).into_owned());
    let channel = |ch: usize| Channel {
        mean: mean[ch],
        rstd: rstd[ch],
        scale: rstd[ch] * gamma[ch],
        beta: beta[ch],
        half: z.dtype(),
    };

    // Pass 1: Σ dy and Σ dy·x̂ per channel, in f64, over every image's plane of the channel.
    let sums: Vec<(f64, f64)> = (0..c)
        .into_par_iter()
        .map_init(
            || (vec![0f32; plane], vec![0f32; plane]),
            |(zs, ds), ch| {
                let (mut s_dy, mut s_dyx) = (0f64, 0f64);
                for img in 0..n {
                    let at = (img * c + ch) * plane;
                    widen_into(z, at, zs);
                    widen_into(dout, at, ds);
                    channel(ch).grads(zs, ds, |dy, xhat| {
                        s_dy += dy as f64;
                        s_dyx += (dy * xhat) as f64;
                    });
                }
                (s_dy, s_dyx)
            },
        )
        .collect();
    let count = (n * plane) as f64;

    // Pass 2: each plane's dz, rounded once into z's dtype.
    let dz = build(dims.clone(), n * c, plane, z.dtype(), |p, out| {
        let ch = p % c;
        let (zs, ds) = (values(z, p * plane, plane), values(dout, p * plane, plane));
        let (mean_dy, mean_dyx) = ((sums[ch].0 / count) as f32, (sums[ch].1 / count) as f32);
        let scale = gamma[ch] * rstd[ch];
        let mut out = out.iter_mut();
        channel(ch).grads(&zs, &ds, |dy, xhat| {
            if let Some(o) = out.next() {
                *o = (dy - mean_dy - xhat * mean_dyx) * scale;
            }
        });
    });
    let vector = |f: fn(&(f64, f64)) -> f64| {
        let v = sums.iter().map(|s| f(s) as f32).collect();
        stored(v, vec![c], DType::F32)
    };
    Some([dz, vector(|s| s.1), vector(|s| s.0)])
}

/// One channel's saved statistics and parameters.
struct Channel {
    mean: f32,
    rstd: f32,
    /// r·γ, as forward's `scale_shift` multiplied it.
    scale: f32,
    beta: f32,
    /// The activations' dtype, which forward rounded y to.
    half: DType,
}

impl Channel {
    /// `f(dy, x̂)` for each value of `z` and its output gradient `dout`: y as forward made it,
    /// (z − μ)·(r·γ) + β in f32 rounded to the half dtype, and the gradient the ReLU passed
    /// (Burn's `relu_backward` zeroes it where y ≤ 0).
    fn grads(&self, z: &[f32], dout: &[f32], mut f: impl FnMut(f32, f32)) {
        for (&zv, &dv) in z.iter().zip(dout) {
            let centered = zv - self.mean;
            let y = centered * self.scale + self.beta;
            let y = match self.half {
                DType::F16 => f16::from_f32(y).to_f32(),
                _ => bf16::from_f32(y).to_f32(),
            };
            let dy = if y <= 0.0 { 0.0 } else { dv };
            f(dy, centered * self.rstd);
        }
    }
}
