//! Batch norm computed in a half working dtype (`batch_norm_f32 = false`), op by op as the
//! composed batch norm computes it on Flex's tensor ops: every element-wise result rounded to
//! the working dtype, every mean summed in f32 and rounded once per axis (over the batch,
//! then the rows, then the columns, as one `mean_dim` per axis does). So the lesson of the
//! config (f16's ε is subnormal, small variances lose precision) is the same arithmetic,
//! only not value by value: the composed ops converted every half value to f32 and back one
//! at a time, a pass over the tensor per op (MobileNet with BN in f16 trained at 0.04× the
//! speed of BN in f32). Here a row of channels is computed in f32 and rounded through the
//! half type (F16C where the CPU has it) after each op, in cache.
//!
//! ```text
//! forward   μ = mean(x)   σ² = mean(r(r(x − μ)²))   ρ = r(1/r(√r(σ² + r(ε))))
//!           y = r(r(r(x − μ)·r(ρ·γ)) + β)                               r: round to the dtype
//! backward  x̂ = r(r(x − μ)·ρ)   m₁ = mean(dy)   m₂ = mean(r(dy·x̂))
//!           dx = r(r(r(dy − m₁) − r(x̂·m₂))·r(γ·ρ))   dγ = m₂·count   dβ = m₁·count   (f32)
//! ```

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use rayon::prelude::*;

use super::channels_last::{channels_last, dims4, relabel};
use super::values::{build, round_through, stored, supported, task_rows, values, widen_into};

/// Values of one image a task sums over the batch (whole rows of channels).
const SPAN: usize = 4096;

/// `[BN(x), μ, σ², ρ]` for a `[n, c, h, w]` `x` (f32, f16 or bf16) with `[c]` `gamma` and
/// `beta`, batch norm computed in `work` (f16 or bf16) as the module docs say: the output in
/// `x`'s dtype, channels last, the statistics `[c]` in `work`. `None` for anything else.
pub fn batch_norm_forward_half(
    x: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    work: DType,
    epsilon: f64,
) -> Option<[FlexTensor; 4]> {
    let (dims, [gamma, beta]) = operands(x, [gamma, beta], work)?;
    let c = dims[1];
    let x = channels_last(x);
    let load = Load { t: &x, work };
    let mean = staged_mean(dims, work, |at, buf, _| load.into(at, buf));
    let var = staged_mean(dims, work, |at, buf, _| {
        load.into(at, buf);
        per_row(buf, &mean, work, |v, m| v - m);
        buf.iter_mut().for_each(|v| *v *= *v);
        round_through(buf, work);
    });
    let rstd = rstd_of(&var, epsilon, work);
    let out = normalize(&x, work, [&mean, &rstd, &gamma, &beta]);
    let vector = |v: Vec<f32>| stored(v, vec![c], work);
    Some([relabel(out, dims), vector(mean), vector(var), vector(rstd)])
}

/// Evaluation-mode batch norm in `work` (f16 or bf16) with the running `mean` and `var`:
/// `ρ = r(1/r(√r(var + r(ε))))` and the forward pass's output expression, in `x`'s dtype,
/// channels last. `None` for anything else.
pub fn batch_norm_inference_half(
    x: &FlexTensor,
    [gamma, beta, mean, var]: [&FlexTensor; 4],
    work: DType,
    epsilon: f64,
) -> Option<FlexTensor> {
    let (dims, [gamma, beta, mean, var]) = operands(x, [gamma, beta, mean, var], work)?;
    let rstd = rstd_of(&var, epsilon, work);
    let x = channels_last(x);
    let out = normalize(&x, work, [&mean, &rstd, &gamma, &beta]);
    Some(relabel(out, dims))
}

/// [`batch_norm_forward_half`]'s output again from `x` and the saved `mean` and `rstd` (`[c]`,
/// in `work`): the same bits, for a fused block's backward to rebuild its ReLU's mask. `None`
/// for anything else.
pub fn batch_norm_recompute_half(
    x: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    [mean, rstd]: [&FlexTensor; 2],
    work: DType,
) -> Option<FlexTensor> {
    let (dims, [gamma, beta, mean, rstd]) = operands(x, [gamma, beta, mean, rstd], work)?;
    let x = channels_last(x);
    let out = normalize(&x, work, [&mean, &rstd, &gamma, &beta]);
    Some(relabel(out, dims))
}

