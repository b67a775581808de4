//! The CPU backend's (Flex's) own implementations of [`ModelBackend`](crate::ModelBackend)
//! methods, where its generic ops cost memory the models cannot afford.

use burn::backend::flex::{FlexTensor, Layout};
use burn::backend::Flex;
use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{bf16, f16, Bytes, DType, Shape, Slice};

mod bn_relu;
mod channels_last;
pub(crate) use channels_last::{channels_first, channels_last};
mod conv;
mod conv_pool;
mod dense;
mod depthwise;
mod half_slices;
use half_slices::Half;
mod linear_half;
mod pool_grad;
mod relu_pool;
mod values;
pub(crate) use bn_relu::{bn_relu_backward, bn_relu_forward};
pub(crate) use conv::{pointwise_conv, pointwise_weight_backward, pointwise_x_backward};
pub(crate) use conv_pool::conv_relu_pool_forward;
pub(crate) use dense::{dense_conv, dense_weight_backward};
pub(crate) use depthwise::{depthwise_conv, depthwise_weight_backward, depthwise_x_backward};
pub(crate) use linear_half::{linear_forward_half, linear_input_grad_half};
pub(crate) use pool_grad::conv_relu_pool_param_grads;
pub(crate) use relu_pool::relu_max_pool;

/// `whole` with rows `start..start + len` (first axis) replaced by `part`, written in place.
///
/// Flex's `slice_assign` takes a second reference to its input's buffer before writing, so the
/// write always copies the whole tensor: filling a batch slice by slice would make the
/// batch-sized tensor twice per slice. A sole, contiguous owner is written here directly;
/// anything else (shared, strided, another dtype) takes `slice_assign`.
pub(crate) fn write_rows(mut whole: FlexTensor, start: usize, part: FlexTensor) -> FlexTensor {
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

/// `sum + lhs · rhs` in f32, written into `sum` by gemm (which reads it: no product, realigning
/// copy or second sum is made). `lhs [m, k]` and `rhs [k, n]` may be half precision: they are
/// widened to f32 here (a slice's worth), not through Flex's cast, which stages every value in
/// f64. A `sum` that is absent starts at zero; one that is shared or strided is added to.
///
/// Only operands [`gemm_into`] can vouch for take gemm: 2-D, inner sizes that agree, no size
/// zero, and strides that are non-negative (Flex's flipped views are not). Anything else goes
/// to Flex's own matmul and add, which check their operands themselves.
pub(crate) fn add_matmul(sum: Option<FlexTensor>, lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
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

/// `op` on the first tensor's dtype, computed in f32 when that dtype is half precision: the
/// other operands rounded to it, then all widened to f32, and the result rounded to it once.
/// Flex's conv ops on f16 or bf16 operands multiply and add in the half type, value by value:
/// the f16-mixed MobileNet's stem conv (forward and weight gradient) took a quarter of its
/// step that way. Other dtypes run `op` on the operands as they are.
pub(crate) fn in_f32<const N: usize>(
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
fn widened(t: FlexTensor) -> FlexTensor {
    match t.dtype() {
        DType::F32 => t,
        _ => convert(t, DType::F32),
    }
}

/// `t` in `dtype`, converted value by value between f32, f16 and bf16 (through f32, which holds
/// every f16 and bf16 exactly, so the result is the one rounding Flex's cast gives). Flex's own
/// cast collects every value into an f64 buffer first: 8 bytes per value beside the input and
/// the result. Other dtypes take Flex's cast.
pub(crate) fn convert(t: FlexTensor, dtype: DType) -> FlexTensor {
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

/// `dst [rows, cols] (= or +=) lhs · rhs` in f32 with the given (row, column) strides.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_f32(
    (rows, cols, inner): (usize, usize, usize),
    dst: &mut [f32],
    add: bool,
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
    parallel: bool,
) {
    gemm_into(
        (rows, cols, inner),
        (dst, cols),
        add,
        (lhs, lhs_strides),
        (rhs, rhs_strides),
        parallel,
    );
}

/// The checked wrapper every gemm call of the CPU kernels goes through: `dst [rows, cols]`
/// (row stride `dst_rs`, column stride 1) `= or +=` `lhs [rows, inner] · rhs [inner, cols]`,
/// each operand a slice with its (row, column) strides. Panics, before gemm runs, when a size
/// is zero or a stride reaches past its slice (computed without overflow), so no call reads or
/// writes outside the slices it was given.
pub(super) fn gemm_into(
    (rows, cols, inner): (usize, usize, usize),
    (dst, dst_rs): (&mut [f32], usize),
    add: bool,
    lhs: (&[f32], (usize, usize)),
    rhs: (&[f32], (usize, usize)),
    parallel: bool,
) {
    assert!(
        reach(rows, cols, dst_rs, 1).is_some_and(|r| r <= dst.len()),
        "gemm: the destination [{rows}, {cols}] (row stride {dst_rs}) lies outside its {} values",
        dst.len()
    );
    // SAFETY: the assert keeps every destination address inside `dst`, which holds
    // initialised values (read when `add`); gemm_raw checks the operands.
    unsafe {
        gemm_raw(
            (rows, cols, inner),
            (dst.as_mut_ptr(), dst_rs),
            add,
            lhs,
            rhs,
            parallel,
        )
    }
}

/// One past the last element a `[rows, cols]` view with strides `(rs, cs)` reaches; `None`
/// for an empty view or when the product overflows.
fn reach(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return None;
    }
    (rows - 1)
        .checked_mul(rs)?
        .checked_add((cols - 1).checked_mul(cs)?)?
        .checked_add(1)
}

/// `lhs · rhs` in f32 as a new row-major `[rows, cols]` buffer, written once by gemm (never
/// zeroed first), over gemm's own threads when `parallel`. Each value's sum runs over `inner`
/// in gemm's order, whatever the thread count (gemm shares out output tiles, not the sum).
pub(super) fn gemm_new(
    (rows, cols, inner): (usize, usize, usize),
    lhs: (&[f32], (usize, usize)),
    rhs: (&[f32], (usize, usize)),
    parallel: bool,
) -> Vec<f32> {
    let len = rows
        .checked_mul(cols)
        .expect("gemm_new: a countable product");
    let mut out: Vec<f32> = Vec::with_capacity(len);
    // SAFETY: `out` has room for `rows · cols` values; gemm does not read it (`add` false)
    // and writes every one of them, after which they are initialised.
    unsafe {
        gemm_raw(
            (rows, cols, inner),
            (out.as_mut_ptr(), cols),
            false,
            lhs,
            rhs,
            parallel,
        );
        out.set_len(len);
    }
    out
}

/// `dst [rows, cols] (= or +=) lhs · rhs` in f32 through a raw destination with row stride
/// `dst_rs` (column stride 1). The operands' reach is checked here.
///
/// # Safety
/// `dst` must be valid for writes at `i · dst_rs + j` for every `i < rows`, `j < cols`, and
/// for reads there when `add`.
unsafe fn gemm_raw(
    (rows, cols, inner): (usize, usize, usize),
    (dst, dst_rs): (*mut f32, usize),
    add: bool,
    (lhs, (l_rs, l_cs)): (&[f32], (usize, usize)),
    (rhs, (r_rs, r_cs)): (&[f32], (usize, usize)),
    parallel: bool,
) {
    // The extents the strides reach, checked so that the call below stays in bounds.
    assert!(rows > 0 && cols > 0 && inner > 0, "gemm: a size is zero");
    assert!(
        reach(rows, inner, l_rs, l_cs).is_some_and(|r| r <= lhs.len()),
        "gemm: lhs [{rows}, {inner}] with strides ({l_rs}, {l_cs}) lies outside its {} values",
        lhs.len()
    );
    assert!(
        reach(inner, cols, r_rs, r_cs).is_some_and(|r| r <= rhs.len()),
        "gemm: rhs [{inner}, {cols}] with strides ({r_rs}, {r_cs}) lies outside its {} values",
        rhs.len()
    );
    let parallelism = match parallel && rows.saturating_mul(cols).saturating_mul(inner) >= 1 << 18 {
        true => gemm::Parallelism::Rayon(0),
        false => gemm::Parallelism::None,
    };
    // Strides as gemm takes them; each fits an isize, since it reached inside a slice.
    let signed = |v: usize| v as isize;
    // SAFETY: the asserts above keep every address the strides form inside the slices; the
    // caller vouches for `dst` with row stride `dst_rs`.
    unsafe {
        gemm::gemm(
            rows,
            cols,
            inner,
            dst,
            1,
            signed(dst_rs),
            add,
            lhs.as_ptr(),
            signed(l_cs),
            signed(l_rs),
            rhs.as_ptr(),
            signed(r_cs),
            signed(r_rs),
            if add { 1f32 } else { 0f32 },
            1f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}
