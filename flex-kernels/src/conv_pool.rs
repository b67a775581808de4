//! The forward pass of SimpleModel's fused block (the engine's `conv_relu_pool`) on the CPU: conv with
//! bias, then ReLU of a k×k max-pool with each window's winner, an image per rayon task.
//!
//! ```text
//! per image:  for each tile of 512 output places:  cols = the places' input patches
//!                                                   z[:, tile] = W · colsᵀ          (gemm)
//!             z += bias;   (out, winners) = relu(maxpool_k(z))
//! ```
//! Flex runs this conv through its generic im2col path, whose patch gathering tests every tap
//! against the padding as a signed 3-D index, and allocates the conv output, the patch tiles
//! and the gemm results for the whole slice. Here the patches are gathered row by row and the
//! conv output of one image lives in the task's scratch until it is pooled. The arithmetic is
//! Flex's im2col path's: the same tap order (ky, kx, channel), the same gemm calls on tiles of
//! 512 places, the bias added after, rounded as Flex rounds each dtype (f16: gemm's f32 sum
//! rounded, then the bias added and rounded; bf16: computed in f32 and rounded once) — so for
//! the shapes Flex sends through that path (more than 16 output channels) the output equals
//! Flex's bit for bit. Half precision is widened an image at a time and computed in f32.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{bf16, f16, Bytes, DType, Shape};
use rayon::prelude::*;

use super::half_slices::Half;
use super::relu_pool::pool_plane_f32;
use super::values::{build, supported, values, widen_into};

/// Output places per gemm call: Flex's tile size, so that gemm sums each place the same way.
const TILE: usize = 512;

/// `(relu(maxpool_k(conv(x, weight) + bias)), winners)` for `x [n, c_in, h, w]` and `weight
/// [c_out, c_in, kh, kw]`, `bias [c_out]` in `x`'s dtype (f32, f16 or bf16): the output `[n, c_out,
/// ho, wo]` in that dtype and the winners' places (`row · k + col`) as u8. `None` for other
/// dtypes, strides, dilations or groups, or shapes that do not match: the caller takes
/// Flex's conv.
pub fn conv_relu_pool_forward(
    x: &FlexTensor,
    weight: &FlexTensor,
    bias: &FlexTensor,
    options: &ConvOptions<2>,
    k: usize,
) -> Option<(FlexTensor, FlexTensor)> {
    let g = Geometry::of(x, weight, bias, options, k)?;
    if !supported(x) {
        return None;
    }
    let (x, weight, bias) = (
        x.to_contiguous(),
        weight.to_contiguous(),
        bias.to_contiguous(),
    );
    Some(forward(&g, [&x, &weight, &bias]))
}

/// `conv(x, weight) + bias`, channels first, for the same operands and geometry as
/// [`conv_relu_pool_forward`] (stride 1, one group): the composed conv layer's forward with
/// the block's arithmetic (Flex's im2col path's: the same bits as Flex's conv for more than 16
/// output channels, and as the fused block's conv before its pool). `None` for anything
/// else.
pub fn conv_bias_first(
    x: &FlexTensor,
    weight: &FlexTensor,
    bias: &FlexTensor,
    options: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Geometry::of(x, weight, bias, options, 1)?;
    if !supported(x) {
        return None;
    }
    let (x, weight, bias) = (
        x.to_contiguous(),
        weight.to_contiguous(),
        bias.to_contiguous(),
    );
    let (taps, plane, conv) = (g.taps(), g.h * g.w, g.ch * g.cw);
    let w_rows = weight_rows(&g, &weight);
    let b = values(&bias, 0, g.c_out);
    let dtype = x.dtype();
    let scratch = || {
        (
            vec![0f32; g.c_in * plane],
            vec![0f32; TILE.min(conv) * taps],
            Round::default(),
        )
    };
    let dims = vec![g.n, g.c_out, g.ch, g.cw];
    Some(build(
        dims,
        g.c_out * conv,
        dtype,
        scratch,
        |(image, cols, round), img, z| {
            widen_into(&x, img * g.c_in * plane, image);
            conv_planes(&g, [image, cols], &w_rows, z);
            for (zc, &b) in z.chunks_exact_mut(conv).zip(b.iter()) {
                bias_rounded(zc, b, dtype, round);
            }
        },
    ))
}

/// The weight as gemm's left operand `[c_out, taps]`, taps in (ky, kx, channel) order.
fn weight_rows(g: &Geometry, weight: &FlexTensor) -> Vec<f32> {
    let taps = g.taps();
    let w = values(weight, 0, g.c_out * taps);
    let mut w_rows = vec![0f32; g.c_out * taps];
    for (co, row) in w_rows.chunks_exact_mut(taps).enumerate() {
        for ci in 0..g.c_in {
            for t in 0..g.kh * g.kw {
                row[t * g.c_in + ci] = w[(co * g.c_in + ci) * g.kh * g.kw + t];
            }
        }
    }
    w_rows
}

