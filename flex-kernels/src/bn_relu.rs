//! The fused conv → batch norm → ReLU block's batch norm and ReLU on the CPU, with batch norm
//! computed in f32, forward and backward, in a few passes over a
//! [channels-last](super::channels_last) activation, seen as `[rows, c]` (`rows = n·h·w`).
//!
//! ```text
//! forward   pass 1 (down the rows)  μ = mean(z)   σ² = mean((z − μ)²)   r = 1/√(σ² + ε)
//!                                   (per run of rows in cache, runs merged: one read)
//!           pass 2 (row by row)     out = relu((z − μ)·(r·γ) + β)          rounded to z's dtype
//! backward  pass 1 (down the rows)  y as forward made it   dy = dout·[y > 0]   Σ dy,  Σ dy·x̂
//!           pass 2 (row by row)     dz = γ·r·(dy − mean(dy) − x̂·mean(dy·x̂))  rounded to z's dtype
//! ```
//! Composed from Flex's tensor ops, forward made the cast, the centred input, its square, the
//! scaled and shifted output and the ReLU as whole tensors, one pass each; backward widened an
//! f16 input and its gradient to f32 and made x̂, the mask and the products as whole f32
//! tensors (four f32 copies of the activation at backward's busiest moment). Here a task
//! holds [a few rows](task_rows): nothing larger than the result is made. Every pass runs along
//! rows of channels, so each statement is a vector across channels; the per-channel sums add
//! `SPAN` rows in f32, and those partial sums in f64, in an order fixed by the shape alone.
//! Masks are bit masks, not branches (a ReLU's mask is a coin flip per value for the branch
//! predictor).

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use rayon::prelude::*;

use super::channels_last::{channels_last, dims4, relabel};
use super::values::{
    build, round_through, stored, supported, task_rows, values, values_in, wide_simd,
};

/// Rows summed in f32 before the sum joins the f64 total.
const SPAN: usize = 64;

/// `[relu(BN(z)), μ, σ², 1/√(σ² + ε)]` for a `[n, c, h, w]` `z` (f32, f16 or bf16) with f32
/// `gamma` and `beta`, batch norm computed in f32: the output in `z`'s dtype, channels last,
/// the statistics `[c]` in f32 (σ² biased, as training-mode batch norm normalises with it).
/// The output is `(z − μ)·(r·γ) + β` evaluated as `forward_row` re-evaluates it for the
/// ReLU's mask. `None` for anything else: the caller takes the composed path.
pub fn bn_relu_forward(
    z: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    epsilon: f64,
) -> Option<[FlexTensor; 4]> {
    batch_norm_forward(z, gamma, beta, epsilon, true)
}

/// [`bn_relu_forward`] with the ReLU (`relu`) or without it: the composed batch-norm layer's
/// forward, `[BN(z), μ, σ², 1/√(σ² + ε)]`.
pub fn batch_norm_forward(
    z: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    epsilon: f64,
    relu: bool,
) -> Option<[FlexTensor; 4]> {
    let dims = dims4(z)?;
    let c = dims[1];
    let rows = dims[0] * dims[2] * dims[3];
    if !(supported(z) && per_channel(&[gamma, beta], c)) || rows * c == 0 {
        return None;
    }
    let [gamma, beta] = [gamma, beta].map(|v| values(v, 0, c).into_owned());
    let z = channels_last(z);
    let count = rows as f64;

    // Pass 1: each channel's mean and variance, in one read of `z`.
    let moments = moments(&z, (rows, c));
    let mean: Vec<f32> = moments.mean.iter().map(|&m| m as f32).collect();
    let var: Vec<f32> = moments.m2.iter().map(|m2| (m2 / count) as f32).collect();
    let rstd: Vec<f32> = var
        .iter()
        .map(|v| 1.0 / (v + epsilon as f32).sqrt())
        .collect();
    let scale: Vec<f32> = rstd.iter().zip(&gamma).map(|(r, g)| r * g).collect();

    // Pass 2: each row normalised, scaled, shifted and rectified, rounded once.
    let per = task_rows(c);
    let out = build(
        dims.to_vec(),
        per * c,
        z.dtype(),
        Vec::new,
        |wide, i, out| {
            let input = values_in(&z, i * per * c, out.len(), wide);
            normalize_rows(input, [&mean, &scale, &beta], relu, out);
        },
    );
    let vector = |v: Vec<f32>| stored(v, vec![c], DType::F32);
    Some([relabel(out, dims), vector(mean), vector(var), vector(rstd)])
}

