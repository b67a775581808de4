//! Images and labels: the built-in synthetic set and CIFAR-10, normalised and batched; and text
//! as byte-level tokens ([`text`]).

mod batcher;
mod cifar10;
mod rng;
mod synthetic;
pub mod text;

use std::path::PathBuf;

use burn::prelude::*;

pub use batcher::{shuffled, Batcher};
pub use cifar10::load_cifar10;
pub use rng::SplitMix64;
pub use synthetic::generate;
pub use text::TokenSet;

use crate::config::{DataSpec, TextSource};

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

/// A train and an eval split, and what turns their samples into batches.
#[derive(Debug, Clone)]
pub enum Splits {
    /// Images and labels, normalised by the train split's statistics.
    Images {
        train: ImageSet,
        eval: ImageSet,
        batcher: Batcher,
    },
    /// Windows of byte-level tokens.
    Tokens { train: TokenSet, eval: TokenSet },
}

/// Which split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Trained on.
    Train,
    /// Evaluated on.
    Eval,
}

/// One micro-batch on the device.
#[derive(Debug, Clone)]
pub enum Batch<B: Backend> {
    /// Normalised images `[n, 3, size, size]` and their labels `[n]`.
    Images {
        images: Tensor<B, 4>,
        labels: Tensor<B, 1, Int>,
    },
    /// Token windows `[n, seq_len]` and the same one token on (the targets).
    Tokens {
        inputs: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
    },
}

impl<B: Backend> From<(Tensor<B, 4>, Tensor<B, 1, Int>)> for Batch<B> {
    fn from((images, labels): (Tensor<B, 4>, Tensor<B, 1, Int>)) -> Self {
        Self::Images { images, labels }
    }
}

impl Splits {
    /// Samples (images or windows) in `split`.
    pub fn len(&self, split: Split) -> usize {
        match (self, split) {
            (Self::Images { train, .. }, Split::Train) => train.len(),
            (Self::Images { eval, .. }, Split::Eval) => eval.len(),
            (Self::Tokens { train, .. }, Split::Train) => train.len(),
            (Self::Tokens { eval, .. }, Split::Eval) => eval.len(),
        }
    }

    /// The samples of `split` at `indices`, as a batch on `device`.
    pub fn batch<B: Backend>(
        &self,
        split: Split,
        indices: &[usize],
        device: &B::Device,
    ) -> Batch<B> {
        match self {
            Self::Images {
                train,
                eval,
                batcher,
            } => {
                let set = if split == Split::Train { train } else { eval };
                batcher.batch::<B>(set, indices, device).into()
            }
            Self::Tokens { train, eval } => {
                let set = if split == Split::Train { train } else { eval };
                let (inputs, targets) = set.batch::<B>(indices, device);
                Batch::Tokens { inputs, targets }
            }
        }
    }
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
    let images = |(train, eval): (ImageSet, ImageSet)| {
        let batcher = Batcher::fit(&train);
        Splits::Images {
            train,
            eval,
            batcher,
        }
    };
    match spec {
        DataSpec::Synthetic {
            train_size,
            eval_size,
            seed,
        } => Ok(images((
            generate(*train_size, size, *seed, 0),
            generate(*eval_size, size, *seed, 1),
        ))),
        DataSpec::Cifar10 { path } => load_cifar10(path).map(images),
        DataSpec::Text {
            text,
            seq_len,
            eval_windows,
        } => {
            let splits = match text {
                TextSource::File(path) => text::load_text(path, *seq_len)?,
                // The config check sized the corpus for a window in each split.
                TextSource::Corpus { bytes, seed } => text::corpus_splits(*bytes, *seed, *seq_len)
                    .map_err(|needed| DataError::TextTooShort {
                        path: PathBuf::from("the built-in corpus"),
                        needed,
                    })?,
            };
            Ok(Splits::Tokens {
                train: TokenSet::new(splits.train, *seq_len, usize::MAX),
                eval: TokenSet::new(splits.eval, *seq_len, *eval_windows),
            })
        }
    }
}