/// `[dx, dγ, dβ]` of [`batch_norm_forward_half`] for the output's gradient `dout` (same shape
/// as `x`), from `x`, `gamma` and the saved `mean` and `rstd` (`[c]`): `dx` in `x`'s dtype,
/// channels last; `dγ` and `dβ` in `gamma`'s dtype, made in f32 from the `work` means.
/// `None` for anything else.
pub fn batch_norm_backward_half(
    x: &FlexTensor,
    dout: &FlexTensor,
    gamma: &FlexTensor,
    [mean, rstd]: [&FlexTensor; 2],
    work: DType,
) -> Option<[FlexTensor; 3]> {
    let param = gamma.dtype();
    let (dims, [gamma, mean, rstd]) = operands(x, [gamma, mean, rstd], work)?;
    let c = dims[1];
    if !supported(dout) || dims4(dout)? != dims {
        return None;
    }
    let (x, dout) = (channels_last(x), channels_last(dout));
    let (load_x, load_dy) = (Load { t: &x, work }, Load { t: &dout, work });
    let xhat = |at: usize, buf: &mut [f32]| {
        load_x.into(at, buf);
        per_row(buf, &mean, work, |v, m| v - m);
        per_row(buf, &rstd, work, |v, r| v * r);
    };
    let mean_dy = staged_mean(dims, work, |at, buf, _| load_dy.into(at, buf));
    let mean_dy_xhat = staged_mean(dims, work, |at, buf, scratch| {
        load_dy.into(at, buf);
        scratch.resize(buf.len(), 0.0);
        xhat(at, scratch);
        for (v, xh) in buf.iter_mut().zip(scratch.iter()) {
            *v *= xh;
        }
        round_through(buf, work);
    });
    // r(γ)·ρ: γ is rounded to `work` (by `vector`) as the composed ops cast it.
    let mut scale: Vec<f32> = gamma.iter().zip(&rstd).map(|(g, r)| g * r).collect();
    round_through(&mut scale, work);

    let per = task_rows(c) * c;
    let dx = build(
        dims.to_vec(),
        per,
        x.dtype(),
        Vec::new,
        |scratch, i, out| {
            load_dy.into(i * per, out);
            scratch.resize(out.len(), 0.0);
            xhat(i * per, scratch);
            per_row(out, &mean_dy, work, |v, m| v - m);
            per_row(scratch, &mean_dy_xhat, work, |v, m| v * m);
            for (v, b) in out.iter_mut().zip(scratch.iter()) {
                *v -= b;
            }
            round_through(out, work);
            per_row(out, &scale, work, |v, s| v * s);
        },
    );
    // Σ = mean · count, scaled in f32 so that a half working dtype cannot overflow here.
    let count = (dims[0] * dims[2] * dims[3]) as f32;
    let sum = |m: Vec<f32>| stored(m.iter().map(|v| v * count).collect(), vec![c], param);
    Some([relabel(dx, dims), sum(mean_dy_xhat), sum(mean_dy)])
}

/// `x`'s dims and the per-channel `vectors` cast to `work`, when the kernels take them: a
/// non-empty 4-D f32/f16/bf16 `x`, `[c]` vectors, a half working dtype. `None` otherwise.
fn operands<const K: usize>(
    x: &FlexTensor,
    vectors: [&FlexTensor; K],
    work: DType,
) -> Option<([usize; 4], [Vec<f32>; K])> {
    let dims = dims4(x)?;
    let half = matches!(work, DType::F16 | DType::BF16);
    if !half || !supported(x) || dims.contains(&0) {
        return None;
    }
    let mut values = Vec::with_capacity(K);
    for v in vectors {
        values.push(vector(v, dims[1], work)?);
    }
    Some((dims, values.try_into().ok()?))
}

/// ρ = r(1/r(√r(σ² + r(ε)))) per channel, as the composed ops make it from `var` (in `work`).
fn rstd_of(var: &[f32], epsilon: f64, work: DType) -> Vec<f32> {
    let eps = one(epsilon as f32, work);
    var.iter()
        .map(|&v| one(1.0 / one(one(v + eps, work).sqrt(), work), work))
        .collect()
}

/// `v` rounded to `work`.
fn one(v: f32, work: DType) -> f32 {
    let mut v = [v];
    round_through(&mut v, work);
    v[0]
}

