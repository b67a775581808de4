//! Filling a batch-sized tensor a slice of rows at a time, in place.

use burn::backend::flex::FlexTensor;
use burn::tensor::{bf16, f16, DType, Slice};

/// `whole` with rows `start..start + len` (first axis) replaced by `part`, written in place.
///
/// Flex's `slice_assign` takes a second reference to its input's buffer before writing, so the
/// write always copies the whole tensor: filling a batch slice by slice would make the
/// batch-sized tensor twice per slice. A sole, contiguous owner is written here directly;
/// anything else (shared, strided, another dtype) takes `slice_assign`.
pub fn write_rows(mut whole: FlexTensor, start: usize, part: FlexTensor) -> FlexTensor {
    let dims = whole.layout().shape().to_vec();
    let part_rows = part.layout().shape().first().copied().unwrap_or(0);
    let row: usize = dims.iter().skip(1).product();
    let in_place = whole.is_unique()
        && whole.is_contiguous()
        && whole.layout().start_offset() == 0
        && whole.dtype() == part.dtype()
        && part.layout().shape().iter().skip(1).eq(dims.iter().skip(1))
        && start + part_rows <= dims.first().copied().unwrap_or(0);
    if in_place {
        let part = part.to_contiguous();
        let (at, len) = (start * row, part_rows * row);
        macro_rules! copy {
            ($t:ty) => {{
                let src = &part.storage::<$t>()[..len];
                match whole.try_storage_mut::<$t>() {
                    Some(dst) => {
                        dst[at..at + len].copy_from_slice(src);
                        true
                    }
                    None => false,
                }
            }};
        }
        let written = match whole.dtype() {
            DType::F32 => copy!(f32),
            DType::F16 => copy!(f16),
            DType::BF16 => copy!(bf16),
            DType::F64 => copy!(f64),
            DType::U8 => copy!(u8),
            DType::I32 => copy!(i32),
            DType::I64 => copy!(i64),
            _ => false,
        };
        if written {
            return whole;
        }
    }
    // The other axes are taken whole.
    let rows = [Slice::from(start..start + part_rows)];
    burn::backend::flex::ops::slice::slice_assign(whole, &rows, part)
}
