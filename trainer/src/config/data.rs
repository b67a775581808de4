//! `[data]`: synthetic images or CIFAR-10 on disk.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{out_of_range, ConfigError};

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
    pub train_size: usize,
    pub eval_size: usize,
    pub seed: u64,
}

impl Default for RawData {
    fn default() -> Self {
        Self {
            source: DataSource::Synthetic,
            path: None,
            train_size: 8192,
            eval_size: 2048,
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
}

/// Checks `[data]` against the model's `input_size`.
pub fn validate(d: &RawData, input_size: usize) -> Result<DataSpec, ConfigError> {
    let data = match d.source {
        DataSource::Synthetic => {
            if d.path.is_some() {
                return Err(ConfigError::Key {
                    key: "data.path".into(),
                    message: "applies only to data.source = \"cifar10\"".into(),
                });
            }
            if d.train_size == 0 {
                return Err(out_of_range("data.train_size", 0, "must be at least 1"));
            }
            if d.eval_size == 0 {
                return Err(out_of_range("data.eval_size", 0, "must be at least 1"));
            }
            DataSpec::Synthetic {
                train_size: d.train_size,
                eval_size: d.eval_size,
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
