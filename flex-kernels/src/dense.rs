//! A dense (one group) k×k convolution on the CPU, forward and both gradients, as im2col +
//! gemm an image per rayon task: MobileNet's stem (3×3, 3 → 32·α channels), SimpleModel's
//! conv, and every conv of ResNet but its 1×1 shortcuts. The fused blocks take the output
//! [channels last](super::channels_last); the composed layers take it channels first, with
//! the bias added (each image's product moved into its planes from the task's buffer).
//!
//! Each task lays its image out as a patch matrix `P [places, cin·taps]` (column `ci·taps +
//! t`, the order of the weight's own `[cout, cin, kh, kw]` rows, so no product permutes the
//! weight), the same matrix from a channels-last or a channels-first image, so gemm's sums
//! do not depend on the layout:
//!
//! ```text
//! forward      Z [places, cout] = P · Wᵀ
//! weight grad  dW [cout, cin·taps] = Σᵢ dZᵢᵀ · Pᵢ      (per image, summed in a fixed order)
//! input grad   dPᵢᵀ [cin·taps, places] = Wᵀ · dZᵢᵀ,  dXᵢ = col2im(dPᵢᵀ)   (channels first)
//! ```
//! Flex's conv made its output channels first (transposed afterwards for the block), and its
//! weight gradient reshaped both operands through its strided copy, value by value: the stem
//! was 8% of an f32 MobileNet step for 2% of its arithmetic, and its input gradient (through
//! `conv_transpose2d`) made ResNet's composed step slower than its forward by far. Arithmetic
//! is f32; half-precision images are widened as they are laid out and results rounded once.
//! Any other geometry (dilation, groups) stays with Flex's ops.

use burn::backend::flex::FlexTensor;
use burn::tensor::ops::ConvOptions;
use burn::tensor::DType;

use super::channels_last::{channels_last, is_channels_first, relabel};
use super::conv::{rounds_to, summed_in_groups, weight_grad, weight_values, GROUPS};
use super::values::{build, round_through, supported, values, values_in};
use crate::gemm::gemm_into;

/// A task's patch matrix is at most this many f32 values (16 MiB): larger images take Flex's
/// conv.
const MAX_PATCH: usize = 1 << 22;

/// Weight gradients with fewer elements than this are summed in [`GROUPS`] partial sums side
/// by side; larger ones image by image by gemm's own threads.
const GROUPED_WEIGHT: usize = 1 << 16;

/// A dense conv's geometry.
#[derive(Clone, Copy)]
struct Dense {
    n: usize,
    cin: usize,
    cout: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
    kh: usize,
    kw: usize,
    stride: [usize; 2],
    pad: [usize; 2],
}

impl Dense {
    /// The geometry when `x [n, cin, h, w]` and `weight [cout, cin, kh, kw]` (in `x`'s dtype
    /// or its f32 [master copy](rounds_to)) make a conv with one group and no dilation whose
    /// patch matrix and output are countable.
    fn of(x: &FlexTensor, weight: &FlexTensor, o: &ConvOptions<2>) -> Option<Self> {
        let (xd, wd) = (x.layout().shape(), weight.layout().shape());
        let ok = xd.len() == 4
            && wd.len() == 4
            && o.groups == 1
            && o.dilation == [1, 1]
            && wd[1] == xd[1]
            && o.stride.iter().all(|&s| s >= 1)
            && supported(x)
            && rounds_to(weight, x.dtype());
        if !ok {
            return None;
        }
        let side = |s: usize, k: usize, a: usize| {
            let padded = s.checked_add(o.padding[a].checked_mul(2)?)?;
            padded.checked_sub(k).map(|v| v / o.stride[a] + 1)
        };
        let g = Self {
            n: xd[0],
            cin: xd[1],
            cout: wd[0],
            h: xd[2],
            w: xd[3],
            ho: side(xd[2], wd[2], 0)?,
            wo: side(xd[3], wd[3], 1)?,
            kh: wd[2],
            kw: wd[3],
            stride: o.stride,
            pad: o.padding,
        };
        let patch = g.places().checked_mul(g.cols())?;
        g.n.checked_mul(g.places())?.checked_mul(g.cout)?;
        let work = [g.n, g.cin, g.cout, g.places(), g.kh, g.kw];
        (patch <= MAX_PATCH && work.iter().all(|&d| d > 0)).then_some(g)
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
            dz.layout().shape().to_vec() == [g.n, g.cout, g.ho, g.wo] && dz.dtype() == x.dtype();
        fits.then_some(g)
    }