/// Evaluation-mode batch norm: `(z − μ)·(r·γ) + β` with the running `mean` and `var` (f32
/// `[c]`, r = 1/√(var + ε)), in `z`'s dtype (f32, f16 or bf16) and channels last, computed in
/// f32 and rounded once. `None` for anything else.
pub fn batch_norm_inference(
    z: &FlexTensor,
    [gamma, beta, mean, var]: [&FlexTensor; 4],
    epsilon: f64,
) -> Option<FlexTensor> {
    let dims = dims4(z)?;
    let c = dims[1];
    let rows = dims[0] * dims[2] * dims[3];
    let vectors = [gamma, beta, mean, var];
    if !(supported(z) && per_channel(&vectors, c)) || rows * c == 0 {
        return None;
    }
    let [gamma, beta, mean, var] = vectors.map(|v| values(v, 0, c).into_owned());
    // r·γ as the training kernel and the composed op form it.
    let scale: Vec<f32> = var
        .iter()
        .zip(&gamma)
        .map(|(v, g)| (1.0 / (v + epsilon as f32).sqrt()) * g)
        .collect();
    let z = channels_last(z);
    let per = task_rows(c);
    let out = build(
        dims.to_vec(),
        per * c,
        z.dtype(),
        Vec::new,
        |wide, i, out| {
            let input = values_in(&z, i * per * c, out.len(), wide);
            normalize_rows(input, [&mean, &scale, &beta], false, out);
        },
    );
    Some(relabel(out, dims))
}

/// `[dz, dγ, dβ]` for a `[n, c, h, w]` `z` (f32, f16 or bf16: the conv output batch norm
/// normalised) and `dout` (the ReLU output's gradient, same dtype), with f32 `gamma`, `beta`
/// and the saved f32 per-channel `mean` and `rstd`; `dz` channels last. `None` for anything
/// else (other dtypes or shapes): the caller takes the composed path.
pub fn bn_relu_backward(
    z: &FlexTensor,
    dout: &FlexTensor,
    stats: [&FlexTensor; 4],
) -> Option<[FlexTensor; 3]> {
    batch_norm_backward(z, dout, stats, true)
}

