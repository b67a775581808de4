//! Conversions between f32, f16 and bf16 without Flex's f64 staging, and ops run in f32 on
//! half-precision operands.

use burn::backend::flex::{FlexTensor, Layout};
use burn::backend::Flex;
use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{bf16, f16, Bytes, DType};

use crate::half_slices::Half;

/// `op` on the first tensor's dtype, computed in f32 when that dtype is half precision: the
/// other operands rounded to it, then all widened to f32, and the result rounded to it once.
/// Flex's conv ops on f16 or bf16 operands multiply and add in the half type, value by value:
/// the f16-mixed MobileNet's stem conv (forward and weight gradient) took a quarter of its
/// step that way. Other dtypes run `op` on the operands as they are.
pub fn in_f32<const N: usize>(
    operands: [FlexTensor; N],
    op: impl FnOnce([FlexTensor; N]) -> FlexTensor,
) -> FlexTensor {
    let dtype = operands[0].dtype();
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return op(operands);
    }
    convert(op(operands.map(|t| widened(convert(t, dtype)))), dtype)
}

/// `t` as f32: itself, or a contiguous widened copy.
pub(crate) fn widened(t: FlexTensor) -> FlexTensor {
    match t.dtype() {
        DType::F32 => t,
        _ => convert(t, DType::F32),
    }
}

/// `t` in `dtype`, converted value by value between f32, f16 and bf16 (through f32, which holds
/// every f16 and bf16 exactly, so the result is the one rounding Flex's cast gives). Flex's own
/// cast collects every value into an f64 buffer first: 8 bytes per value beside the input and
/// the result. Other dtypes take Flex's cast.
pub fn convert(t: FlexTensor, dtype: DType) -> FlexTensor {
    fn to<S: Copy + bytemuck::Pod + burn::tensor::Element, D: bytemuck::Pod + Send + Sync>(
        t: &FlexTensor,
        dtype: DType,
        f: impl Fn(S) -> D,
    ) -> FlexTensor {
        let t = t.to_contiguous();
        let values: Vec<D> = t.storage::<S>().iter().map(|&v| f(v)).collect();
        FlexTensor::new(
            Bytes::from_elems(values),
            Layout::contiguous(t.layout().shape().clone()),
            dtype,
        )
    }
    /// With half's slice conversions (F16C, eight values at a time, where the CPU has it).
    fn sliced<S: bytemuck::Pod + burn::tensor::Element, D: bytemuck::Pod + Send + Sync>(
        t: &FlexTensor,
        dtype: DType,
        zero: D,
        f: impl Fn(&[S], &mut [D]),
    ) -> FlexTensor {
        let t = t.to_contiguous();
        let src = &t.storage::<S>()[t.layout().start_offset()..];
        let len = t.layout().shape().iter().product::<usize>();
        let mut values = vec![zero; len];
        f(&src[..len], &mut values);
        FlexTensor::new(
            Bytes::from_elems(values),
            Layout::contiguous(t.layout().shape().clone()),
            dtype,
        )
    }
    match (t.dtype(), dtype) {
        (a, b) if a == b => t,
        (DType::F32, DType::F16) => sliced(&t, dtype, f16::ZERO, |s: &[f32], d: &mut [f16]| {
            f16::narrow(s, d)
        }),
        (DType::F32, DType::BF16) => sliced(&t, dtype, bf16::ZERO, |s: &[f32], d: &mut [bf16]| {
            bf16::narrow(s, d)
        }),
        (DType::F16, DType::F32) => {
            sliced(&t, dtype, 0f32, |s: &[f16], d: &mut [f32]| f16::widen(s, d))
        }
        (DType::BF16, DType::F32) => sliced(&t, dtype, 0f32, |s: &[bf16], d: &mut [f32]| {
            bf16::widen(s, d)
        }),
        (DType::F16, DType::BF16) => to(&t, dtype, |v: f16| bf16::from_f32(v.to_f32())),
        (DType::BF16, DType::F16) => to(&t, dtype, |v: bf16| f16::from_f32(v.to_f32())),
        _ => Flex::float_cast(t, dtype.into()),
    }
}
