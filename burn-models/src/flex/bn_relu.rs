//! The fused conv → batch norm → ReLU block's batch norm and ReLU on the CPU, with batch norm
//! computed in f32, forward and backward, in a few passes over the activation.
//!
//! ```text
//! forward   pass 1 (per channel)  μ = mean(z)   σ² = mean((z − μ)²)   r = 1/√(σ² + ε)
//!           pass 2 (per plane)    out = relu((z − μ)·(r·γ) + β)            rounded to z's dtype
//! backward  pass 1 (per channel)  y as forward made it   dy = dout·[y > 0]   Σ dy,  Σ dy·x̂
//!           pass 2 (per plane)    dz = γ·r·(dy − mean(dy) − x̂·mean(dy·x̂))  rounded to z's dtype
//! ```
//! Composed from Flex's tensor ops, forward made the cast, the centred input, its square, the
//! scaled and shifted output and the ReLU as whole tensors, one pass each; backward widened an
//! f16 input and its gradient to f32 and made x̂, the mask and the products as whole f32
//! tensors (four f32 copies of the activation at backward's busiest moment). Here a task
//! holds a few planes: nothing larger than the result is made. Per-plane sums run in eight
//! f32 lanes and the planes' sums in f64; masks are bit masks, not branches (a ReLU's mask is
//! a coin flip per value for the branch predictor).

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use rayon::prelude::*;

use super::values::{build, lane_sum, round_through, stored, supported, values, values_in};

/// `[relu(BN(z)), μ, σ², 1/√(σ² + ε)]` for a `[n, c, h, w]` `z` (f32, f16 or bf16) with f32
/// `gamma` and `beta`, batch norm computed in f32: the output in `z`'s dtype, the statistics
/// `[c]` in f32 (σ² biased, as training-mode batch norm normalises with it). The output is
/// `(z − μ)·(r·γ) + β` evaluated as [`Channel::grads`] re-evaluates it for the ReLU's mask.
/// `None` for anything else: the caller takes the composed path.
pub(crate) fn bn_relu_forward(
    z: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    epsilon: f64,
) -> Option<[FlexTensor; 4]> {
    let dims = z.layout().shape().to_vec();
    let ok = supported(z)
        && dims.len() == 4
        && z.layout().is_contiguous()
        && per_channel(&[gamma, beta], dims[1]);
    if !ok {
        return None;
    }
    let (n, c, plane) = (dims[0], dims[1], dims[2] * dims[3]);
    if n * c * plane == 0 {
        return None;
    }
    let [gamma, beta] = [gamma, beta].map(|v| values(v, 0, c).into_owned());
    let count = (n * plane) as f64;

    // Pass 1: each channel's mean, then the mean of squares about it, summed in f64.
    let stats: Vec<(f32, f32)> = (0..c)
        .into_par_iter()
        .map_init(Vec::new, |wide, ch| {
            let planes = |wide: &mut Vec<f32>, f: &mut dyn FnMut(&[f32])| {
                for img in 0..n {
                    f(values_in(z, (img * c + ch) * plane, plane, wide));
                }
            };
            // Each plane summed in f32 lanes, the planes' sums in f64.
            let mut sum = 0f64;
            planes(wide, &mut |v| sum += lane_sum(v.len(), |i| v[i]) as f64);
            let mean = (sum / count) as f32;
            let mut squares = 0f64;
            planes(wide, &mut |v| {
                squares += lane_sum(v.len(), |i| (v[i] - mean) * (v[i] - mean)) as f64;
            });
            (mean, (squares / count) as f32)
        })
        .collect();
    let rstd: Vec<f32> = stats
        .iter()
        .map(|&(_, var)| 1.0 / (var + epsilon as f32).sqrt())
        .collect();

    // Pass 2: each plane normalised, scaled, shifted and rectified, rounded once.
    let out = build(dims, n * c, plane, z.dtype(), Vec::new, |wide, p, out| {
        let ch = p % c;
        let input = values_in(z, p * plane, plane, wide);
        let (mean, scale, shift) = (stats[ch].0, rstd[ch] * gamma[ch], beta[ch]);
        for (o, &x) in out.iter_mut().zip(input.iter()) {
            let y = (x - mean) * scale + shift;
            *o = pass_where(y, y);
        }
    });
    let vector = |v: Vec<f32>| stored(v, vec![c], DType::F32);
    Some([
        out,
        vector(stats.iter().map(|s| s.0).collect()),
        vector(stats.iter().map(|s| s.1).collect()),
        vector(rstd),
    ])
}