/// One image's conv output planes `z [c_out, ch·cw]` (f32, before the bias) from its f32
/// `image`, a tile of places at a time through the `cols` buffer.
fn conv_planes(g: &Geometry, [image, cols]: [&mut [f32]; 2], w_rows: &[f32], z: &mut [f32]) {
    let (taps, conv) = (g.taps(), g.ch * g.cw);
    for first in (0..conv).step_by(TILE) {
        let len = TILE.min(conv - first);
        let rows = &mut cols[..len * taps];
        g.patches(image, first, rows);
        gemm_tile([g.c_out, len, taps], w_rows, rows, &mut z[first..], conv);
    }
}

/// A plane's bias added with Flex's rounding: f16 rounds gemm's sum, then the sum plus the
/// bias; bf16 (computed in f32) the sum plus the bias once.
fn bias_rounded(zc: &mut [f32], b: f32, dtype: DType, round: &mut Round) {
    if dtype == DType::F16 {
        round.through(zc, dtype);
    }
    zc.iter_mut().for_each(|v| *v += b);
    round.through(zc, dtype);
}

/// The sizes the kernel walks: `n` images of `c_in × h × w`, a `c_out × c_in × kh × kw`
/// weight with padding `ph, pw`, its `ch × cw` output pooled in `k × k` windows.
struct Geometry {
    n: usize,
    c_in: usize,
    h: usize,
    w: usize,
    c_out: usize,
    kh: usize,
    kw: usize,
    ph: usize,
    pw: usize,
    ch: usize,
    cw: usize,
    k: usize,
}

impl Geometry {
    fn of(
        x: &FlexTensor,
        weight: &FlexTensor,
        bias: &FlexTensor,
        o: &ConvOptions<2>,
        k: usize,
    ) -> Option<Self> {
        let (xd, wd) = (x.layout().shape(), weight.layout().shape());
        let ok = xd.len() == 4
            && wd.len() == 4
            && bias.layout().shape().to_vec() == [wd[0]]
            && wd[1] == xd[1]
            && weight.dtype() == x.dtype()
            && bias.dtype() == x.dtype()
            && o.stride == [1, 1]
            && o.dilation == [1, 1]
            && o.groups == 1
            && k > 0
            && k * k <= 256;
        if !ok {
            return None;
        }
        // Something to compute: no empty weight, and at least one whole window.
        if wd.contains(&0) {
            return None;
        }
        let [ph, pw] = o.padding;
        let side = |size: usize, pad: usize, taps: usize| {
            size.checked_add(pad.checked_mul(2)?)?
                .checked_sub(taps)?
                .checked_add(1)
        };
        let (ch, cw) = (side(xd[2], ph, wd[2])?, side(xd[3], pw, wd[3])?);
        if ch < k || cw < k {
            return None;
        }
        Some(Self {
            n: xd[0],
            c_in: xd[1],
            h: xd[2],
            w: xd[3],
            c_out: wd[0],
            kh: wd[2],
            kw: wd[3],
            ph,
            pw,
            ch,
            cw,
            k,
        })
    }

    /// Values in one patch: the gemm's inner size.
    fn taps(&self) -> usize {
        self.kh * self.kw * self.c_in
    }

    /// Gathers the input patches of output places `first..first + rows.len() / taps` of one
    /// image (`c_in` planes of `h × w`) into `rows`, a place's taps in (ky, kx, channel)
    /// order, zero in the padding.
    fn patches(&self, image: &[f32], first: usize, rows: &mut [f32]) {
        let plane = self.h * self.w;
        for (i, row) in rows.chunks_exact_mut(self.taps()).enumerate() {
            let (oy, ox) = ((first + i) / self.cw, (first + i) % self.cw);
            for ky in 0..self.kh {
                let taps = &mut row[ky * self.kw * self.c_in..][..self.kw * self.c_in];
                // Input row oy + ky − pad; outside the image is the zero padding.
                let Some(iy) = (oy + ky).checked_sub(self.ph).filter(|&r| r < self.h) else {
                    taps.fill(0.0);
                    continue;
                };
                for (kx, channels) in taps.chunks_exact_mut(self.c_in).enumerate() {
                    match (ox + kx).checked_sub(self.pw).filter(|&c| c < self.w) {
                        Some(ix) => {
                            let at = iy * self.w + ix;
                            for (ci, t) in channels.iter_mut().enumerate() {
                                *t = image[ci * plane + at];
                            }
                        }
                        None => channels.fill(0.0),
                    }
                }
            }
        }
    }
}

