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
use burn::tensor::{bf16, f16, Bytes, DType, Shape};
use rayon::prelude::*;

/// `[dw, db]` (f32, `kernel`'s shape and `[c_out]`) of the block `relu(maxpool_k(conv(x) +
/// b))` whose output `out` got the gradient `dout`, with `positions` the winners' places in
/// their windows (`row · k + col`, u8). `None` for what this does not cover (a stride or
/// dilation other than 1, groups, other dtypes, shapes that do not match): the caller takes
/// the backend's ops.
pub(crate) fn conv_relu_pool_param_grads(
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
        && k * k <= 256;
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
    let (dw, db) = match x.dtype() {
        DType::F32 => grads(&sizes, [&x, &out, &dout], pos, |v: f32| v),
        DType::F16 => grads(&sizes, [&x, &out, &dout], pos, f16::to_f32),
        DType::BF16 => grads(&sizes, [&x, &out, &dout], pos, bf16::to_f32),
        _ => return None,
    };
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

/// The gradients for element type `T`, one output channel per rayon task (each owns its row
/// of `dw` and its `db`, so no two tasks write the same sum).
fn grads<T: bytemuck::Pod + burn::tensor::Element + Sync>(
    s: &Sizes,
    [x, out, dout]: [&FlexTensor; 3],
    pos: &[u8],
    widen: fn(T) -> f32,
) -> (Vec<f32>, Vec<f32>) {
    fn view<T: bytemuck::Pod + burn::tensor::Element>(t: &FlexTensor) -> &[T] {
        &t.storage::<T>()[t.layout().start_offset()..]
    }
    let (xs, outs, douts) = (view::<T>(x), view::<T>(out), view::<T>(dout));
    let (plane, pooled) = (s.h * s.w, s.ho * s.wo);
    let per_weight = s.c_in * s.kh * s.kw;
    let mut dw = vec![0f32; s.c_out * per_weight];
    let mut db = vec![0f32; s.c_out];
    dw.par_chunks_mut(per_weight)
        .zip(db.par_iter_mut())
        .enumerate()
        .for_each(|(c, (dwc, dbc))| {
            for img in 0..s.n {
                let image = &xs[img * s.c_in * plane..][..s.c_in * plane];
                let at = (img * s.c_out + c) * pooled;
                for q in 0..pooled {
                    // The ReLU's mask: a window whose maximum is not positive gets nothing.
                    if widen(outs[at + q]) <= 0.0 {
                        continue;
                    }
                    let g = widen(douts[at + q]);
                    if g == 0.0 {
                        continue;
                    }
                    *dbc += g;
                    let p = usize::from(pos[at + q]);
                    let y = (q / s.wo) * s.k + p / s.k;
                    let x0 = (q % s.wo) * s.k + p % s.k;
                    for ci in 0..s.c_in {
                        let channel = &image[ci * plane..][..plane];
                        for ky in 0..s.kh {
                            // Input row y + ky − pad; outside the image is the zero padding.
                            let Some(row) = (y + ky).checked_sub(s.ph).filter(|&r| r < s.h) else {
                                continue;
                            };
                            let taps = &mut dwc[(ci * s.kh + ky) * s.kw..][..s.kw];
                            for (kx, tap) in taps.iter_mut().enumerate() {
                                if let Some(col) = (x0 + kx).checked_sub(s.pw).filter(|&c| c < s.w)
                                {
                                    *tap += g * widen(channel[row * s.w + col]);
                                }
                            }
                        }
                    }
                }
            }
        });
    (dw, db)
}
