//! The slices the fused conv → ReLU → pool block works in: by its own output on CubeCL, by the
//! CPU's cache size on the CPU; every image in exactly one slice.

use oomlab_engine::slices::{bounded_limit, slice_values, slices_of, SLICE_VALUES};

/// Every image in exactly one slice, in order.
fn covered(slices: &[(usize, usize)], batch: usize) {
    let mut next = 0;
    for &(start, len) in slices {
        assert!(len >= 1 && start == next, "{slices:?}");
        next += len;
    }
    assert_eq!(next, batch, "{slices:?}");
}

#[test]
fn cubecl_slices_the_fused_block_by_its_output() {
    // SimpleModel: 64·32·32 conv values per image, a 2×2 pool (budget: a quarter).
    let per_image = 65_536;
    for (batch, want) in [(32, vec![8; 4]), (33, vec![8, 8, 8, 8, 1]), (3, vec![1; 3])] {
        let limit = Some(bounded_limit(None, batch * per_image / 4));
        let slices: Vec<_> = slices_of(limit, batch, per_image).collect();
        covered(&slices, batch);
        assert_eq!(slices.iter().map(|s| s.1).collect::<Vec<_>>(), want);
        let values = slice_values(limit, batch as u64, per_image as u64);
        assert_eq!(values, want[0] as u64 * per_image as u64);
    }
}

#[test]
fn the_cpu_keeps_its_cache_sized_slices_whatever_the_budget() {
    for budget in [1, 1 << 16, 1 << 30] {
        let limit = Some(bounded_limit(Some(SLICE_VALUES), budget));
        let slices: Vec<_> = slices_of(limit, 128, 65_536).collect();
        covered(&slices, 128);
        assert_eq!(slices.len(), 128, "budget {budget}");
    }
}