/// The block in f32, rounded to `x`'s dtype where Flex's conv rounds.
fn forward(g: &Geometry, [x, weight, bias]: [&FlexTensor; 3]) -> (FlexTensor, FlexTensor) {
    let (taps, plane, conv) = (g.taps(), g.h * g.w, g.ch * g.cw);
    let (ho, wo) = (g.ch / g.k, g.cw / g.k);
    let pooled = ho * wo;
    let w_rows = weight_rows(g, weight);
    let b = values(bias, 0, g.c_out);
    let dtype = x.dtype();
    // One image: its output planes in f32 into `out32`, its winners into `pos`.
    let image = |img: usize, scratch: &mut Scratch, pos: &mut [u8]| {
        let Scratch {
            image,
            cols,
            z,
            round,
            out32,
        } = scratch;
        widen_into(x, img * g.c_in * plane, image);
        conv_planes(g, [image, cols], &w_rows, z);
        let planes = z.chunks_exact_mut(conv).zip(out32.chunks_exact_mut(pooled));
        for (c, ((zc, o), p)) in planes.zip(pos.chunks_exact_mut(pooled)).enumerate() {
            bias_rounded(zc, b[c], dtype, round);
            pool_plane_f32(zc, [g.ch, g.cw, g.k], o, p);
        }
    };
    let scratch = || Scratch {
        image: vec![0f32; g.c_in * plane],
        cols: vec![0f32; TILE.min(conv) * taps],
        z: vec![0f32; g.c_out * conv],
        round: Round::default(),
        out32: vec![0f32; g.c_out * pooled],
    };
    let per_image = g.c_out * pooled;
    let mut pos = vec![0u8; g.n * per_image];
    // Each image's output in `T`, narrowed from its f32 planes (exact: they hold `T` values).
    fn run<T: Send>(
        out: &mut [T],
        pos: &mut [u8],
        per_image: usize,
        scratch: impl Fn() -> Scratch + Sync + Send,
        image: impl Fn(usize, &mut Scratch, &mut [u8]) + Sync + Send,
        narrow: impl Fn(&[f32], &mut [T]) + Sync + Send,
    ) {
        out.par_chunks_mut(per_image.max(1))
            .zip(pos.par_chunks_mut(per_image.max(1)))
            .enumerate()
            .for_each_init(scratch, |s, (img, (out, pos))| {
                image(img, s, pos);
                narrow(&s.out32, out);
            });
    }
    let total = g.n * per_image;
    let bytes = match dtype {
        DType::F16 => {
            let mut out = vec![f16::ZERO; total];
            run(&mut out, &mut pos, per_image, scratch, image, f16::narrow);
            Bytes::from_elems(out)
        }
        DType::BF16 => {
            let mut out = vec![bf16::ZERO; total];
            run(&mut out, &mut pos, per_image, scratch, image, bf16::narrow);
            Bytes::from_elems(out)
        }
        _ => {
            let mut out = vec![0f32; total];
            run(&mut out, &mut pos, per_image, scratch, image, |s, d| {
                d.copy_from_slice(s)
            });
            Bytes::from_elems(out)
        }
    };
    let layout = || Layout::contiguous(Shape::from(vec![g.n, g.c_out, ho, wo]));
    (
        FlexTensor::new(bytes, layout(), dtype),
        FlexTensor::new(Bytes::from_elems(pos), layout(), DType::U8),
    )
}

/// A task's scratch: one image's input (f32), patch tile, conv output and pooled output.
struct Scratch {
    image: Vec<f32>,
    cols: Vec<f32>,
    z: Vec<f32>,
    round: Round,
    out32: Vec<f32>,
}

/// Rounds f32 values to f16 or bf16 and back a slice at a time (F16C where the CPU has it),
/// through a buffer it keeps.
#[derive(Default)]
struct Round {
    f16: Vec<f16>,
    bf16: Vec<bf16>,
}

impl Round {
    /// `v` as `dtype` would hold it (unchanged for f32).
    fn through(&mut self, v: &mut [f32], dtype: DType) {
        match dtype {
            DType::F16 => {
                self.f16.resize(v.len(), f16::ZERO);
                f16::narrow(v, &mut self.f16);
                f16::widen(&self.f16, v);
            }
            DType::BF16 => {
                self.bf16.resize(v.len(), bf16::ZERO);
                bf16::narrow(v, &mut self.bf16);
                bf16::widen(&self.bf16, v);
            }
            _ => {}
        }
    }
}

/// `dst[:, 0..n]` (row stride `dst_rs`) `= lhs [m, k] · rhsᵀ` for `rhs [n, k]`, both
/// row-major: Flex's im2col gemm call, on one thread, through the checked wrapper.
fn gemm_tile([m, n, k]: [usize; 3], lhs: &[f32], rhs: &[f32], dst: &mut [f32], dst_rs: usize) {
    // rhs is read as [k, n]: row stride 1, column stride k.
    crate::gemm::gemm_into(
        (m, n, k),
        (dst, dst_rs),
        false,
        (lhs, (k, 1)),
        (rhs, (1, k)),
        false,
    );
}
