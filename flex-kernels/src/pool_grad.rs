//! The weight and bias gradients of conv → ReLU → k×k max-pool, read straight off the pooled
//! output's gradient, for a block whose input needs no gradient (SimpleModel's first layer).
//!
//! Through the backend's ops, backward unpools the gradient to full resolution (four times
//! the pooled size, zero at three places of every window) and Flex's conv weight gradient
//! then copies it transposed and makes its own scratch; in half precision gemm widens both to
//! f32 as well. Only one place per window has a gradient, so here each surviving window adds
//! its gradient times the k_h×k_w input patch at its winner into the weight gradient: no
//! full-resolution tensor, a quarter of the multiply-adds, every sum in f32 (half inputs are
//! widened value by value).
//!
//! ```text
//! for each image, output channel c, pooled place q with out > 0:
//!     g = dout[q];  (y, x) = winner of q's window
//!     db[c] += g;   dw[c, ·, ·, ·] += g · x[·, y − pad .. y − pad + k_h, x − pad .. x − pad + k_w]
//! ```

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Bytes, DType, Shape};
use rayon::prelude::*;

use super::values::{supported, widen_into};

/// `[dw, db]` (f32, `kernel`'s shape and `[c_out]`) of the block `relu(maxpool_k(conv(x) +
/// b))` whose output `out` got the gradient `dout`, with `positions` the winners' places in
/// their windows (`row · k + col`, u8). `None` for what this does not cover (a stride or
/// dilation other than 1, groups, other dtypes, shapes that do not match): the caller takes
/// the backend's ops.
pub fn conv_relu_pool_param_grads(
    x: &FlexTensor,
    out: &FlexTensor,
    dout: &FlexTensor,
    positions: &FlexTensor,
    kernel: [usize; 4],
    options: &ConvOptions<2>,
    k: usize,
) -> Option<[FlexTensor; 2]> {
    let (xd, od) = (x.layout().shape(), out.layout().shape());
    let [c_out, c_in, kh, kw] = kernel;
    let [ph, pw] = options.padding;
    let covered = options.stride == [1, 1]
        && options.dilation == [1, 1]
        && options.groups == 1
        && xd.len() == 4
        && od.len() == 4
        && dout.layout().shape() == od
        && positions.layout().shape() == od
        && positions.dtype() == DType::U8
        && x.dtype() == out.dtype()
        && x.dtype() == dout.dtype()
        && xd[1] == c_in
        && od[0] == xd[0]
        && od[1] == c_out
        && k > 0
        && k * k <= 256
        && c_in * kh * kw > 0
        && od[2] * od[3] > 0;
    if !covered {
        return None;
    }
    let (n, h, w, ho, wo) = (xd[0], xd[2], xd[3], od[2], od[3]);
    // The conv output the pool read: every winner's place must lie inside it.
    let conv_h = (h + 2 * ph).checked_sub(kh)? + 1;
    let conv_w = (w + 2 * pw).checked_sub(kw)? + 1;
    if ho.checked_mul(k)? > conv_h || wo.checked_mul(k)? > conv_w {
        return None;
    }
    let sizes = Sizes {
        n,
        c_in,
        h,
        w,
        c_out,
        ho,
        wo,
        kh,
        kw,
        ph,
        pw,
        k,
    };
    let (x, out, dout, positions) = (
        x.to_contiguous(),
        out.to_contiguous(),
        dout.to_contiguous(),
        positions.to_contiguous(),
    );
    let pos = &positions.storage::<u8>()[positions.layout().start_offset()..];
    if !supported(&x) {
        return None;
    }
    let (dw, db) = grads(&sizes, [&x, &out, &dout], pos);
    let tensor = |values: Vec<f32>, dims: Vec<usize>| {
        FlexTensor::new(
            Bytes::from_elems(values),
            Layout::contiguous(Shape::from(dims)),
            DType::F32,
        )
    };
    Some([tensor(dw, kernel.to_vec()), tensor(db, vec![c_out])])
}

/// The sizes the kernel walks.
struct Sizes {
    n: usize,
    c_in: usize,
    h: usize,
    w: usize,
    c_out: usize,
    ho: usize,
    wo: usize,
    kh: usize,
    kw: usize,
    ph: usize,
    pw: usize,
    k: usize,
}

/// Images per partial sum. Fixed (not the thread count), so the order of every sum, and the
/// gradient to the bit, does not depend on the machine.
const IMAGES_PER_SUM: usize = 8;

