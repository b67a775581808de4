//! `[data]`: synthetic images or CIFAR-10 on disk.

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
}

/// `[data]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawData {
    pub source: DataSource,
    pub path: Option<String>,
    /// Synthetic only (default [`DEFAULT_TRAIN_SIZE`]).
    pub train_size: Option<usize>,
    /// Synthetic only (default [`DEFAULT_EVAL_SIZE`]).
    pub eval_size: Option<usize>,
    pub seed: u64,
}

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
}

impl DataSpec {
    /// Images in both splits together (what the host holds while training).
    pub fn images(&self) -> usize {
        match self {
            Self::Synthetic {
                train_size,
                eval_size,
                ..
            } => train_size + eval_size,
            Self::Cifar10 { .. } => CIFAR10_IMAGES,
        }
    }

    /// Images in the train split: no window holds more.
    pub fn train_images(&self) -> usize {
        match self {
            Self::Synthetic { train_size, .. } => *train_size,
            Self::Cifar10 { .. } => CIFAR10_TRAIN_IMAGES,
        }
    }
}

/// Images in CIFAR-10's five train files.
pub const CIFAR10_TRAIN_IMAGES: usize = 50_000;

/// Checks `[data]` against the model's `input_size`.
pub fn validate(d: &RawData, input_size: usize) -> Result<DataSpec, ConfigError> {
    let data = match d.source {
        DataSource::Synthetic => {
            not_set(
                &[("data.path", d.path.is_some())],
                "only to data.source = \"cifar10\"",
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
    };
    Ok(data)
}
