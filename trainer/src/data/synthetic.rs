//! Procedurally generated images in ten classes that a CNN can learn.
//!
//! Class `c` is a shape (`c % 5`: square, disc, horizontal bar, vertical bar, ring) in a hue
//! near `36°·c`, at a jittered position and scale, on a noisy background. Hues of neighbouring
//! classes overlap, so colour alone does not decide the class: the shape must be seen too.

use super::{rng::SplitMix64, ImageSet};
use crate::config::NUM_CLASSES;

/// `len` images of `size`×`size`; `split` 0 is train, 1 is eval (disjoint streams).
pub fn generate(len: usize, size: usize, seed: u64, split: u64) -> ImageSet {
    let plane = size * size;
    let mut images = vec![0u8; len * 3 * plane];
    let mut labels = Vec::with_capacity(len);
    for (i, image) in images.chunks_exact_mut(3 * plane).enumerate() {
        let mut rng = SplitMix64::new(seed.wrapping_mul(1_000_003).wrapping_add(split), i as u64);
        let label = rng.below(NUM_CLASSES);
        draw(image, size, label, &mut rng);
        labels.push(label as u8);
    }
    ImageSet {
        images,
        labels,
        size,
    }
}

fn draw(image: &mut [u8], size: usize, label: usize, rng: &mut SplitMix64) {
    let s = size as f64;
    let background = hsv(
        rng.range(0.0, 360.0),
        rng.range(0.0, 0.3),
        rng.range(0.2, 0.6),
    );
    let colour = hsv(
        36.0 * label as f64 + rng.range(-30.0, 30.0),
        rng.range(0.6, 1.0),
        rng.range(0.7, 1.0),
    );
    let (cx, cy) = (s * rng.range(0.3, 0.7), s * rng.range(0.3, 0.7));
    let r = s * rng.range(0.18, 0.3);
    let plane = size * size;
    for y in 0..size {
        for x in 0..size {
            let (dx, dy) = (x as f64 + 0.5 - cx, y as f64 + 0.5 - cy);
            let inside = match label % 5 {
                0 => dx.abs() < r && dy.abs() < r,
                1 => dx * dx + dy * dy < r * r,
                2 => dx.abs() < 1.4 * r && dy.abs() < 0.35 * r,
                3 => dx.abs() < 0.35 * r && dy.abs() < 1.4 * r,
                _ => {
                    let d = (dx * dx + dy * dy).sqrt();
                    d < r && d > 0.55 * r
                }
            };
            let base = if inside { colour } else { background };
            for (c, value) in base.iter().enumerate() {
                let noise = 40.0 * (rng.unit() + rng.unit() - 1.0);
                image[c * plane + y * size + x] = (value * 255.0 + noise).clamp(0.0, 255.0) as u8;
            }
        }
    }
}

/// HSV (hue in degrees) to RGB in [0, 1].
fn hsv(h: f64, s: f64, v: f64) -> [f64; 3] {
    let h = h.rem_euclid(360.0) / 60.0;
    let c = v * s;
    let x = c * (1.0 - (h % 2.0 - 1.0).abs());
    let (r, g, b) = match h as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = v - c;
    [r + m, g + m, b + m]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_images_other_split_other_images() {
        let a = generate(20, 32, 7, 0);
        assert_eq!(a.images, generate(20, 32, 7, 0).images);
        assert_eq!(a.labels, generate(20, 32, 7, 0).labels);
        assert_ne!(a.images, generate(20, 32, 7, 1).images);
        assert_ne!(a.images, generate(20, 32, 8, 0).images);
    }

    #[test]
    fn every_class_appears() {
        let set = generate(500, 32, 0, 0);
        for c in 0..NUM_CLASSES as u8 {
            assert!(set.labels.contains(&c), "class {c} missing");
        }
        assert_eq!(set.images.len(), 500 * 3 * 32 * 32);
    }
}
