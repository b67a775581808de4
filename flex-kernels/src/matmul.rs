//! A weight gradient summed over slices in f32 by gemm itself.

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{DType, Shape};

use crate::convert::widened;
use crate::gemm::gemm_into;

/// `sum + lhs · rhs` in f32, written into `sum` by gemm (which reads it: no product, realigning
/// copy or second sum is made). `lhs [m, k]` and `rhs [k, n]` may be half precision: they are
/// widened to f32 here (a slice's worth), not through Flex's cast, which stages every value in
/// f64. A `sum` that is absent starts at zero; one that is shared or strided is added to.
///
/// Only operands `gemm_into` can vouch for take gemm: 2-D, inner sizes that agree, no size
/// zero, and strides that are non-negative (Flex's flipped views are not). Anything else goes
/// to Flex's own matmul and add, which check their operands themselves.
pub fn add_matmul(sum: Option<FlexTensor>, lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    let (lhs, rhs) = (widened(lhs), widened(rhs));
    let composed = |sum: Option<FlexTensor>, lhs, rhs| {
        let product = Flex::float_matmul(lhs, rhs);
        match sum {
            Some(sum) => Flex::float_add(sum, product),
            None => product,
        }
    };
    let (Some(l), Some(r)) = (Operand::of(&lhs), Operand::of(&rhs)) else {
        return composed(sum, lhs, rhs);
    };
    let (m, k, n) = (l.rows, l.cols, r.cols);
    if r.rows != k || m == 0 || k == 0 || n == 0 {
        return composed(sum, lhs, rhs);
    }
    let mut sum = match sum {
        Some(sum)
            if sum.is_unique()
                && sum.is_contiguous()
                && sum.layout().start_offset() == 0
                && sum.dtype() == DType::F32
                && sum.layout().shape().to_vec() == [m, n] =>
        {
            sum
        }
        Some(sum) => return composed(Some(sum), lhs, rhs),
        None => FlexTensor::filled_typed(Shape::new([m, n]), DType::F32, 0f32),
    };
    let lv = &lhs.storage::<f32>()[lhs.layout().start_offset()..];
    let rv = &rhs.storage::<f32>()[rhs.layout().start_offset()..];
    let dst = sum.storage_mut::<f32>();
    gemm_into(
        (m, n, k),
        (dst, n),
        true,
        (lv, l.strides),
        (rv, r.strides),
        true,
    );
    sum
}

/// A 2-D f32 view gemm may read: its sizes and its (row, column) strides, none negative.
struct Operand {
    rows: usize,
    cols: usize,
    strides: (usize, usize),
}

impl Operand {
    fn of(t: &FlexTensor) -> Option<Self> {
        let (shape, strides) = (t.layout().shape(), t.layout().strides());
        if shape.len() != 2 || strides.len() != 2 || t.dtype() != DType::F32 {
            return None;
        }
        Some(Self {
            rows: shape[0],
            cols: shape[1],
            strides: (
                usize::try_from(strides[0]).ok()?,
                usize::try_from(strides[1]).ok()?,
            ),
        })
    }
}
