//! `[data]`: synthetic images or CIFAR-10 on disk for the CNNs; text for the GPT.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{at_most, not_set, out_of_range, ConfigError};

/// Where the images come from.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataSource {
    /// Built-in procedurally generated images: nothing to download.
    #[default]
    Synthetic,
    /// The CIFAR-10 binary version in `data.path`.
    Cifar10,
    /// Byte-level text: the UTF-8 file in `data.path`, or the built-in corpus without one.
    Text,
}

/// `[data]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawData {
    pub source: DataSource,
    pub path: Option<String>,
    /// Synthetic only (default [`DEFAULT_TRAIN_SIZE`]).
    pub train_size: Option<usize>,
    /// Synthetic images (default [`DEFAULT_EVAL_SIZE`]); text: the most eval windows (default
    /// [`DEFAULT_EVAL_WINDOWS`]).
    pub eval_size: Option<usize>,
    /// Text without `data.path`: the built-in corpus's size in bytes (default
    /// [`DEFAULT_CORPUS_BYTES`]).
    pub corpus_bytes: Option<usize>,
    pub seed: u64,
}

/// Bytes of the built-in corpus when `data.corpus_bytes` is left out: 1 MiB, about
/// tiny-shakespeare's size.
pub const DEFAULT_CORPUS_BYTES: usize = 1 << 20;
/// The largest built-in corpus.
pub const MAX_CORPUS_BYTES: usize = 1 << 30;
/// Eval windows when `data.eval_size` is left out for text (from the eval split's start).
pub const DEFAULT_EVAL_WINDOWS: usize = 256;

/// Synthetic train images when `data.train_size` is left out.
pub const DEFAULT_TRAIN_SIZE: usize = 8192;
/// Synthetic eval images when `data.eval_size` is left out.
pub const DEFAULT_EVAL_SIZE: usize = 2048;
/// Largest `data.train_size` and `data.eval_size`.
pub const MAX_IMAGES: usize = 10_000_000;

impl Default for RawData {
    fn default() -> Self {
        Self {
            source: DataSource::Synthetic,
            path: None,
            train_size: None,
            eval_size: None,
            corpus_bytes: None,
            seed: 0,
        }
    }
}

/// Both data sets have ten classes.
pub const NUM_CLASSES: usize = 10;

/// Images in the CIFAR-10 binary version: 5 × 10,000 train and 10,000 test.
pub const CIFAR10_IMAGES: usize = 60_000;

/// The data to train on, validated.
#[derive(Debug, Clone)]
pub enum DataSpec {
    /// Built-in synthetic images.
    Synthetic {
        train_size: usize,
        eval_size: usize,
        seed: u64,
    },
    /// CIFAR-10 binary files in a directory.
    Cifar10 { path: PathBuf },
    /// Byte-level text cut into windows of `seq_len + 1` tokens.
    Text {
        /// The file, or the built-in corpus.
        text: TextSource,
        /// Tokens per window (the model's).
        seq_len: usize,
        /// The most eval windows.
        eval_windows: usize,
    },
}

/// Where the text comes from.
#[derive(Debug, Clone)]
pub enum TextSource {
    /// A UTF-8 file.
    File(PathBuf),
    /// The built-in corpus: `bytes` bytes drawn from `seed`.
    Corpus { bytes: usize, seed: u64 },
}

impl TextSource {
    /// Bytes of text: the corpus's size, or the file's as it is now (0 if unreadable; the
    /// reader bounds it and names the error).
    pub fn bytes(&self) -> u64 {
        match self {
            Self::Corpus { bytes, .. } => *bytes as u64,
            Self::File(path) => std::fs::metadata(path).map_or(0, |m| m.len()),
        }
    }
}

impl DataSpec {
    /// Bytes both splits take in host memory: u8 pixels and a label per image of
    /// `image_size`², or a byte per token.
    pub fn host_bytes(&self, image_size: usize) -> u64 {
        let per_image = 3 * (image_size as u64).pow(2) + 1;
        match self {
            Self::Synthetic {
                train_size,
                eval_size,
                ..
            } => (train_size + eval_size) as u64 * per_image,
            Self::Cifar10 { .. } => CIFAR10_IMAGES as u64 * per_image,
            Self::Text { text, .. } => text.bytes(),
        }
    }

    /// Samples in the train split (images, or windows of text): no window holds more.
    pub fn train_samples(&self) -> usize {
        match self {
            Self::Synthetic { train_size, .. } => *train_size,
            Self::Cifar10 { .. } => CIFAR10_TRAIN_IMAGES,
            Self::Text { text, seq_len, .. } => {
                let bytes = text.bytes() as usize;
                let train = bytes - crate::data::text::eval_bytes(bytes);
                crate::data::text::windows_in(train, *seq_len)
            }
        }
    }

    /// Text: the longest `seq_len` at which the train split still holds `batch` windows and the
    /// eval split one (0 where none does); images: `None`.
    pub fn longest_seq_len(&self, batch: usize) -> Option<usize> {
        let Self::Text { text, .. } = self else {
            return None;
        };
        let bytes = text.bytes() as usize;
        let eval = crate::data::text::eval_bytes(bytes);
        // windows_in(train, s) = (train − 1) / s ≥ batch; an eval window needs s + 1 bytes.
        let train = (bytes - eval).saturating_sub(1) / batch.max(1);
        Some(train.min(eval.saturating_sub(1)))
    }
}

/// Images in CIFAR-10's five train files.
pub const CIFAR10_TRAIN_IMAGES: usize = 50_000;

/// What the data must fit: a CNN's input size, or a language model's window.
#[derive(Debug, Clone, Copy)]
pub enum Consumer {
    /// A CNN of this input size.
    Images(usize),
    /// A language model of this `seq_len`.
    Tokens(usize),
}