    fn places(&self) -> usize {
        self.ho * self.wo
    }

    /// The output's `[n, cout, ho, wo]`.
    fn out_dims(&self) -> [usize; 4] {
        [self.n, self.cout, self.ho, self.wo]
    }

    /// The patch matrix's columns: `cin · taps`.
    fn cols(&self) -> usize {
        self.cin * self.kh * self.kw
    }

    /// `patch [places, cin·taps]` of a channels-last `image [h, w, cin]`: zero where a tap
    /// falls in the padding.
    fn lay_out(&self, image: &[f32], patch: &mut [f32]) {
        let (taps, cols) = (self.kh * self.kw, self.cols());
        for (place, row) in patch.chunks_exact_mut(cols).enumerate() {
            let (oy, ox) = (place / self.wo, place % self.wo);
            for t in 0..taps {
                let y = (oy * self.stride[0] + t / self.kw).checked_sub(self.pad[0]);
                let x = (ox * self.stride[1] + t % self.kw).checked_sub(self.pad[1]);
                match (y, x) {
                    (Some(y), Some(x)) if y < self.h && x < self.w => {
                        let src = &image[(y * self.w + x) * self.cin..][..self.cin];
                        for (ci, &v) in src.iter().enumerate() {
                            row[ci * taps + t] = v;
                        }
                    }
                    _ => (0..self.cin).for_each(|ci| row[ci * taps + t] = 0.0),
                }
            }
        }
    }

    /// The output positions `ox` of a row for which tap column `kx` reads inside the image,
    /// and the input column the first of them reads (`None`: none does).
    fn inside(&self, kx: usize) -> Option<(std::ops::Range<usize>, usize)> {
        let (s, p) = (self.stride[1], self.pad[1]);
        // ox · s + kx − p ∈ [0, w)
        let first = p.saturating_sub(kx).div_ceil(s);
        let end = ((self.w + p).checked_sub(kx)?).div_ceil(s).min(self.wo);
        (first < end).then(|| (first..end, first * s + kx - p))
    }

    /// `patch [places, cin·taps]` of a channels-first `image [cin, h, w]`: the same matrix
    /// [`lay_out`](Self::lay_out) makes from a channels-last one (so gemm returns the same
    /// bits whichever layout the image came in), each tap read across the channel planes.
    fn lay_out_first(&self, image: &[f32], patch: &mut [f32]) {
        let (taps, cols, plane) = (self.kh * self.kw, self.cols(), self.h * self.w);
        for (place, row) in patch.chunks_exact_mut(cols).enumerate() {
            let (oy, ox) = (place / self.wo, place % self.wo);
            for t in 0..taps {
                let y = (oy * self.stride[0] + t / self.kw).checked_sub(self.pad[0]);
                let x = (ox * self.stride[1] + t % self.kw).checked_sub(self.pad[1]);
                match (y, x) {
                    (Some(y), Some(x)) if y < self.h && x < self.w => {
                        let at = y * self.w + x;
                        for ci in 0..self.cin {
                            row[ci * taps + t] = image[ci * plane + at];
                        }
                    }
                    _ => (0..self.cin).for_each(|ci| row[ci * taps + t] = 0.0),
                }
            }
        }
    }

    /// A channels-first `image [cin, h, w]` += col2im(`Pᵀ [cin·taps, places]`): each tap's
    /// row added where that tap read.
    fn add_columns(&self, patch_t: &[f32], image: &mut [f32]) {
        let (taps, places, plane) = (self.kh * self.kw, self.places(), self.h * self.w);
        for (col, row) in patch_t.chunks_exact(places).enumerate() {
            let (ci, t) = (col / taps, col % taps);
            let (ky, kx) = (t / self.kw, t % self.kw);
            let dst = &mut image[ci * plane..][..plane];
            let Some((range, x0)) = self.inside(kx) else {
                continue;
            };
            for (oy, src) in row.chunks_exact(self.wo).enumerate() {
                let Some(y) = (oy * self.stride[0] + ky)
                    .checked_sub(self.pad[0])
                    .filter(|&y| y < self.h)
                else {
                    continue;
                };
                let line = &mut dst[y * self.w..][..self.w];
                let s = self.stride[1];
                for (k, v) in src[range.clone()].iter().enumerate() {
                    line[x0 + k * s] += v;
                }
            }
        }
    }