/// `[dz, dγ, dβ]` for a `[n, c, h, w]` `z` (f32, f16 or bf16: the conv output batch norm
/// normalised) and `dout` (the ReLU output's gradient, same dtype), with f32 `gamma`, `beta`
/// and the saved f32 per-channel `mean` and `rstd`. `None` for anything else (strided
/// activations, other dtypes or shapes): the caller takes the composed path.
pub(crate) fn bn_relu_backward(
    z: &FlexTensor,
    dout: &FlexTensor,
    [gamma, beta, mean, rstd]: [&FlexTensor; 4],
) -> Option<[FlexTensor; 3]> {
    let dims = z.layout().shape().to_vec();
    let vectors = [gamma, beta, mean, rstd];
    let ok = supported(z)
        && dims.len() == 4
        && dout.dtype() == z.dtype()
        && dout.layout().shape().to_vec() == dims
        && z.layout().is_contiguous()
        && dout.layout().is_contiguous()
        && per_channel(&vectors, dims[1]);
    if !ok {
        return None;
    }
    let (n, c, plane) = (dims[0], dims[1], dims[2] * dims[3]);
    if n * c * plane == 0 {
        return None;
    }
    let [gamma, beta, mean, rstd] = vectors.map(|v| values(v, 0, c).into_owned());
    let channel = |ch: usize| Channel {
        mean: mean[ch],
        rstd: rstd[ch],
        scale: rstd[ch] * gamma[ch],
        beta: beta[ch],
        dtype: z.dtype(),
    };

    // Pass 1: Σ dy and Σ dy·x̂ per channel: each plane in f32 lanes, the planes in f64.
    let sums: Vec<(f64, f64)> = (0..c)
        .into_par_iter()
        .map_init(
            || [(); 4].map(|_| vec![0f32; plane]),
            |[zs, ds, dy, xhat], ch| {
                let (mut s_dy, mut s_dyx) = (0f64, 0f64);
                for img in 0..n {
                    let at = (img * c + ch) * plane;
                    let (z, dout) = (values_in(z, at, plane, zs), values_in(dout, at, plane, ds));
                    channel(ch).grads(z, dout, dy, xhat);
                    s_dy += lane_sum(plane, |i| dy[i]) as f64;
                    s_dyx += lane_sum(plane, |i| dy[i] * xhat[i]) as f64;
                }
                (s_dy, s_dyx)
            },
        )
        .collect();
    let count = (n * plane) as f64;

    // Pass 2: each plane's dz, rounded once into z's dtype.
    let scratch = || [(); 4].map(|_| vec![0f32; plane]);
    let dz = build(
        dims.clone(),
        n * c,
        plane,
        z.dtype(),
        scratch,
        |[zs, ds, dy, xhat], p, out| {
            let ch = p % c;
            let (zs, ds) = (
                values_in(z, p * plane, plane, zs),
                values_in(dout, p * plane, plane, ds),
            );
            let (mean_dy, mean_dyx) = ((sums[ch].0 / count) as f32, (sums[ch].1 / count) as f32);
            let scale = gamma[ch] * rstd[ch];
            channel(ch).grads(zs, ds, dy, xhat);
            for i in 0..plane {
                out[i] = (dy[i] - mean_dy - xhat[i] * mean_dyx) * scale;
            }
        },
    );
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
    dtype: DType,
}

impl Channel {
    /// The gradient the ReLU passed, `dy` (Burn's `relu_backward` zeroes it where y ≤ 0), and
    /// `xhat`, for a plane of `z` and its output gradient `dout`: y as forward made it,
    /// (z − μ)·(r·γ) + β in f32 rounded to the activations' dtype.
    fn grads(&self, z: &[f32], dout: &[f32], dy: &mut [f32], xhat: &mut [f32]) {
        let len = z.len();
        let (dout, dy, xhat) = (&dout[..len], &mut dy[..len], &mut xhat[..len]);
        for i in 0..len {
            let centered = z[i] - self.mean;
            dy[i] = centered * self.scale + self.beta;
            xhat[i] = centered * self.rstd;
        }
        round_through(dy, self.dtype);
        for i in 0..len {
            dy[i] = pass_where(dy[i], dout[i]);
        }
    }
}

/// Whether every vector is a contiguous f32 `[channels]`.
fn per_channel(vectors: &[&FlexTensor], channels: usize) -> bool {
    vectors.iter().all(|v| {
        v.dtype() == DType::F32
            && v.layout().is_contiguous()
            && v.layout().shape().to_vec() == [channels]
    })
}

/// `v` where `y > 0` (or `y` is NaN, which Burn's ReLU passes), else 0: as a bit mask, which
/// the compiler vectorises; a branch per value is a coin flip per value for the predictor.
#[inline]
fn pass_where(y: f32, v: f32) -> f32 {
    let keep = ((y > 0.0 || y.is_nan()) as u32).wrapping_neg();
    f32::from_bits(v.to_bits() & keep)
}