/// A contiguous `[c]` float vector's values cast to `work` (as the composed ops cast every
/// per-channel operand), as f32, or `None`.
fn vector(v: &FlexTensor, c: usize, work: DType) -> Option<Vec<f32>> {
    let ok = supported(v) && v.layout().is_contiguous() && v.layout().shape().to_vec() == [c];
    ok.then(|| {
        let mut v = values(v, 0, c).into_owned();
        round_through(&mut v, work);
        v
    })
}

/// `f(value, vector[channel])` for every value of `rows` (whole rows of channels), rounded to
/// `work`.
fn per_row(rows: &mut [f32], vector: &[f32], work: DType, f: impl Fn(f32, f32) -> f32) {
    for row in rows.chunks_mut(vector.len()) {
        for (v, p) in row.iter_mut().zip(vector) {
            *v = f(*v, *p);
        }
    }
    round_through(rows, work);
}

/// Reads a channels-last tensor's values cast to the working dtype.
#[derive(Clone, Copy)]
struct Load<'a> {
    t: &'a FlexTensor,
    work: DType,
}

impl Load<'_> {
    /// Values `at..at + buf.len()` (in memory order), cast to the working dtype, into `buf`.
    fn into(self, at: usize, buf: &mut [f32]) {
        widen_into(self.t, at, buf);
        if self.t.dtype() != self.work {
            round_through(buf, self.work);
        }
    }
}

/// The per-channel mean of the values `src(at, buf, scratch)` makes at `at..` (whole rows of a
/// channels-last tensor, already in `work`), as `mean_dim` over the batch, then the rows, then
/// the columns computes it: each axis summed in f32 in order, divided and rounded to `work`.
fn staged_mean(
    [n, c, h, w]: [usize; 4],
    work: DType,
    src: impl Fn(usize, &mut [f32], &mut Vec<f32>) + Sync,
) -> Vec<f32> {
    let image = h * w * c;
    let span = (SPAN / c).max(1) * c;
    // Over the batch: per position of an image, the images added in order.
    let mut over_n = vec![0f32; image];
    over_n.par_chunks_mut(span).enumerate().for_each_init(
        || (vec![0f32; span], Vec::new()),
        |(buf, scratch), (j, sum)| {
            let buf = &mut buf[..sum.len()];
            for i in 0..n {
                src(i * image + j * span, buf, scratch);
                for (s, v) in sum.iter_mut().zip(buf.iter()) {
                    *s += v;
                }
            }
            for s in sum.iter_mut() {
                *s /= n as f32;
            }
            round_through(sum, work);
        },
    );
    // Over the rows, then the columns: small, one image's size at most.
    let mut over_h = vec![0f32; w * c];
    for row in over_n.chunks(w * c) {
        for (s, v) in over_h.iter_mut().zip(row) {
            *s += v;
        }
    }
    for s in over_h.iter_mut() {
        *s /= h as f32;
    }
    round_through(&mut over_h, work);
    let mut mean = vec![0f32; c];
    for col in over_h.chunks(c) {
        for (s, v) in mean.iter_mut().zip(col) {
            *s += v;
        }
    }
    for s in mean.iter_mut() {
        *s /= w as f32;
    }
    round_through(&mut mean, work);
    mean
}

/// `r(r(r(x − μ)·r(ρ·γ)) + β)` over a channels-last `x` (the vectors already in `work`), in
/// `x`'s dtype.
fn normalize(x: &FlexTensor, work: DType, [mean, rstd, gamma, beta]: [&[f32]; 4]) -> FlexTensor {
    let dims = dims4(x).expect("a 4-D tensor");
    let c = dims[1];
    let mut scale: Vec<f32> = rstd.iter().zip(gamma).map(|(r, g)| r * g).collect();
    round_through(&mut scale, work);
    let load = Load { t: x, work };
    let per = task_rows(c) * c;
    // Chunks of whole rows of channels, each made in the task's buffer.
    build(
        dims.to_vec(),
        per,
        x.dtype(),
        || (),
        |_, i, out| {
            load.into(i * per, out);
            per_row(out, mean, work, |v, m| v - m);
            per_row(out, &scale, work, |v, s| v * s);
            per_row(out, beta, work, |v, b| v + b);
        },
    )
}
