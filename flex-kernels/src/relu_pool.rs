//! ReLU of a k×k max-pool (stride k, no padding) and each window's winner, in one pass over the
//! conv output: the forward half of SimpleModel's fused block (the engine's `conv_relu_pool`) after
//! its conv.
//!
//! Through Flex's ops this was a max-pool that writes each winner's flat index as an i64, a
//! ReLU over the pooled tensor, then four int ops (divide, remainder, multiply, add) and a
//! cast to turn the i64 index into a byte: about a third of a SimpleModel step on two cores.
//! Here each window is read once and its output, ReLU'd, and its winner's place (`row · k +
//! col`, one byte) are written together; the values are Flex's (the first of equal maxima
//! wins, as in its pool; ReLU is `max(v, 0)`), bit for bit.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{bf16, f16, Bytes, DType, Shape};
use rayon::prelude::*;

/// `(relu(maxpool_k(z)), positions)` for a conv output `z [n, c, h, w]` in f32, f16 or bf16:
/// the output in `z`'s dtype, shaped `[n, c, h / k, w / k]` (a partial window at the edge is
/// dropped, as without ceil mode), and the winners' places as u8. `None` for other dtypes, a
/// `k` of 0 or whose k² places do not fit a byte, or a shape that is not 4-D.
pub fn relu_max_pool(z: &FlexTensor, k: usize) -> Option<(FlexTensor, FlexTensor)> {
    let dims = z.layout().shape().to_vec();
    if dims.len() != 4 || k == 0 || k * k > 256 {
        return None;
    }
    let g = Geometry {
        planes: dims[0].checked_mul(dims[1])?,
        h: dims[2],
        w: dims[3],
        k,
    };
    let shape = vec![dims[0], dims[1], g.h / k, g.w / k];
    let z = z.to_contiguous();
    let out = match z.dtype() {
        DType::F32 => pool(&g, view::<f32>(&z), |v| v, 0f32),
        DType::F16 => pool(&g, view::<f16>(&z), f16::to_f32, f16::ZERO),
        DType::BF16 => pool(&g, view::<bf16>(&z), bf16::to_f32, bf16::ZERO),
        _ => return None,
    };
    let (values, positions) = out;
    let layout = || Layout::contiguous(Shape::from(shape.clone()));
    Some((
        FlexTensor::new(values, layout(), z.dtype()),
        FlexTensor::new(Bytes::from_elems(positions), layout(), DType::U8),
    ))
}

/// `planes` channel planes of `h × w`, pooled in `k × k` windows.
struct Geometry {
    planes: usize,
    h: usize,
    w: usize,
    k: usize,
}

fn view<T: bytemuck::Pod + burn::tensor::Element>(t: &FlexTensor) -> &[T] {
    &t.storage::<T>()[t.layout().start_offset()..]
}

/// The pooled values (as `Bytes` of `T`) and positions, a plane per rayon task.
fn pool<T: bytemuck::Pod + Send + Sync>(
    g: &Geometry,
    z: &[T],
    widen: impl Fn(T) -> f32 + Sync + Copy,
    zero: T,
) -> (Bytes, Vec<u8>) {
    let pooled = (g.h / g.k) * (g.w / g.k);
    let mut out = vec![zero; g.planes * pooled];
    let mut pos = vec![0u8; g.planes * pooled];
    if pooled > 0 {
        out.par_chunks_mut(pooled)
            .zip(pos.par_chunks_mut(pooled))
            .zip(z.par_chunks(g.h * g.w))
            .for_each(|((out, pos), z)| pool_plane(z, [g.h, g.w, g.k], out, pos, widen, zero));
    }
    (Bytes::from_elems(out), pos)
}

/// One `h × w` plane `z` pooled in `k × k` windows into `out` (ReLU'd) and `pos` (the
/// winners' places), `(h / k) · (w / k)` of each; `k² ≤ 256`.
pub(super) fn pool_plane<T: Copy>(
    z: &[T],
    [h, w, k]: [usize; 3],
    out: &mut [T],
    pos: &mut [u8],
    widen: impl Fn(T) -> f32,
    zero: T,
) {
    let (ho, wo) = (h / k, w / k);
    assert!(z.len() >= h * w && out.len() == ho * wo && pos.len() == out.len());
    let windows = out
        .chunks_exact_mut(wo.max(1))
        .zip(pos.chunks_exact_mut(wo.max(1)));
    for (qy, (out, pos)) in windows.enumerate() {
        let band = &z[qy * k * w..][..k * w];
        for (qx, (o, p)) in out.iter_mut().zip(pos.iter_mut()).enumerate() {
            // Flex's rule: the first place starts the maximum, a strictly greater value
            // replaces it (so a NaN wins only in the first place). Selects, not branches:
            // which place wins is data, and mispredicted branches on it cost more than the
            // comparisons.
            let window = &band[qx * k..];
            let (mut best, mut value, mut at) = (widen(window[0]), window[0], 0usize);
            for a in 0..k {
                for (b, &v) in window[a * w..][..k].iter().enumerate() {
                    let (f, place) = (widen(v), a * k + b);
                    let better = f > best;
                    best = if better { f } else { best };
                    value = if better { v } else { value };
                    at = if better { place } else { at };
                }
            }
            // ReLU as Flex's `max(v, 0)`: a NaN maximum becomes 0.
            *o = if best > 0.0 { value } else { zero };
            // k² ≤ 256 places, checked by the callers.
            *p = at as u8;
        }
    }
}

/// [`pool_plane`] for f32 planes (the fused block's conv output), where the winner's value is
/// the running maximum itself. 2×2 windows, SimpleModel's, take a loop over a row of windows
/// that the compiler turns into vector compares and blends, the same rule place by place.
pub(super) fn pool_plane_f32(z: &[f32], [h, w, k]: [usize; 3], out: &mut [f32], pos: &mut [u8]) {
    if k != 2 {
        return pool_plane(z, [h, w, k], out, pos, |v| v, 0.0);
    }
    let (ho, wo) = (h / 2, w / 2);
    assert!(z.len() >= h * w && out.len() == ho * wo && pos.len() == out.len());
    let windows = out
        .chunks_exact_mut(wo.max(1))
        .zip(pos.chunks_exact_mut(wo.max(1)));
    for (qy, (out, pos)) in windows.enumerate() {
        let (top, bottom) = (&z[2 * qy * w..][..2 * wo], &z[(2 * qy + 1) * w..][..2 * wo]);
        let rows = top.chunks_exact(2).zip(bottom.chunks_exact(2));
        for ((o, p), (t, b)) in out.iter_mut().zip(pos.iter_mut()).zip(rows) {
            let (mut best, mut at) = (t[0], 0u8);
            for (place, v) in [(1u8, t[1]), (2, b[0]), (3, b[1])] {
                let better = v > best;
                best = if better { v } else { best };
                at = if better { place } else { at };
            }
            *o = if best > 0.0 { best } else { 0.0 };
            *p = at;
        }
    }
}