/// [`bn_relu_backward`] with the ReLU (`relu`: `dout` is the ReLU output's gradient) or
/// without it (`dout` is batch norm's output gradient): the composed batch-norm layer's
/// backward, `[dz, dγ, dβ]`.
pub fn batch_norm_backward(
    z: &FlexTensor,
    dout: &FlexTensor,
    [gamma, beta, mean, rstd]: [&FlexTensor; 4],
    relu: bool,
) -> Option<[FlexTensor; 3]> {
    let dims = dims4(z)?;
    let c = dims[1];
    let rows = dims[0] * dims[2] * dims[3];
    let vectors = [gamma, beta, mean, rstd];
    let ok = supported(z)
        && dout.dtype() == z.dtype()
        && dims4(dout) == Some(dims)
        && per_channel(&vectors, c);
    if !ok || rows * c == 0 {
        return None;
    }
    let [gamma, beta, mean, rstd] = vectors.map(|v| values(v, 0, c).into_owned());
    let (z, dout) = (channels_last(z), channels_last(dout));
    let scale: Vec<f32> = rstd.iter().zip(&gamma).map(|(r, g)| r * g).collect();
    let at = Saved {
        stats: [&mean, &scale, &beta, &rstd],
        dtype: z.dtype(),
        relu,
    };

    // Pass 1: Σ dy and Σ dy·x̂ per channel.
    let sums = column_sums::<2, [Vec<f32>; 2]>(&z, (rows, c), |[ds, y], r0, zs, acc| {
        y.resize(c, 0.0);
        add_grads(zs, values_in(&dout, r0 * c, zs.len(), ds), at, y, acc);
    });
    let count = rows as f64;
    let mean_dy: Vec<f32> = sums.iter().map(|s| (s[0] / count) as f32).collect();
    let mean_dyx: Vec<f32> = sums.iter().map(|s| (s[1] / count) as f32).collect();

    // Pass 2: each row's dz, rounded once into z's dtype.
    let scratch = || [Vec::new(), Vec::new(), vec![0f32; c]];
    let per = task_rows(c);
    let dz = build(
        dims.to_vec(),
        per * c,
        z.dtype(),
        scratch,
        |[zs, ds, y], i, out| {
            let len = out.len();
            let (zs, ds) = (
                values_in(&z, i * per * c, len, zs),
                values_in(&dout, i * per * c, len, ds),
            );
            input_grad_rows(zs, ds, at, [&mean_dy, &mean_dyx], y, out);
        },
    );
    let vector = |k: usize| {
        let v = sums.iter().map(|s| s[k] as f32).collect();
        stored(v, vec![c], DType::F32)
    };
    Some([relabel(dz, dims), vector(1), vector(0)])
}

/// Per-channel count, mean and sum of squared deviations from it (M2), in f64.
struct Moments {
    count: f64,
    mean: Vec<f64>,
    m2: Vec<f64>,
}

impl Moments {
    fn new(c: usize) -> Self {
        Self {
            count: 0.0,
            mean: vec![0.0; c],
            m2: vec![0.0; c],
        }
    }

    /// `self` and another part's moments as one (Chan, Golub and LeVeque's pairwise update).
    fn merge(&mut self, count: f64, mean: &[f64], m2: &[f64]) {
        let total = self.count + count;
        if total == 0.0 {
            return;
        }
        let parts = self
            .mean
            .iter_mut()
            .zip(&mut self.m2)
            .zip(mean.iter().zip(m2));
        for ((ma, m2a), (&mb, &m2b)) in parts {
            let delta = mb - *ma;
            *ma += delta * count / total;
            *m2a += m2b + delta * delta * self.count * count / total;
        }
        self.count = total;
    }
}

/// The per-channel [`Moments`] of a channels-last `[rows, c]` tensor in one read: each run of
/// `SPAN` rows (in cache) is summed, then its deviations from that mean and their squares are
/// summed (in f32, as vectors across channels), and the runs' moments merged in f64, runs and
/// rayon tasks in row order (fixed by the shape). (Two passes, the mean and then the squares
/// about it, read the tensor from memory twice.)
fn moments(z: &FlexTensor, (rows, c): (usize, usize)) -> Moments {
    let per = task_rows(c);
    let tasks: Vec<Moments> = (0..rows.div_ceil(per))
        .into_par_iter()
        .map_init(
            || {
                (
                    Vec::new(),
                    vec![0f32; c],
                    vec![0f32; 2 * c],
                    [vec![0f64; c], vec![0f64; c]],
                )
            },
            |(wide, shift, sums, [mean, m2]), t| {
                let mut moments = Moments::new(c);
                let end = ((t + 1) * per).min(rows);
                for r0 in (t * per..end).step_by(SPAN) {
                    let len = SPAN.min(end - r0);
                    let run = values_in(z, r0 * c, len * c, wide);
                    // Deviations from the run's f32 mean are small: their sums give the
                    // run's mean and M2 in f64 without cancellation.
                    shift.fill(0.0);
                    add_rows(run, shift);
                    shift.iter_mut().for_each(|m| *m /= len as f32);
                    sums.fill(0.0);
                    add_deviations(run, shift, sums);
                    let count = len as f64;
                    for j in 0..c {
                        let (d, d2) = (sums[j] as f64, sums[c + j] as f64);
                        mean[j] = shift[j] as f64 + d / count;
                        m2[j] = (d2 - d * d / count).max(0.0);
                    }
                    moments.merge(count, mean, m2);
                }
                moments
            },
        )
        .collect();
    let mut total = Moments::new(c);
    for part in &tasks {
        total.merge(part.count, &part.mean, &part.m2);
    }
    total
}

