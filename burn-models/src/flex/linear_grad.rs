//! The sliced linear layer's input gradient in bf16, `dx = dy · bf16(W)ᵀ`, without a bf16 copy
//! of the weight or Flex's bf16 matmul.
//!
//! Flex multiplies bf16 by converting both operands to f32 through its cast, which stages
//! every value in f64: SimpleModel's classifier weight (16,384 × 10) became 0.3 MiB of bf16,
//! then 1.3 MiB of f64 and 0.6 MiB of f32 for every slice's product, at backward's widest
//! instant. Here the master weight is rounded to bf16 and widened back a block of input
//! features at a time, and gemm writes the block's f32 product, which is rounded into `dx`:
//! bf16 → f32 is exact and gemm sees the operands Flex's matmul would give it, so the bits
//! are the generic path's (tested against `sliced_linear::input_grad_sliced`).

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{bf16, Bytes, DType, Shape};

use super::{convert, gemm_f32};

/// Values of the f32 product made per block of input features.
const BLOCK_VALUES: usize = 1 << 16;

/// `dy · bf16(weight)ᵀ` in bf16 for `dy [n, out]` in bf16 and the f32 master `weight
/// [in, out]`; `None` for other dtypes or shapes (the caller multiplies through the backend).
pub(crate) fn linear_input_grad_bf16(dy: &FlexTensor, weight: &FlexTensor) -> Option<FlexTensor> {
    let (dd, wd) = (dy.layout().shape(), weight.layout().shape());
    let fits = dy.dtype() == DType::BF16
        && weight.dtype() == DType::F32
        && dd.len() == 2
        && wd.len() == 2
        && dd[1] == wd[1];
    if !fits {
        return None;
    }
    let (n, outs, ins) = (dd[0], dd[1], wd[0]);
    let total = n.checked_mul(ins)?;
    if total == 0 || outs == 0 {
        return None;
    }
    // dy is small ([n, out]): widened whole.
    let dy = convert(dy.clone(), DType::F32);
    let dys = &dy.storage::<f32>()[dy.layout().start_offset()..][..n * outs];
    let weight = weight.to_contiguous();
    let ws = &weight.storage::<f32>()[weight.layout().start_offset()..][..ins * outs];
    let block = (BLOCK_VALUES / n.max(outs)).clamp(1, ins);
    let mut dx = vec![bf16::ZERO; total];
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
                rounded[kk * len + j] = bf16::from_f32(w).to_f32();
            }
        }
        // product [n, len] = dy [n, outs] (row stride outs) · rounded [outs, len] (row
        // stride len).
        gemm_f32(
            (n, len, outs),
            product,
            false,
            dys,
            (outs, 1),
            rounded,
            (len, 1),
            false,
        );
        for (row, values) in product.chunks_exact(len).enumerate() {
            let dst = &mut dx[row * ins + start..][..len];
            for (d, &v) in dst.iter_mut().zip(values) {
                *d = bf16::from_f32(v);
            }
        }
    }
    Some(FlexTensor::new(
        Bytes::from_elems(dx),
        Layout::contiguous(Shape::new([n, ins])),
        DType::BF16,
    ))
}
