//! f32 views of Flex's float tensors and f32 results stored back: how the CPU kernels compute
//! in f32 on f16/bf16 activations, widening a plane or an image at a time and rounding once.

use std::borrow::Cow;

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{bf16, f16, Bytes, DType, Shape};

use super::half_slices::Half;
use rayon::prelude::*;

/// Values `start..start + len` of a contiguous float tensor, as f32 (borrowed when f32).
pub(super) fn values(t: &FlexTensor, start: usize, len: usize) -> Cow<'_, [f32]> {
    match t.dtype() {
        DType::F16 | DType::BF16 => {
            let mut v = vec![0f32; len];
            widen_into(t, start, &mut v);
            Cow::Owned(v)
        }
        _ => {
            let at = t.layout().start_offset() + start;
            Cow::Borrowed(&t.storage::<f32>()[at..at + len])
        }
    }
}

/// Values `start..start + len` of a contiguous float tensor as f32: borrowed when f32,
/// else widened into `scratch` (grown as needed, kept for the next call).
pub(super) fn values_in<'a>(
    t: &'a FlexTensor,
    start: usize,
    len: usize,
    scratch: &'a mut Vec<f32>,
) -> &'a [f32] {
    match t.dtype() {
        DType::F16 | DType::BF16 => {
            scratch.resize(len, 0.0);
            widen_into(t, start, scratch);
            scratch
        }
        _ => {
            let at = t.layout().start_offset() + start;
            &t.storage::<f32>()[at..at + len]
        }
    }
}

/// Values `start..start + dst.len()` of a contiguous float tensor, widened into `dst`.
pub(super) fn widen_into(t: &FlexTensor, start: usize, dst: &mut [f32]) {
    let at = t.layout().start_offset() + start;
    let len = dst.len();
    match t.dtype() {
        DType::F16 => f16::widen(&t.storage::<f16>()[at..at + len], dst),
        DType::BF16 => bf16::widen(&t.storage::<bf16>()[at..at + len], dst),
        _ => dst.copy_from_slice(&t.storage::<f32>()[at..at + len]),
    }
}

/// Whether the kernels compute on `t`'s dtype (f32, f16, bf16).
pub(super) fn supported(t: &FlexTensor) -> bool {
    matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

/// `v` rounded to `dtype` and back, in place: the value a cast to `dtype` gives (a no-op
/// for f32).
pub(super) fn round_through(v: &mut [f32], dtype: DType) {
    match dtype {
        DType::F16 => f16::round(v),
        DType::BF16 => bf16::round(v),
        _ => {}
    }
}

/// Rows of `width` values a rayon task takes at a time: 256, or fewer, so that each f32 buffer
/// a task widens them into or computes them in stays at 64 KiB (wide rows in bigger chunks
/// raised the f16-mixed MobileNet's training peak by 3%).
pub(super) fn task_rows(width: usize) -> usize {
    ((1 << 14) / width.max(1)).clamp(1, 256)
}

/// f32 values rounded into a half type.
type Narrow<H> = fn(&[f32], &mut [H]);

/// A `dtype` tensor of `shape` whose values are made in chunks of `per` (the last may be
/// shorter) in f32 by `f(scratch, i, out)` for chunk `i` (with a scratch `S` per rayon task,
/// made by `init`), in parallel, and rounded chunk by chunk. `f` writes every value of `out`,
/// which holds what the task's previous chunk left there (zeroing it first was 1.5% of a
/// MobileNet step; a kernel that adds into its output zeroes it itself).
pub(super) fn build<S>(
    shape: Vec<usize>,
    per: usize,
    dtype: DType,
    init: impl Fn() -> S + Sync + Send,
    f: impl Fn(&mut S, usize, &mut [f32]) + Sync,
) -> FlexTensor {
    /// Each chunk made in a task's f32 buffer (in cache), copied once into the result: from
    /// the buffer when `H` is f32 (`narrow` is `None`), else from a second buffer it is
    /// `narrow`ed into. The result is never zeroed: zeroing it first was a pass over memory of
    /// its own (6% of an f32 MobileNet step); staging f32 in the second buffer too cost 5%.
    fn made<H: bytemuck::Pod + Send + Sync + burn::tensor::Element, S>(
        (len, per): (usize, usize),
        zero: H,
        narrow: Option<Narrow<H>>,
        init: &(impl Fn() -> S + Sync + Send),
        f: &(impl Fn(&mut S, usize, &mut [f32]) + Sync),
    ) -> Bytes {
        let mut out: Vec<H> = Vec::with_capacity(len);
        out.spare_capacity_mut()[..len]
            .par_chunks_mut(per)
            .enumerate()
            .for_each_init(
                || {
                    (
                        vec![0f32; per],
                        vec![zero; narrow.map_or(0, |_| per)],
                        init(),
                    )
                },
                |(buf, stored, scratch), (i, o)| {
                    let buf = &mut buf[..o.len()];
                    f(scratch, i, buf);
                    match narrow {
                        Some(narrow) => {
                            let stored = &mut stored[..o.len()];
                            narrow(buf, stored);
                            o.write_copy_of_slice(stored);
                        }
                        // f32 results: the buffer itself.
                        None => {
                            o.write_copy_of_slice(bytemuck::cast_slice(buf));
                        }
                    }
                },
            );
        // SAFETY: the chunks cover `..len` and each was written in full above.
        unsafe { out.set_len(len) };
        Bytes::from_elems(out)
    }
    let (len, per) = (shape.iter().product::<usize>(), per.max(1));
    let bytes = match dtype {
        DType::F16 => made((len, per), f16::ZERO, Some(f16::narrow), &init, &f),
        DType::BF16 => made((len, per), bf16::ZERO, Some(bf16::narrow), &init, &f),
        _ => made::<f32, S>((len, per), 0f32, None, &init, &f),
    };
    FlexTensor::new(bytes, Layout::contiguous(Shape::from(shape)), dtype)
}

/// f32 `values` stored as `dtype`, shaped `shape`.
pub(super) fn stored(values: Vec<f32>, shape: Vec<usize>, dtype: DType) -> FlexTensor {
    // Rounded through the half types' slice conversions (F16C where the CPU has it).
    let bytes = match dtype {
        DType::F16 => {
            let mut out = vec![f16::ZERO; values.len()];
            f16::narrow(&values, &mut out);
            Bytes::from_elems(out)
        }
        DType::BF16 => {
            let mut out = vec![bf16::ZERO; values.len()];
            bf16::narrow(&values, &mut out);
            Bytes::from_elems(out)
        }
        _ => Bytes::from_elems(values),
    };
    FlexTensor::new(bytes, Layout::contiguous(Shape::from(shape)), dtype)
}

/// A function whose body is compiled twice, for the x86-64 baseline (SSE2: four f32 lanes)
/// and for AVX2 (eight), the AVX2 one called where this CPU has it (detected once). Only the
/// vector width changes: Rust never fuses a multiply and an add, and the loops are written
/// so that no sum is reordered, so the results are the same bits either way.
macro_rules! wide_simd {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$doc])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) {
                    body($($arg),*)
                }
                // SAFETY: the CPU has AVX2 (checked above).
                return unsafe { avx2($($arg),*) };
            }
            body($($arg),*)
        }
    };
}
pub(super) use wide_simd;