/// Per-channel sums down a channels-last `[rows, c]` tensor: `add(scratch, first row, rows'
/// values, acc)` adds a run of at most `SPAN` rows (widened to f32) into `acc` (`[K·c]` zeros:
/// `K` sums per channel), with a scratch `S` per rayon task; each run's sums are added in
/// f64, runs in row order. Returns `[c][K]` f64 sums.
fn column_sums<const K: usize, S: Default>(
    z: &FlexTensor,
    (rows, c): (usize, usize),
    add: impl Fn(&mut S, usize, &[f32], &mut [f32]) + Sync,
) -> Vec<[f64; K]> {
    let per = task_rows(c);
    let tasks: Vec<Vec<f64>> = (0..rows.div_ceil(per))
        .into_par_iter()
        .map_init(
            || (S::default(), Vec::new(), vec![0f32; K * c]),
            |(scratch, wide, acc), t| {
                let mut total = vec![0f64; K * c];
                let end = ((t + 1) * per).min(rows);
                for r0 in (t * per..end).step_by(SPAN) {
                    let len = SPAN.min(end - r0);
                    acc.fill(0.0);
                    add(scratch, r0, values_in(z, r0 * c, len * c, wide), acc);
                    total
                        .iter_mut()
                        .zip(acc.iter())
                        .for_each(|(t, &a)| *t += a as f64);
                }
                total
            },
        )
        .collect();
    let mut sums = vec![[0f64; K]; c];
    for total in &tasks {
        for (j, s) in sums.iter_mut().enumerate() {
            for (k, v) in s.iter_mut().enumerate() {
                *v += total[k * c + j];
            }
        }
    }
    sums
}

/// The saved statistics and parameters, per channel: `[μ, r·γ, β, r]` (r·γ as forward
/// multiplied it), and the activations' dtype, which forward rounded y to.
#[derive(Clone, Copy)]
struct Saved<'a> {
    stats: [&'a [f32]; 4],
    dtype: DType,
    /// Whether a ReLU follows (its mask applies to the gradient).
    relu: bool,
}

/// y = (z − μ)·(r·γ) + β for one row, as forward made it (rounded to the activations' dtype):
/// the ReLU's mask.
#[inline(always)]
fn forward_row(z: &[f32], at: Saved<'_>, y: &mut [f32]) {
    let [mean, scale, beta, _] = at.stats;
    let c = mean.len();
    let (z, scale, beta, y) = (&z[..c], &scale[..c], &beta[..c], &mut y[..c]);
    for j in 0..c {
        y[j] = normalized(z[j], mean[j], scale[j], beta[j]);
    }
    if at.dtype != DType::F32 {
        round_through(y, at.dtype);
    }
}

/// One row's gradient of batch norm's output: `g` where the ReLU passed (its mask rebuilt
/// into `y` from the row of `z`), or `g` itself when no ReLU follows.
#[inline(always)]
fn masked<'a>(z: &[f32], g: &'a [f32], at: Saved<'_>, y: &'a mut [f32]) -> &'a [f32] {
    if !at.relu {
        return g;
    }
    forward_row(z, at, y);
    let c = y.len();
    let g = &g[..c];
    for j in 0..c {
        y[j] = pass_where(y[j], g[j]);
    }
    y
}

// The row kernels: `[rows, c]` slices against per-channel `[c]` vectors, each loop a vector
// across channels.

wide_simd! {
    /// `acc[j] += row[j]` for every row of `run`.
    fn add_rows(run: &[f32], acc: &mut [f32]) {
        let c = acc.len();
        for row in run.chunks_exact(c) {
            for j in 0..c {
                acc[j] += row[j];
            }
        }
    }
}