    /// `image`'s patch matrix `P [places, cin·taps]` laid out into `patch`, from a
    /// channels-first image (`first`) or a channels-last one; gemm's `(row, column)` strides
    /// to read it.
    fn patch(&self, image: &[f32], first: bool, patch: &mut [f32]) -> (usize, usize) {
        if first {
            self.lay_out_first(image, patch);
        } else {
            self.lay_out(image, patch);
        }
        (self.cols(), 1)
    }
}

/// `x` as the kernels read its images: channels first when it already is (`true`), else
/// channels last (itself, or a transposed copy).
fn images(x: &FlexTensor) -> (FlexTensor, bool) {
    match is_channels_first(x) {
        true => (x.clone(), true),
        false => (channels_last(x), false),
    }
}

/// A task's buffers: the patch matrix, room for a widened image and for an image's output
/// (or output gradient) laid out as the products take it.
fn scratch(g: Dense) -> [Vec<f32>; 3] {
    [vec![0.0; g.places() * g.cols()], Vec::new(), Vec::new()]
}

/// Image `i`'s output gradient as `dZᵢᵀ [cout, places]`, contiguous, whichever layout `dz`
/// has (transposed through `buf` from a channels-last one), so that the products read the
/// same operand, and give the same bits, either way.
fn gradient_planes<'a>(
    g: Dense,
    (dz, dz_first): (&'a FlexTensor, bool),
    i: usize,
    wide: &'a mut Vec<f32>,
    buf: &'a mut Vec<f32>,
) -> &'a [f32] {
    let (places, grad) = (g.places(), g.places() * g.cout);
    let values = values_in(dz, i * grad, grad, wide);
    if dz_first {
        return values;
    }
    buf.resize(grad, 0.0);
    for (p, row) in values.chunks_exact(g.cout).enumerate() {
        for (co, &v) in row.iter().enumerate() {
            buf[co * places + p] = v;
        }
    }
    buf
}

/// Dense conv forward (no bias), channels last: an image's patch matrix times `Wᵀ` per task.
pub fn dense_conv(x: &FlexTensor, weight: &FlexTensor, o: &ConvOptions<2>) -> Option<FlexTensor> {
    let g = Dense::of(x, weight, o)?;
    Some(relabel(forward(g, x, weight, None, false), g.out_dims()))
}

/// Dense conv forward plus `bias` (`[cout]`, any float dtype the kernels read), channels
/// first: the composed conv layer, whose result Flex's own ops read next. `None` for
/// anything the kernel does not take.
pub fn dense_conv_first(
    x: &FlexTensor,
    weight: &FlexTensor,
    bias: Option<&FlexTensor>,
    o: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Dense::of(x, weight, o)?;
    let bias = match bias {
        Some(b) => {
            let fits = supported(b)
                && b.layout().is_contiguous()
                && b.layout().shape().to_vec() == [g.cout];
            Some(values(fits.then_some(b)?, 0, g.cout).into_owned())
        }
        None => None,
    };
    Some(forward(g, x, weight, bias.as_deref(), true))
}

/// The forward an image per task, its output channels first (`first`: each image's `[cout,
/// places]` planes, the bias added) or channels last (`[places, cout]` rows, no bias).
fn forward(
    g: Dense,
    x: &FlexTensor,
    weight: &FlexTensor,
    bias: Option<&[f32]>,
    first: bool,
) -> FlexTensor {
    let ((x, x_first), weight, cols) = (images(x), weight.to_contiguous(), g.cols());
    let dtype = x.dtype();
    let w = weight_values(&weight, dtype, 0, g.cout * cols);
    let image = g.cin * g.h * g.w;
    let places = g.places();
    build(
        g.out_dims().to_vec(),
        places * g.cout,
        dtype,
        || scratch(g),
        |[patch, wide, rows], i, out| {
            let lhs = g.patch(values_in(&x, i * image, image, wide), x_first, patch);
            // Z [places, cout] = P · Wᵀ, row-major, into the output's rows (channels last)
            // or a buffer (channels first): the same gemm call, the same bits, either way.
            // Wᵀ [cin·taps, cout]: element (col, co) at co · cols + col.
            let dims = (places, g.cout, cols);
            if !first {
                gemm_into(
                    dims,
                    (out, g.cout),
                    false,
                    (patch, lhs),
                    (&w, (1, cols)),
                    false,
                );
                return;
            }
            rows.resize(places * g.cout, 0.0);
            gemm_into(
                dims,
                (rows, g.cout),
                false,
                (patch, lhs),
                (&w, (1, cols)),
                false,
            );
            // Each channel's plane, the bias added after the sum as Flex's conv adds it (in
            // f16 to the rounded sum).
            if let (Some(_), DType::F16) = (bias, dtype) {
                round_through(rows, dtype);
            }
            for (co, plane) in out.chunks_exact_mut(places).enumerate() {
                let b = bias.map_or(0.0, |b| b[co]);
                for (p, o) in plane.iter_mut().enumerate() {
                    *o = rows[p * g.cout + co] + b;
                }
            }
        },
    )
}

