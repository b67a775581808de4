//! A dense (one group) k×k convolution on the CPU, forward and weight gradient, as im2col +
//! gemm an image per rayon task, its output [channels last](super::channels_last): MobileNet's
//! stem (3×3, 3 → 32·α channels), the one conv of the network that is neither pointwise nor
//! depthwise.
//!
//! Each task lays its image out as a patch matrix `P [places, cin·taps]` (column `ci·taps +
//! t`, the order of the weight's own `[cout, cin, kh, kw]` rows, so neither product permutes
//! the weight):
//!
//! ```text
//! forward      Z [places, cout] = P · Wᵀ
//! weight grad  dW [cout, cin·taps] = Σᵢ dZᵢᵀ · Pᵢ      (per image, summed in a fixed order)
//! ```
//! Flex's conv made its output channels first (transposed afterwards for the block), and its
//! weight gradient reshaped both operands through its strided copy, value by value: the stem
//! was 8% of an f32 MobileNet step for 2% of its arithmetic. Arithmetic is f32; half-precision
//! images are widened as they are laid out and results rounded once. The input gradient (which
//! the stem does not need: its input is the data) stays with Flex's ops, as does any other
//! geometry (dilation, groups).

use burn::backend::flex::FlexTensor;
use burn::tensor::ops::ConvOptions;

use super::channels_last::{channels_last, relabel};
use super::conv::{rounds_to, summed_in_groups, weight_grad, weight_values, GROUPS};
use super::values::{build, supported, values_in};
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
}

/// A task's buffers: the patch matrix and room for a widened image.
fn scratch(g: Dense) -> [Vec<f32>; 2] {
    [vec![0.0; g.places() * g.cols()], Vec::new()]
}

/// Dense conv forward (no bias), channels last: an image's patch matrix times `Wᵀ` per task.
pub fn dense_conv(x: &FlexTensor, weight: &FlexTensor, o: &ConvOptions<2>) -> Option<FlexTensor> {
    let g = Dense::of(x, weight, o)?;
    let (x, weight, cols) = (channels_last(x), weight.to_contiguous(), g.cols());
    let w = weight_values(&weight, x.dtype(), 0, g.cout * cols);
    let image = g.cin * g.h * g.w;
    let dims = [g.n, g.cout, g.ho, g.wo];
    let out = build(
        dims.to_vec(),
        g.places() * g.cout,
        x.dtype(),
        || scratch(g),
        |[patch, wide], i, out| {
            g.lay_out(values_in(&x, i * image, image, wide), patch);
            // Wᵀ [cin·taps, cout]: element (col, co) at co · cols + col.
            let dims = (g.places(), g.cout, cols);
            gemm_into(
                dims,
                (out, dims.1),
                false,
                (patch, (cols, 1)),
                (&w, (1, cols)),
                false,
            );
        },
    );
    Some(relabel(out, dims))
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
    let (x, dz, cols) = (channels_last(x), channels_last(dz), g.cols());
    let (image, grad) = (g.cin * g.h * g.w, g.places() * g.cout);
    // dW += dZᵢᵀ · Pᵢ for images `range`.
    let add_images = |dw: &mut [f32], range: std::ops::Range<usize>, parallel: bool| {
        let [mut patch, mut wide] = scratch(g);
        let mut wide_dz = Vec::new();
        for i in range {
            g.lay_out(values_in(&x, i * image, image, &mut wide), &mut patch);
            let dzi = values_in(&dz, i * grad, grad, &mut wide_dz);
            let dims = (g.cout, cols, g.places());
            gemm_into(
                dims,
                (dw, dims.1),
                true,
                (dzi, (1, g.cout)),
                (&patch, (cols, 1)),
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