wide_simd! {
    /// `acc[j] += d`, `acc[c + j] += d²` for `d = row[j] − shift[j]`, for every row of `run`.
    fn add_deviations(run: &[f32], shift: &[f32], acc: &mut [f32]) {
        let (sum, squares) = acc.split_at_mut(acc.len() / 2);
        let c = sum.len();
        let (shift, squares) = (&shift[..c], &mut squares[..c]);
        for row in run.chunks_exact(c) {
            for j in 0..c {
                let d = row[j] - shift[j];
                sum[j] += d;
                squares[j] += d * d;
            }
        }
    }
}

wide_simd! {
    /// `out = relu((x − μ)·scale + β)` row by row (without the ReLU unless `relu`).
    fn normalize_rows(x: &[f32], at: [&[f32]; 3], relu: bool, out: &mut [f32]) {
        let [mean, scale, beta] = at;
        let c = mean.len();
        let (scale, beta) = (&scale[..c], &beta[..c]);
        for (o, x) in out.chunks_exact_mut(c).zip(x.chunks_exact(c)) {
            if relu {
                for j in 0..c {
                    let y = normalized(x[j], mean[j], scale[j], beta[j]);
                    o[j] = pass_where(y, y);
                }
            } else {
                for j in 0..c {
                    o[j] = normalized(x[j], mean[j], scale[j], beta[j]);
                }
            }
        }
    }
}

wide_simd! {
    /// `acc[j] += dy[j]`, `acc[c + j] += dy[j]·x̂[j]` over rows of `z` and `dout`: dy the
    /// gradient the ReLU passed (Burn's `relu_backward` zeroes it where y ≤ 0), x̂ = (z − μ)·r.
    /// `y` is a row's buffer.
    fn add_grads(z: &[f32], dout: &[f32], at: Saved<'_>, y: &mut [f32], acc: &mut [f32]) {
        let [mean, _, _, rstd] = at.stats;
        let c = mean.len();
        let (rstd, y) = (&rstd[..c], &mut y[..c]);
        let (sum_dy, sum_dyx) = acc.split_at_mut(c);
        for (z, g) in z.chunks_exact(c).zip(dout.chunks_exact(c)) {
            let dy = masked(z, g, at, y);
            for j in 0..c {
                sum_dy[j] += dy[j];
                sum_dyx[j] += dy[j] * ((z[j] - mean[j]) * rstd[j]);
            }
        }
    }
}

wide_simd! {
    /// `dz = (dy − mean(dy) − x̂·mean(dy·x̂))·(r·γ)` over rows of `z` and `dout`, dy and x̂
    /// as in [`add_grads`]. `y` is a row's buffer.
    fn input_grad_rows(z: &[f32], dout: &[f32], at: Saved<'_>, means: [&[f32]; 2], y: &mut [f32], out: &mut [f32]) {
        let [mean, scale, _, rstd] = at.stats;
        let [mean_dy, mean_dyx] = means;
        let c = mean.len();
        let (scale, rstd, y) = (&scale[..c], &rstd[..c], &mut y[..c]);
        let (mean_dy, mean_dyx) = (&mean_dy[..c], &mean_dyx[..c]);
        let rows = z.chunks_exact(c).zip(dout.chunks_exact(c));
        for ((z, g), o) in rows.zip(out.chunks_exact_mut(c)) {
            let dy = masked(z, g, at, y);
            for j in 0..c {
                let xhat = (z[j] - mean[j]) * rstd[j];
                o[j] = (dy[j] - mean_dy[j] - xhat * mean_dyx[j]) * scale[j];
            }
        }
    }
}

/// `(z − μ)·(r·γ) + β`: batch norm's output before the ReLU, one expression for forward and
/// for backward's re-evaluation of the ReLU's mask, which must agree bit for bit.
#[inline(always)]
fn normalized(z: f32, mean: f32, scale: f32, beta: f32) -> f32 {
    (z - mean) * scale + beta
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
