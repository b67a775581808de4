//! ReLU and its backward on the CPU, in the tensor's own layout (channels first or last), in
//! place where the tensor is the last reference to its buffer, and on half-precision values as
//! bits: `x > 0` is a test on the bit pattern, so nothing is widened or rounded.
//!
//! Flex's ReLU converts each f16 or bf16 value to f32 and back one at a time (a third of the
//! f16-mixed SimpleModel's composed step), and walks a channels-last tensor value by value
//! into a new channels-first one.
//!
//! The same values as Flex's: forward `x` where `x > 0`, else `+0` (NaN too); backward the
//! output gradient where the input is `> 0`, else `+0`.

use burn::backend::flex::FlexTensor;
use burn::tensor::{Bytes, DType};
use rayon::prelude::*;

use super::channels_last::is_channels_last;
use super::values::wide_simd;

/// Values a rayon task takes at a time.
const CHUNK: usize = 1 << 15;

/// Whether `t`'s buffer holds exactly its values from offset 0, in order or channels last: a
/// layout the kernels run along as one slice.
fn dense(t: &FlexTensor) -> bool {
    let size = t.bytes().len() / t.dtype().size().max(1);
    let whole = t.layout().start_offset() == 0 && size == t.layout().num_elements();
    whole && (t.layout().is_contiguous() || is_channels_last(t))
}

/// The largest positive finite-or-infinite bit pattern of a half type (its +∞): `1..=this`
/// are exactly the values `> 0`.
fn infinity(dtype: DType) -> u16 {
    match dtype {
        DType::F16 => 0x7c00,
        _ => 0x7f80,
    }
}

/// An all-ones mask where the f32 `x > 0`, else zero.
#[inline(always)]
fn keep32(x: f32) -> u32 {
    ((x > 0.0) as u32).wrapping_neg()
}

/// An all-ones mask where the half value with bits `x` is `> 0`, else zero.
#[inline(always)]
fn keep16(x: u16, inf: u16) -> u16 {
    ((x.wrapping_sub(1) < inf) as u16).wrapping_neg()
}

/// `max(x, 0)` in `x`'s dtype and layout. `Err(x)` for other dtypes and layouts.
pub fn relu(x: FlexTensor) -> Result<FlexTensor, FlexTensor> {
    let dtype = x.dtype();
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) || !dense(&x) {
        return Err(x);
    }
    // In place when `x` is the last reference to its buffer; else one pass into a new one (a
    // copy-on-write first would read and write the buffer twice).
    if !x.is_unique() {
        let (layout, inf) = (x.layout().clone(), infinity(dtype));
        let bytes = match dtype {
            DType::F32 => {
                let bits: &[u32] = bytemuck::cast_slice(x.storage::<f32>());
                Bytes::from_elems(mapped(bits, relu32))
            }
            _ => Bytes::from_elems(mapped(half_bits(&x), |c: &mut [u16]| relu16(c, inf))),
        };
        return Ok(relabeled(bytes, layout, dtype));
    }
    let mut x = x;
    match dtype {
        DType::F32 => {
            let bits: &mut [u32] = bytemuck::cast_slice_mut(x.storage_mut::<f32>());
            bits.par_chunks_mut(CHUNK).for_each(relu32);
        }
        _ => {
            let inf = infinity(dtype);
            let bits: &mut [u16] = bytemuck::cast_slice_mut(x_bytes(&mut x));
            bits.par_chunks_mut(CHUNK).for_each(|c| relu16(c, inf));
        }
    }
    Ok(x)
}

/// `src` copied into a new buffer a chunk at a time, each chunk then passed to `f` (in cache)
/// to be rewritten in place, in parallel: one pass over memory, and `f` a vector loop.
fn mapped<T: bytemuck::Pod + Send + Sync>(src: &[T], f: impl Fn(&mut [T]) + Sync) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(src.len());
    out.spare_capacity_mut()[..src.len()]
        .par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(o, s)| f(o.write_copy_of_slice(s)));
    // SAFETY: the chunks cover all `src.len()` slots (zip pairs chunks of equal length, both
    // cut at CHUNK from the same length), each written by the copy above.
    unsafe { out.set_len(src.len()) };
    out
}

