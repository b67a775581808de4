//! The sliced linear layer in half precision (f16, bf16) on the CPU: the forward `x · W + b`
//! and the input gradient `dx = dy · Wᵀ`, computed by f32 gemm on widened operands, without a
//! half copy of the master weight or Flex's half matmul.
//!
//! Flex multiplies f16 through gemm's f16 path, which converts its operands while packing them
//! on every call (a third of a SimpleModel f16-mixed step went to it), and bf16 by converting
//! both operands to f32 through its cast, which stages every value in f64. Here the master
//! weight is rounded to the half type and widened back a block at a time, activations are
//! widened a slice of rows at a time (F16C, eight values at once, where the CPU has it), and
//! gemm's f32 product is rounded as Flex's half matmul rounds it: once, then the bias is added
//! in the half type. The bits are the generic path's (tested against it).
//!
//! ```text
//! forward   per slice of rows:     out = round(round(x · round(W)) + round(b))
//! dx        per block of features: dx  = round(dy · round(W)ᵀ)
//! ```

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{bf16, f16, Bytes, DType, Shape};

use super::half_slices::Half;
use super::values::{round_through, widen_into};
use crate::gemm::gemm_into;

/// Values of a widened operand or f32 product made per slice or block.
const BLOCK_VALUES: usize = 1 << 16;

/// Whether `dtype` is a half type these kernels compute.
fn half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// f32 `values` rounded into `dst` from element `at` on.
fn narrow_into(dst: &mut HalfBuffer, at: usize, values: &[f32]) {
    match dst {
        HalfBuffer::F16(d) => f16::narrow(values, &mut d[at..at + values.len()]),
        HalfBuffer::Bf16(d) => bf16::narrow(values, &mut d[at..at + values.len()]),
    }
}

/// A result being filled, in its half type.
enum HalfBuffer {
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl HalfBuffer {
    fn zeros(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::F16 => Self::F16(vec![f16::ZERO; len]),
            _ => Self::Bf16(vec![bf16::ZERO; len]),
        }
    }

    fn tensor(self, shape: [usize; 2]) -> FlexTensor {
        let (bytes, dtype) = match self {
            Self::F16(v) => (Bytes::from_elems(v), DType::F16),
            Self::Bf16(v) => (Bytes::from_elems(v), DType::BF16),
        };
        FlexTensor::new(bytes, Layout::contiguous(Shape::new(shape)), dtype)
    }
}

/// The f32 master `t`'s values, contiguous.
fn master(t: &FlexTensor, len: usize) -> Option<FlexTensor> {
    let t = t.to_contiguous();
    (t.dtype() == DType::F32 && t.layout().shape().iter().product::<usize>() == len).then_some(t)
}

/// `x · half(weight) + half(bias)` in the half dtype of `x [n, in]`, for the f32 master
/// `weight [in, out]` and `bias [out]`; `None` for other dtypes or shapes (the caller takes
/// the generic path).
pub fn linear_forward_half(
    x: &FlexTensor,
    weight: &FlexTensor,
    bias: &FlexTensor,
) -> Option<FlexTensor> {
    let (xd, wd) = (x.layout().shape(), weight.layout().shape());
    let fits = half(x.dtype()) && xd.len() == 2 && wd.len() == 2 && xd[1] == wd[0];
    if !fits {
        return None;
    }
    let (n, ins, outs) = (xd[0], xd[1], wd[1]);
    let total = n.checked_mul(outs)?;
    if total == 0 || ins == 0 {
        return None;
    }
    let dtype = x.dtype();
    let (weight, bias) = (master(weight, ins * outs)?, master(bias, outs)?);
    // The weight as the generic path's cast leaves it (f32 holds every half value exactly).
    let mut w = weight.storage::<f32>()[weight.layout().start_offset()..][..ins * outs].to_vec();
    round_through(&mut w, dtype);
    let mut b = bias.storage::<f32>()[bias.layout().start_offset()..][..outs].to_vec();
    round_through(&mut b, dtype);
    let x = x.to_contiguous();
    let rows = (BLOCK_VALUES / ins).clamp(1, n);
    let mut out = HalfBuffer::zeros(dtype, total);
    let (mut xs, mut product) = (vec![0f32; rows * ins], vec![0f32; rows * outs]);
    for start in (0..n).step_by(rows) {
        let len = rows.min(n - start);
        let (xs, product) = (&mut xs[..len * ins], &mut product[..len * outs]);
        widen_into(&x, start * ins, xs);
        gemm_into(
            (len, outs, ins),
            (product, outs),
            false,
            (xs, (ins, 1)),
            (&w, (outs, 1)),
            true,
        );
        // Flex's half matmul rounds the product; the bias is then added in the half type.
        round_through(product, dtype);
        for row in product.chunks_exact_mut(outs) {
            row.iter_mut().zip(&b).for_each(|(v, b)| *v += b);
        }
        narrow_into(&mut out, start * outs, product);
    }
    Some(out.tensor([n, outs]))
}

/// `dy · half(weight)ᵀ` in the half dtype of `dy [n, out]` for the f32 master `weight
/// [in, out]`; `None` for other dtypes or shapes (the caller multiplies through the backend).
pub fn linear_input_grad_half(dy: &FlexTensor, weight: &FlexTensor) -> Option<FlexTensor> {
    let (dd, wd) = (dy.layout().shape(), weight.layout().shape());
    let fits = half(dy.dtype()) && dd.len() == 2 && wd.len() == 2 && dd[1] == wd[1];
    if !fits {
        return None;
    }
    let (n, outs, ins) = (dd[0], dd[1], wd[0]);
    let total = n.checked_mul(ins)?;
    if total == 0 || outs == 0 {
        return None;
    }
    let dtype = dy.dtype();
    // dy is small ([n, out]): widened whole.
    let mut dys = vec![0f32; n * outs];
    widen_into(&dy.to_contiguous(), 0, &mut dys);
    let weight = master(weight, ins * outs)?;
    let ws = &weight.storage::<f32>()[weight.layout().start_offset()..][..ins * outs];
    let block = (BLOCK_VALUES / n.max(outs)).clamp(1, ins);
    let mut dx = HalfBuffer::zeros(dtype, total);
    let mut rounded = vec![0f32; block * outs];
    let mut product = vec![0f32; n * block];
    for start in (0..ins).step_by(block) {
        let len = block.min(ins - start);
        let (rounded, product) = (&mut rounded[..len * outs], &mut product[..n * len]);
        // The block of Wᵀ, `[outs, len]` row-major, as Flex's matmul would see it.
        for (j, row) in ws[start * outs..][..len * outs]
            .chunks_exact(outs)
            .enumerate()
        {
            for (kk, &w) in row.iter().enumerate() {
                rounded[kk * len + j] = w;
            }
        }
        round_through(rounded, dtype);
        // product [n, len] = dy [n, outs] (row stride outs) · rounded [outs, len] (row
        // stride len).
        gemm_into(
            (n, len, outs),
            (product, len),
            false,
            (&dys, (outs, 1)),
            (rounded, (len, 1)),
            false,
        );
        for (row, values) in product.chunks_exact(len).enumerate() {
            narrow_into(&mut dx, row * ins + start, values);
        }
    }
    Some(dx.tensor([n, ins]))
}
