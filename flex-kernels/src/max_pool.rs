//! Max pooling with indices on the CPU, channels first, computing exactly what Flex's
//! `max_pool2d_with_indices` computes (the same winners, the same `i64` indices into each
//! input plane, so Flex's backward reads them), without its detours: Flex pools every 2-D
//! input as a 3-D one through a generic loop that tests each tap against five bounds, after
//! filling both results with placeholders (SimpleModel's pool took 40 ms of a composed step
//! that way, at batch 128). Here each window's rows are cut to the image once, and a task
//! pools whole planes.
//!
//! Winners as Flex picks them: the first tap inside the image, then any later tap strictly
//! greater (so a NaN wins only as a window's first tap, and ties go to the first).

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use rayon::prelude::*;

use super::channels_last::{channels_first, dims4};
use super::values::{stored, supported, values_in};

/// Output side of a pool along one axis (floor rounding, no dilation), if a window fits.
fn side(size: usize, window: usize, stride: usize, pad: usize) -> Option<usize> {
    let padded = size.checked_add(pad.checked_mul(2)?)?;
    (stride > 0 && window > 0 && pad < window)
        .then(|| padded.checked_sub(window).map(|s| s / stride + 1))
        .flatten()
}

/// `[output, indices]` of a `[n, c, h, w]` max-pool over `window` moved by `stride` on an
/// input padded by `padding` (which never wins): the output in `x`'s dtype, the indices
/// `i64` positions `y · w + x` in the input plane, both channels first. `None` for what
/// Flex's own op should take (other dtypes, empty shapes, windows wider than the padded input).
pub fn max_pool_first(
    x: &FlexTensor,
    window: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> Option<(FlexTensor, FlexTensor)> {
    let [n, c, h, w] = dims4(x)?;
    let ho = side(h, window[0], stride[0], padding[0])?;
    let wo = side(w, window[1], stride[1], padding[1])?;
    let (plane_in, plane_out) = (h.checked_mul(w)?, ho.checked_mul(wo)?);
    let planes = n.checked_mul(c)?;
    planes.checked_mul(plane_in)?;
    if !supported(x) || planes * plane_in * plane_out == 0 {
        return None;
    }
    let x = channels_first(x.clone());
    // A buffer that holds exactly its values, in order (a view is copied once).
    let x = match x.layout().is_contiguous() && x.layout().start_offset() == 0 {
        true => x,
        false => x.to_contiguous(),
    };
    let mut out = vec![0f32; planes * plane_out];
    let mut indices = vec![0i64; planes * plane_out];
    out.par_chunks_mut(plane_out)
        .zip(indices.par_chunks_mut(plane_out))
        .enumerate()
        .for_each_init(Vec::new, |wide, (p, (out, idx))| {
            let plane = values_in(&x, p * plane_in, plane_in, wide);
            for oy in 0..ho {
                // The window's rows inside the image.
                let y0 = (oy * stride[0]).saturating_sub(padding[0]);
                let y1 = (oy * stride[0] + window[0])
                    .saturating_sub(padding[0])
                    .min(h);
                for ox in 0..wo {
                    let x0 = (ox * stride[1]).saturating_sub(padding[1]);
                    let x1 = (ox * stride[1] + window[1])
                        .saturating_sub(padding[1])
                        .min(w);
                    // The first tap inside the image, then any strictly greater one, as
                    // selects (a branch per tap is a coin flip on real activations).
                    let (mut best, mut at) = (plane[y0 * w + x0], y0 * w + x0);
                    for y in y0..y1 {
                        let row = &plane[y * w + x0..y * w + x1];
                        for (i, &v) in (y * w + x0..).zip(row) {
                            let greater = v > best;
                            best = if greater { v } else { best };
                            at = if greater { i } else { at };
                        }
                    }
                    out[oy * wo + ox] = best;
                    idx[oy * wo + ox] = at as i64;
                }
            }
        });
    let shape = vec![n, c, ho, wo];
    let indices = FlexTensor::new(
        Bytes::from_elems(indices),
        Layout::contiguous(Shape::from(shape.clone())),
        DType::I64,
    );
    Some((stored(out, shape, x.dtype()), indices))
}

/// The input gradient of [`max_pool_first`]: each output's gradient added at its winner's
/// place in the `[n, c, h, w]` input (`x_dims`), channels first, in `dout`'s dtype, a plane per
/// task (Flex's backward runs on one thread). `overlapping`: windows share inputs (a stride
/// below the window), so a place can win twice; in f16 each addition is then rounded, as
/// Flex adds in f16, and otherwise sums are made in f32 and rounded once (bf16 as Flex's). A
/// place no window chose gets 0. `None` for other dtypes or shapes.
pub fn max_pool_backward_first(
    x_dims: [usize; 4],
    dout: &FlexTensor,
    indices: &FlexTensor,
    overlapping: bool,
) -> Option<FlexTensor> {
    let [n, c, h, w] = x_dims;
    let [dn, dc, ho, wo] = dims4(dout)?;
    let fits = (dn, dc) == (n, c)
        && dims4(indices) == Some([n, c, ho, wo])
        && indices.dtype() == DType::I64
        && supported(dout);
    let (plane_in, plane_out) = (h.checked_mul(w)?, ho.checked_mul(wo)?);
    if !fits || n * c * plane_in * plane_out == 0 {
        return None;
    }
    let dtype = dout.dtype();
    let dense = |t: FlexTensor| match t.layout().is_contiguous() && t.layout().start_offset() == 0 {
        true => t,
        false => t.to_contiguous(),
    };
    let (dout, indices) = (dense(channels_first(dout.clone())), dense(indices.clone()));
    let idx: &[i64] = indices.storage();
    let round_each = overlapping && dtype == DType::F16;
    Some(super::values::build(
        vec![n, c, h, w],
        plane_in,
        dtype,
        Vec::new,
        |wide, p, dx| {
            dx.fill(0.0);
            let g = values_in(&dout, p * plane_out, plane_out, wide);
            for (&at, &g) in idx[p * plane_out..][..plane_out].iter().zip(g) {
                // Indices this kernel or Flex made: inside the plane; anything else is skipped.
                let Some(v) = usize::try_from(at).ok().and_then(|at| dx.get_mut(at)) else {
                    continue;
                };
                *v += g;
                if round_each {
                    *v = burn::tensor::f16::from_f32(*v).to_f32();
                }
            }
        },
    ))
}
