//! Normalisation and batching: byte images to `[B, 3, H, W]` f32 tensors on the device.

use burn::prelude::*;

use super::{rng::SplitMix64, ImageSet};

/// Per-channel mean and standard deviation of a train split, applied to every split.
#[derive(Debug, Clone)]
pub struct Batcher {
    mean: [f32; 3],
    inv_std: [f32; 3],
}

impl Batcher {
    /// Statistics of `train`, in [0, 1] pixel units.
    pub fn fit(train: &ImageSet) -> Self {
        let plane = train.size * train.size;
        let mut sum = [0f64; 3];
        let mut sq = [0f64; 3];
        for image in train.images.chunks_exact(3 * plane) {
            for c in 0..3 {
                for &p in &image[c * plane..(c + 1) * plane] {
                    let v = p as f64 / 255.0;
                    sum[c] += v;
                    sq[c] += v * v;
                }
            }
        }
        let n = (train.len() * plane).max(1) as f64;
        let mut mean = [0f32; 3];
        let mut inv_std = [1f32; 3];
        for c in 0..3 {
            let m = sum[c] / n;
            let var = (sq[c] / n - m * m).max(1e-12);
            mean[c] = m as f32;
            inv_std[c] = (1.0 / var.sqrt()) as f32;
        }
        Self { mean, inv_std }
    }

    /// The images at `indices`, normalised, and their labels.
    ///
    /// # Shapes
    /// → `([indices.len(), 3, size, size], [indices.len()])`
    pub fn batch<B: Backend>(
        &self,
        set: &ImageSet,
        indices: &[usize],
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        let plane = set.size * set.size;
        let bytes = set.image_bytes();
        let mut pixels = Vec::with_capacity(indices.len() * bytes);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            let image = &set.images[i * bytes..(i + 1) * bytes];
            for c in 0..3 {
                let (m, s) = (self.mean[c], self.inv_std[c]);
                pixels.extend(
                    image[c * plane..(c + 1) * plane]
                        .iter()
                        .map(|&p| (p as f32 / 255.0 - m) * s),
                );
            }
            labels.push(set.labels[i] as i64);
        }
        let shape = [indices.len(), 3, set.size, set.size];
        let images = Tensor::from_data(TensorData::new(pixels, shape), device);
        let labels = Tensor::from_data(TensorData::new(labels, [indices.len()]), device);
        (images, labels)
    }
}

/// `0..len` in an order fixed by `seed` and `epoch` (Fisher–Yates).
pub fn shuffled(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    let mut rng = SplitMix64::new(seed, 0x5EED_0000 + epoch);
    for i in (1..len).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order
}
