//! Half-precision slices widened to f32 and f32 slices rounded to half precision, as the CPU
//! kernels convert whole planes or rows.
//!
//! `half`'s slice routines use F16C for f16 but copy every eight values through a stack
//! buffer with a `memcpy` call on each side: a fifth of an f16-mixed SimpleModel step went to
//! those calls. Here F16C converts straight between the slices (eight values per instruction,
//! the same rounding: to nearest, ties to even); without F16C, and for bf16 (a shift and a
//! rounding the compiler vectorises), `half`'s routines.

use burn::tensor::{bf16, f16};
use half::slice::HalfFloatSliceExt;

/// A half-precision element type the kernels store activations in.
pub(crate) trait Half: Copy + Send + Sync + 'static {
    /// `dst = src` widened (exact); the slices have equal lengths.
    fn widen(src: &[Self], dst: &mut [f32]);
    /// `dst = src` rounded to nearest, ties to even; the slices have equal lengths.
    fn narrow(src: &[f32], dst: &mut [Self]);

    /// `v` rounded to this type and widened back, in place.
    fn round(v: &mut [f32]) {
        round_via_slices::<Self>(v);
    }

    /// Zero.
    const ZERO: Self;
}

impl Half for bf16 {
    const ZERO: Self = bf16::ZERO;

    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }

    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
}

impl Half for f16 {
    const ZERO: Self = f16::ZERO;

    fn widen(src: &[Self], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "widen: slices of equal length");
        #[cfg(target_arch = "x86_64")]
        if f16c() {
            // SAFETY: the CPU has AVX and F16C (checked above).
            unsafe { x86::widen(src, dst) };
            return;
        }
        src.convert_to_f32_slice(dst);
    }

    fn narrow(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len(), "narrow: slices of equal length");
        #[cfg(target_arch = "x86_64")]
        if f16c() {
            // SAFETY: the CPU has AVX and F16C (checked above).
            unsafe { x86::narrow(src, dst) };
            return;
        }
        dst.convert_from_f32_slice(src);
    }

    fn round(v: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if f16c() {
            // SAFETY: the CPU has AVX and F16C (checked above).
            unsafe { x86::round(v) };
            return;
        }
        round_via_slices::<Self>(v);
    }
}

/// `v` rounded to `H` and widened back, in place, through `H`'s slice conversions, 64 values
/// at a time.
fn round_via_slices<H: Half>(v: &mut [f32]) {
    let mut buf = [H::ZERO; 64];
    for chunk in v.chunks_mut(64) {
        let half = &mut buf[..chunk.len()];
        H::narrow(chunk, half);
        H::widen(half, chunk);
    }
}

/// Whether this CPU has F16C (and the AVX its 256-bit forms need); detected once.
#[cfg(target_arch = "x86_64")]
fn f16c() -> bool {
    std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx")
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_storeu_ps,
        _mm_loadu_si128, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };

    use burn::tensor::f16;
    use half::slice::HalfFloatSliceExt;

    /// # Safety
    /// The CPU has AVX and F16C; `src` and `dst` have equal lengths.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        let whole = src.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: `i + 8 ≤ whole ≤` both lengths; unaligned loads and stores.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
        }
        src[whole..].convert_to_f32_slice(&mut dst[whole..]);
    }

    /// # Safety
    /// The CPU has AVX and F16C; `src` and `dst` have equal lengths.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        let whole = src.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: `i + 8 ≤ whole ≤` both lengths; unaligned loads and stores.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i).cast::<__m128i>(), h);
            }
        }
        dst[whole..].convert_from_f32_slice(&src[whole..]);
    }

    /// `v` rounded to f16 and back in place, eight values in registers at a time.
    ///
    /// # Safety
    /// The CPU has AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn round(v: &mut [f32]) {
        let whole = v.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: `i + 8 ≤ whole ≤ v.len()`; unaligned loads and stores.
            unsafe {
                let p = v.as_mut_ptr().add(i);
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(p));
                _mm256_storeu_ps(p, _mm256_cvtph_ps(h));
            }
        }
        for x in &mut v[whole..] {
            *x = f16::from_f32(*x).to_f32();
        }
    }
}