/// A half tensor's values as bit patterns.
fn half_bits(t: &FlexTensor) -> &[u16] {
    match t.dtype() {
        DType::F16 => bytemuck::cast_slice(t.storage::<burn::tensor::f16>()),
        _ => bytemuck::cast_slice(t.storage::<burn::tensor::bf16>()),
    }
}

/// A tensor of `layout` over `bytes` written in that layout's order.
fn relabeled(bytes: Bytes, layout: burn::backend::flex::Layout, dtype: DType) -> FlexTensor {
    FlexTensor::new(bytes, layout, dtype)
}

/// The gradient of [`relu`]: `dout` where `x > 0`, else 0, in `dout`'s dtype and `x`'s
/// layout. `Err` (both back, boxed: a pair of tensors is large) when `x` and `dout` differ in
/// dtype, shape or layout.
pub fn relu_backward(x: FlexTensor, dout: FlexTensor) -> Result<FlexTensor, Box<[FlexTensor; 2]>> {
    let dtype = x.dtype();
    let same = dout.dtype() == dtype
        && dout.layout().shape() == x.layout().shape()
        && dout.layout().strides() == x.layout().strides();
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        || !same
        || !dense(&x)
        || !dense(&dout)
    {
        return Err(Box::new([x, dout]));
    }
    let mut dx = dout; // likewise
    match dtype {
        DType::F32 => {
            let xs = x.storage::<f32>();
            let ds: &mut [u32] = bytemuck::cast_slice_mut(dx.storage_mut::<f32>());
            ds.par_chunks_mut(CHUNK)
                .zip(xs.par_chunks(CHUNK))
                .for_each(|(d, x)| mask32(d, x));
        }
        _ => {
            let inf = infinity(dtype);
            let xs = half_bits(&x);
            let ds: &mut [u16] = bytemuck::cast_slice_mut(x_bytes(&mut dx));
            ds.par_chunks_mut(CHUNK)
                .zip(xs.par_chunks(CHUNK))
                .for_each(|(d, x)| mask16(d, x, inf));
        }
    }
    Ok(dx)
}

wide_simd! {
    /// f32 bit patterns `v` → `v` where the value is `> 0`, else `+0`.
    fn relu32(v: &mut [u32]) {
        for v in v.iter_mut() {
            *v &= keep32(f32::from_bits(*v));
        }
    }
}

wide_simd! {
    /// Half bit patterns `v` → `v` where the value is `> 0` (`inf`: the type's +∞), else `+0`.
    fn relu16(v: &mut [u16], inf: u16) {
        for v in v.iter_mut() {
            *v &= keep16(*v, inf);
        }
    }
}

wide_simd! {
    /// `d` (f32 bits) kept where `x > 0`, else `+0`.
    fn mask32(d: &mut [u32], x: &[f32]) {
        for (d, &x) in d.iter_mut().zip(x) {
            *d &= keep32(x);
        }
    }
}

wide_simd! {
    /// `d` (half bits) kept where the half `x` (bits) is `> 0`, else `+0`.
    fn mask16(d: &mut [u16], x: &[u16], inf: u16) {
        for (d, &x) in d.iter_mut().zip(x) {
            *d &= keep16(x, inf);
        }
    }
}

/// A half tensor's buffer, writable (the tensor is the last reference to it).
fn x_bytes(t: &mut FlexTensor) -> &mut [u8] {
    match t.dtype() {
        DType::F16 => bytemuck::cast_slice_mut(t.storage_mut::<burn::tensor::f16>()),
        _ => bytemuck::cast_slice_mut(t.storage_mut::<burn::tensor::bf16>()),
    }
}