/// Checks `[data]` against the model that reads it.
pub fn validate(d: &RawData, model: Consumer) -> Result<DataSpec, ConfigError> {
    if d.source != DataSource::Text {
        not_set(
            &[("data.corpus_bytes", d.corpus_bytes.is_some())],
            "only to data.source = \"text\"",
        )?;
    }
    let input_size = match (model, d.source) {
        (Consumer::Tokens(seq_len), DataSource::Text) => return text(d, seq_len),
        (Consumer::Images(size), DataSource::Synthetic | DataSource::Cifar10) => size,
        (Consumer::Tokens(_), _) => {
            return Err(ConfigError::Key {
                key: "data.source".into(),
                message:
                    "must be \"text\" for model.name = \"gpt\" (a language model reads tokens)"
                        .into(),
            })
        }
        (Consumer::Images(_), DataSource::Text) => {
            return Err(ConfigError::Key {
                key: "data.source".into(),
                message: "\"text\" is for model.name = \"gpt\" (this model reads images)".into(),
            })
        }
    };
    let data = match d.source {
        DataSource::Synthetic => {
            not_set(
                &[("data.path", d.path.is_some())],
                "only to data.source = \"cifar10\" or \"text\"",
            )?;
            let size = |key: &'static str, value: Option<usize>, default: usize| {
                let n = value.unwrap_or(default);
                if n == 0 {
                    return Err(out_of_range(key, 0, "must be at least 1"));
                }
                at_most(key, n, MAX_IMAGES)
            };
            DataSpec::Synthetic {
                train_size: size("data.train_size", d.train_size, DEFAULT_TRAIN_SIZE)?,
                eval_size: size("data.eval_size", d.eval_size, DEFAULT_EVAL_SIZE)?,
                seed: d.seed,
            }
        }
        DataSource::Cifar10 => {
            let Some(dir) = &d.path else {
                return Err(ConfigError::Key {
                    key: "data.path".into(),
                    message: "is required when data.source = \"cifar10\" (the folder holding data_batch_1.bin … test_batch.bin)".into(),
                });
            };
            not_set(
                &[
                    ("data.train_size", d.train_size.is_some()),
                    ("data.eval_size", d.eval_size.is_some()),
                ],
                "only to data.source = \"synthetic\" (CIFAR-10 has 50,000 train and 10,000 \
                 test images)",
            )?;
            if input_size != 32 {
                return Err(out_of_range(
                    "model.input_size",
                    input_size,
                    "CIFAR-10 images are 32×32: must be 32",
                ));
            }
            DataSpec::Cifar10 {
                path: PathBuf::from(dir),
            }
        }
        DataSource::Text => unreachable!("handled above"),
    };
    Ok(data)
}

/// Checks `[data]` for text read by a model of `seq_len` tokens.
fn text(d: &RawData, seq_len: usize) -> Result<DataSpec, ConfigError> {
    not_set(
        &[("data.train_size", d.train_size.is_some())],
        "only to images (text: data.corpus_bytes sizes the built-in corpus)",
    )?;
    let eval_windows = d.eval_size.unwrap_or(DEFAULT_EVAL_WINDOWS);
    if eval_windows == 0 {
        return Err(out_of_range("data.eval_size", 0, "must be at least 1"));
    }
    at_most("data.eval_size", eval_windows, MAX_IMAGES)?;
    let text = match &d.path {
        Some(path) => {
            not_set(
                &[("data.corpus_bytes", d.corpus_bytes.is_some())],
                "only to the built-in corpus (data.source = \"text\" without data.path)",
            )?;
            TextSource::File(PathBuf::from(path))
        }
        None => {
            let bytes = d.corpus_bytes.unwrap_or(DEFAULT_CORPUS_BYTES);
            at_most("data.corpus_bytes", bytes, MAX_CORPUS_BYTES)?;
            // Each split must hold one window of seq_len + 1 tokens (the reader's bound).
            let least = crate::data::text::least_bytes(seq_len);
            if bytes < least {
                return Err(out_of_range(
                    "data.corpus_bytes",
                    bytes,
                    &format!(
                        "must be at least {least} for model.seq_len = {seq_len} (one window \
                         of seq_len + 1 tokens in each split)"
                    ),
                ));
            }
            TextSource::Corpus {
                bytes,
                seed: d.seed,
            }
        }
    };
    Ok(DataSpec::Text {
        text,
        seq_len,
        eval_windows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::text::{eval_bytes, windows_in};

    /// The longest seq_len is the last at which the train split holds the batch and the eval
    /// split a window; one more loses one of them.
    #[test]
    fn the_longest_seq_len_is_where_the_text_stops_holding_a_batch() {
        for bytes in [0, 1, 10, 25, 1000, 4097, 65_536, 1 << 20] {
            for batch in [1, 2, 3, 32, 1000] {
                let spec = DataSpec::Text {
                    text: TextSource::Corpus { bytes, seed: 0 },
                    seq_len: 8,
                    eval_windows: 1,
                };
                let longest = spec.longest_seq_len(batch).unwrap();
                let (eval, train) = (eval_bytes(bytes), bytes - eval_bytes(bytes));
                let holds = |s: usize| windows_in(train, s) >= batch && eval > s;
                if longest > 0 {
                    assert!(holds(longest), "{bytes} bytes, batch {batch}: {longest}");
                }
                assert!(
                    !holds(longest + 1),
                    "{bytes} bytes, batch {batch}: {longest}"
                );
            }
        }
        let images = DataSpec::Cifar10 { path: "x".into() };
        assert_eq!(images.longest_seq_len(1), None);
    }
}