/// Dense conv weight gradient: `dW = Σᵢ dZᵢᵀ · Pᵢ`, summed in f32 (a small weight in `GROUPS`
/// fixed runs of images side by side, added in order; a large one image by image over gemm's
/// threads: either way the bits do not depend on the thread count), in the dtype of `x`, then
/// the weight's.
pub fn dense_weight_backward(
    x: &FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Dense::with_gradient(x, weight, dz, o)?;
    let ((x, x_first), (dz, dz_first), cols) = (images(x), images(dz), g.cols());
    let image = g.cin * g.h * g.w;
    // dW += dZᵢᵀ · Pᵢ for images `range`.
    let add_images = |dw: &mut [f32], range: std::ops::Range<usize>, parallel: bool| {
        let [mut patch, mut wide, mut buf] = scratch(g);
        let mut wide_dz = Vec::new();
        for i in range {
            let rhs = g.patch(
                values_in(&x, i * image, image, &mut wide),
                x_first,
                &mut patch,
            );
            let dzi = gradient_planes(g, (&dz, dz_first), i, &mut wide_dz, &mut buf);
            let dims = (g.cout, cols, g.places());
            gemm_into(
                dims,
                (dw, dims.1),
                true,
                (dzi, (g.places(), 1)),
                (&patch, rhs),
                parallel,
            );
        }
    };
    let size = g.cout * cols;
    let dw = if size >= GROUPED_WEIGHT || g.n < GROUPS {
        let mut dw = vec![0f32; size];
        add_images(&mut dw, 0..g.n, true);
        dw
    } else {
        summed_in_groups(size, g.n, |dw, images| add_images(dw, images, false))
    };
    let shape = vec![g.cout, g.cin, g.kh, g.kw];
    Some(weight_grad(dw, shape, x.dtype(), weight.dtype()))
}

/// Dense conv input gradient, channels first: per image `dPᵀ = Wᵀ · dZᵀ` (gemm), then each
/// tap's row of it added back where forward read it (col2im), in f32, rounded once into `x`'s
/// dtype. Reads only `x`'s shape and dtype. `Err(x)` for anything the kernel does not take.
pub fn dense_x_backward(
    x: FlexTensor,
    weight: &FlexTensor,
    dz: &FlexTensor,
    o: &ConvOptions<2>,
) -> Result<FlexTensor, FlexTensor> {
    let Some(g) = Dense::with_gradient(&x, weight, dz, o) else {
        return Err(x);
    };
    let dtype = x.dtype();
    drop(x);
    let ((dz, dz_first), weight, cols) = (images(dz), weight.to_contiguous(), g.cols());
    let w = weight_values(&weight, dtype, 0, g.cout * cols);
    let (places, image) = (g.places(), g.cin * g.h * g.w);
    Ok(build(
        vec![g.n, g.cin, g.h, g.w],
        image,
        dtype,
        || scratch(g),
        |[patch_t, wide, buf], i, out| {
            let dzi = gradient_planes(g, (&dz, dz_first), i, wide, buf);
            // dPᵀ [cols, places] = Wᵀ [cols, cout] · dZᵢᵀ [cout, places].
            let dims = (cols, places, g.cout);
            let dz_strides = (places, 1);
            gemm_into(
                dims,
                (patch_t, places),
                false,
                (&w, (1, cols)),
                (dzi, dz_strides),
                false,
            );
            out.fill(0.0);
            g.add_columns(patch_t, out);
        },
    ))
}
