//! Images and labels: the built-in synthetic set and CIFAR-10, normalised and batched; and text
//! as byte-level tokens ([`text`]).

mod batcher;
mod cifar10;
mod rng;
mod synthetic;
pub mod text;

use std::path::PathBuf;

pub use batcher::{shuffled, Batcher};
pub use cifar10::load_cifar10;
pub use rng::SplitMix64;
pub use synthetic::generate;

use crate::config::DataSpec;

/// An image set held as bytes: `images` is `[len, 3, size, size]`, channel planes R, G, B.
#[derive(Debug, Clone)]
pub struct ImageSet {
    pub images: Vec<u8>,
    pub labels: Vec<u8>,
    pub size: usize,
}

impl ImageSet {
    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Bytes per image.
    pub fn image_bytes(&self) -> usize {
        3 * self.size * self.size
    }
}

/// A train and an eval split.
#[derive(Debug, Clone)]
pub struct Splits {
    pub train: ImageSet,
    pub eval: ImageSet,
}

/// Data that cannot be loaded: each names the file and, where it applies, the record.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file is missing or unreadable.
    #[error("cannot read {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A file whose size is not a whole number of records.
    #[error("{path}: size {size} bytes is not a multiple of 3073 (1 label byte + 3072 pixel bytes per record)")]
    Size { path: PathBuf, size: usize },
    /// A file far larger than a CIFAR-10 batch.
    #[error("{path}: {size} bytes is more than a CIFAR-10 batch file holds (at most 64 MiB)")]
    TooLarge { path: PathBuf, size: u64 },
    /// A split without a single record.
    #[error("no images in {}: every file of the split is empty", paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    Empty { paths: Vec<PathBuf> },
    /// A text file over the size bound.
    #[error("{path}: more than {max} bytes (the most a text file may hold)")]
    TextTooLarge { path: PathBuf, max: u64 },
    /// A text file that is not UTF-8.
    #[error("{path}: not UTF-8 text (invalid byte sequence at byte {offset})")]
    NotUtf8 { path: PathBuf, offset: usize },
    /// A text file too short for one window in each split.
    #[error("{path}: too short: at least {needed} bytes give train and eval one window of seq_len + 1 tokens each")]
    TextTooShort { path: PathBuf, needed: usize },
    /// A label outside 0..=9.
    #[error("{path}: record {record}: label {label} is not in 0..=9")]
    Label {
        path: PathBuf,
        record: usize,
        label: u8,
    },
}

/// Loads the splits a config names; synthetic images are drawn at `size`×`size`.
pub fn load(spec: &DataSpec, size: usize) -> Result<Splits, DataError> {
    match spec {
        DataSpec::Synthetic {
            train_size,
            eval_size,
            seed,
        } => Ok(Splits {
            train: generate(*train_size, size, *seed, 0),
            eval: generate(*eval_size, size, *seed, 1),
        }),
        DataSpec::Cifar10 { path } => load_cifar10(path),
    }
}