/// The gradients, in f32: each rayon task sums a run of [`IMAGES_PER_SUM`] images into its
/// own `dw` and `db`, and the partial sums are added in order. Half-precision tensors are
/// widened an image at a time (F16C, eight values at once, where the CPU has it).
///
/// Per image, the input's k_h×k_w patches at every place of the pooled area are laid out
/// once, a patch's `c_in · k_h · k_w` values in a row (zero where it reaches into the
/// padding), so that each surviving window adds one contiguous row, times its gradient, into
/// its channel's row of `dw`: a loop the compiler vectorises, with no bounds test per tap.
fn grads(s: &Sizes, [x, out, dout]: [&FlexTensor; 3], pos: &[u8]) -> (Vec<f32>, Vec<f32>) {
    let (plane, pooled) = (s.h * s.w, s.ho * s.wo);
    let per_weight = s.c_in * s.kh * s.kw;
    // The pooled area's places: rows ho·k, columns wo·k (inside the conv output, checked).
    let (rows, cols) = (s.ho * s.k, s.wo * s.k);
    let partial = |first: usize| {
        let mut dw = vec![0f32; s.c_out * per_weight];
        let mut db = vec![0f32; s.c_out];
        let mut image = vec![0f32; s.c_in * plane];
        let (mut outs, mut douts) = (vec![0f32; s.c_out * pooled], vec![0f32; s.c_out * pooled]);
        let mut patches = vec![0f32; rows * cols * per_weight];
        for img in first..(first + IMAGES_PER_SUM).min(s.n) {
            widen_into(x, img * s.c_in * plane, &mut image);
            widen_into(out, img * s.c_out * pooled, &mut outs);
            widen_into(dout, img * s.c_out * pooled, &mut douts);
            lay_out_patches(s, &image, &mut patches);
            let planes = outs.chunks_exact(pooled).zip(douts.chunks_exact(pooled));
            let sums = dw.chunks_exact_mut(per_weight).zip(&mut db);
            for (c, ((outc, doutc), (dwc, dbc))) in planes.zip(sums).enumerate() {
                let winners = &pos[(img * s.c_out + c) * pooled..][..pooled];
                for (q, ((&o, &g), &p)) in outc.iter().zip(doutc).zip(winners).enumerate() {
                    // The ReLU's mask: a window whose maximum is not positive gets nothing.
                    if o <= 0.0 || g == 0.0 {
                        continue;
                    }
                    *dbc += g;
                    let p = usize::from(p);
                    let y = (q / s.wo) * s.k + p / s.k;
                    let x0 = (q % s.wo) * s.k + p % s.k;
                    let patch = &patches[(y * cols + x0) * per_weight..][..per_weight];
                    dwc.iter_mut().zip(patch).for_each(|(d, &v)| *d += g * v);
                }
            }
        }
        (dw, db)
    };
    let partials: Vec<(Vec<f32>, Vec<f32>)> = (0..s.n)
        .into_par_iter()
        .step_by(IMAGES_PER_SUM)
        .map(partial)
        .collect();
    let mut sums = partials.into_iter();
    let (mut dw, mut db) = sums
        .next()
        .unwrap_or_else(|| (vec![0f32; s.c_out * per_weight], vec![0f32; s.c_out]));
    for (pdw, pdb) in sums {
        dw.iter_mut().zip(&pdw).for_each(|(a, b)| *a += b);
        db.iter_mut().zip(&pdb).for_each(|(a, b)| *a += b);
    }
    (dw, db)
}

/// Every place `(y, x)` of the pooled area's patch, `image[ci, y + ky − pad, x + kx − pad]` in
/// `(ci, ky, kx)` order (the weight's), zero outside the image, into `patches` row by row.
fn lay_out_patches(s: &Sizes, image: &[f32], patches: &mut [f32]) {
    let per_weight = s.c_in * s.kh * s.kw;
    let cols = s.wo * s.k;
    for (place, patch) in patches.chunks_exact_mut(per_weight).enumerate() {
        let (y, x) = (place / cols, place % cols);
        for ci in 0..s.c_in {
            let channel = &image[ci * s.h * s.w..][..s.h * s.w];
            for ky in 0..s.kh {
                let taps = &mut patch[(ci * s.kh + ky) * s.kw..][..s.kw];
                // Input row y + ky − pad; outside the image is the zero padding.
                let Some(row) = (y + ky).checked_sub(s.ph).filter(|&r| r < s.h) else {
                    taps.fill(0.0);
                    continue;
                };
                for (kx, tap) in taps.iter_mut().enumerate() {
                    *tap = match (x + kx).checked_sub(s.pw).filter(|&c| c < s.w) {
                        Some(col) => channel[row * s.w + col],
                        None => 0.0,
                    };
                }
            }
        }
    }
}
