//! The one way the kernels call gemm: every call goes through [`gemm_into`] or [`gemm_new`],
//! which check sizes and the reach of every stride before the raw call.

/// The checked wrapper every gemm call of the CPU kernels goes through: `dst [rows, cols]`
/// (row stride `dst_rs`, column stride 1) `= or +=` `lhs [rows, inner] · rhs [inner, cols]`,
/// each operand a slice with its (row, column) strides. Panics, before gemm runs, when a size
/// is zero or a stride reaches past its slice (computed without overflow), so no call reads or
/// writes outside the slices it was given.
pub(crate) fn gemm_into(
    (rows, cols, inner): (usize, usize, usize),
    (dst, dst_rs): (&mut [f32], usize),
    add: bool,
    lhs: (&[f32], (usize, usize)),
    rhs: (&[f32], (usize, usize)),
    parallel: bool,
) {
    assert!(
        dst_rs >= cols && reach(rows, cols, dst_rs, 1).is_some_and(|r| r <= dst.len()),
        "gemm: the destination [{rows}, {cols}] (row stride {dst_rs}) overlaps itself or lies \
         outside its {} values",
        dst.len()
    );
    // SAFETY: the assert keeps every destination address inside `dst`, which holds
    // initialised values (read when `add`), and no two of them equal (rows do not overlap:
    // gemm's threads write disjoint values); gemm_raw checks the operands.
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
pub(crate) fn gemm_new(
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
/// for reads there when `add`, and those addresses distinct (`dst_rs ≥ cols`).
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
