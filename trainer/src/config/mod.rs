//! Configuration: a TOML file plus `--set key=value` overrides, validated into [`Settings`].
//!
//! Every failure is one [`ConfigError`] line that names the key, the value and what is allowed.

mod backend;
mod data;
mod distributed;
mod memory;
mod mistakes;
mod model;
mod precision;
mod train;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use backend::{Autotune, AutotuneCache, BackendKind};
pub use data::DataSource;
pub use data::{DataSpec, TextSource, CIFAR10_IMAGES, NUM_CLASSES};
pub use distributed::{
    ws_address, DeviceSpec, DistributedSpec, NodeSpec, Shard, Strategy, DEFAULT_TIMEOUT_S,
    MAX_PEERS,
};
pub use memory::{parse_size, Checkpointing, FreeCache, Fuse, MemorySpec, SIZE_HELP};
pub use mistakes::Mistakes;
pub use model::ModelName;
pub use model::ModelSpec;
pub use precision::{
    unsupported_dtype, LossScaleKind, LossScaleSpec, PrecisionMode, PrecisionSpec, MAX_SCALE,
    MIN_SCALE,
};
pub use train::TrainSpec;
pub use train::{OptimizerName, ScheduleName, MAX_BATCH, MAX_EPOCHS, MAX_STEPS};

/// A whole config file as written: every key optional with its default; each section's
/// struct lives in the file that validates it.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawConfig {
    /// `[model]`
    pub model: model::RawModel,
    /// `[data]`
    pub data: data::RawData,
    /// `[train]`
    pub train: train::RawTrain,
    /// `[precision]`
    pub precision: precision::RawPrecision,
    /// `[backend]`
    pub backend: backend::RawBackend,
    /// `[memory]`
    pub memory: memory::RawMemory,
    /// `[distributed]`
    pub distributed: distributed::RawDistributed,
    /// `[mistakes]`
    pub mistakes: Mistakes,
}

/// A config that cannot be used. The binary prints it on one line and exits with code 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file is not TOML.
    #[error("{path}:{line}: not valid TOML: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// A `--set` argument without `=`.
    #[error("--set {0}: expected key=value, e.g. --set train.batch_size=32")]
    SetSyntax(String),
    /// A `--set` value spanning lines.
    #[error("--set {0}: a value must be on one line")]
    SetNewline(String),
    /// A key whose value has the wrong type or is unknown.
    #[error("{key}: {message}")]
    Key { key: String, message: String },
    /// A value of the right type outside what is allowed.
    #[error("{key} = {value}: {allowed}")]
    Value {
        key: &'static str,
        value: String,
        allowed: String,
    },
}

/// Everything the trainer runs on.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the config came from (for reports).
    pub path: PathBuf,
    /// The config after overrides, as TOML: stored in checkpoints and summaries.
    pub toml: String,
    pub model: ModelSpec,
    /// A CNN's input size (a GPT's: 0, it reads no images).
    pub input_size: usize,
    pub data: DataSpec,
    pub train: TrainSpec,
    pub precision: PrecisionSpec,
    pub backend: BackendKind,
    pub cuda_index: usize,
    /// `backend.autotune`: CubeCL's search level, when set.
    pub autotune: Option<Autotune>,
    /// `backend.autotune_cache`: where the search's choices are kept.
    pub autotune_cache: AutotuneCache,
    pub memory: MemorySpec,
    /// Teaching switches that make a memory mistake on purpose.
    pub mistakes: Mistakes,
    /// Data parallel over several devices; `None` on one device.
    pub distributed: Option<DistributedSpec>,
}

/// Reads `path`, applies `overrides` (`key=value`, value in TOML syntax or a bare string) and
/// validates the result.
pub fn load(path: &Path, overrides: &[String]) -> Result<Settings, ConfigError> {
    load_file_for(path, overrides, Purpose::Train)
}

/// Like [`load`], validated for `purpose`.
pub fn load_file_for(
    path: &Path,
    overrides: &[String],
    purpose: Purpose,
) -> Result<Settings, ConfigError> {
    let text = read_bounded(path, MAX_CONFIG_BYTES).map_err(|error| ConfigError::Read {
        path: path.to_owned(),
        error,
    })?;
    load_for(&text, path, overrides, purpose)
}

/// The largest config file read: configs are a few hundred bytes.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads a regular file of at most `max` bytes as UTF-8. A FIFO, a device (`/dev/zero`) or a
/// folder is refused before reading, so nothing blocks or reads without end.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    let too_big = || Error::new(ErrorKind::InvalidData, format!("larger than {max} bytes"));
    if meta.len() > max {
        return Err(too_big());
    }
    let mut text = String::new();
    // The file may grow between the check and the read: read one byte past the bound at most.
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(too_big());
    }
    Ok(text)
}

/// Like [`load`], for config text already in memory; `path` names it in messages.
pub fn load_str(text: &str, path: &Path, overrides: &[String]) -> Result<Settings, ConfigError> {
    load_for(text, path, overrides, Purpose::Train)
}

/// What the settings will be used for: an estimate needs no data, so any class count goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Training: the model must fit the data sets (10 classes).
    Train,
    /// `trainer estimate`: only the model and the step matter.
    Estimate,
}

/// Like [`load_str`], validated for `purpose`.
pub fn load_for(
    text: &str,
    path: &Path,
    overrides: &[String],
    purpose: Purpose,
) -> Result<Settings, ConfigError> {
    let mut table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax {
                path: path.to_owned(),
                line: e
                    .span()
                    .map_or(1, |span| 1 + text[..span.start].matches('\n').count()),
                message: one_line(e.message()),
            })?;
    // An override must not hide a bad value: a value it replaces is validated where it stood
    // (the file on its own, or the config as it was when a later `--set` replaced it).
    let file = table.clone();
    let mut file_checked = false;
    let mut assigned: Vec<String> = Vec::new();
    for arg in overrides {
        let before = table.clone();
        let (key, replaced) = apply_override(&mut table, arg)?;
        if assigned.contains(&key) {
            validate(path, deserialize(before)?, purpose)?;
        } else if replaced && !file_checked {
            validate(path, deserialize(file.clone())?, purpose)?;
            file_checked = true;
        }
        assigned.push(key);
    }
    validate(path, deserialize(table)?, purpose)
}

fn deserialize(table: toml::Table) -> Result<RawConfig, ConfigError> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError::Key {
        key: e.path().to_string(),
        message: strip_location(&one_line(&e.inner().to_string())),
    })
}

/// toml ends value errors with " in `a.b`"; the key is already named in front.
fn strip_location(message: &str) -> String {
    match message.rfind(" in `") {
        Some(i) if message.ends_with('`') => message[..i].to_string(),
        _ => message.to_string(),
    }
}

fn one_line(s: &str) -> String {
    s.trim().replace('\n', " ")
}

/// Sets a dotted `key` in `table` to `value`, creating sections as needed; returns the key
/// and whether it replaced a value.
fn apply_override(table: &mut toml::Table, arg: &str) -> Result<(String, bool), ConfigError> {
    let (key, value) = arg
        .split_once('=')
        .ok_or_else(|| ConfigError::SetSyntax(arg.into()))?;
    let key = key.trim();
    let value = value.trim();
    if key.is_empty() {
        return Err(ConfigError::SetSyntax(arg.into()));
    }
    if value.contains(['\n', '\r']) {
        // TOML would end the value at the newline and silently drop the rest.
        return Err(ConfigError::SetNewline(arg.escape_debug().to_string()));
    }
    // A value is TOML when it parses as one (`32`, `1e-3`, `"x"`, `true`), else a bare string.
    let value = format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.into()));
    let mut parts: Vec<&str> = key.split('.').collect();
    let leaf = parts.pop().unwrap_or(key);
    let mut node = table;
    for part in parts {
        let entry = node
            .entry(part)
            .or_insert_with(|| toml::Value::Table(Default::default()));
        node = entry.as_table_mut().ok_or_else(|| ConfigError::Key {
            key: part.into(),
            message: "is a value, not a section".into(),
        })?;
    }
    let replaced = node.insert(leaf.into(), value).is_some();
    Ok((key.to_string(), replaced))
}

/// An error for the first of `keys` that is set (`true`) though it does not apply; `applies`
/// says where it does, e.g. `only to model.name = "mobilenet"`.
pub(crate) fn not_set(keys: &[(&str, bool)], applies: &str) -> Result<(), ConfigError> {
    match keys.iter().find(|(_, set)| *set) {
        Some((key, _)) => Err(ConfigError::Key {
            key: key.to_string(),
            message: format!("applies {applies}"),
        }),
        None => Ok(()),
    }
}

/// `value` of `key` when it is at most `max`, else the error naming the bound.
pub fn at_most(key: &'static str, value: usize, max: usize) -> Result<usize, ConfigError> {
    if value > max {
        return Err(out_of_range(key, value, &format!("must be at most {max}")));
    }
    Ok(value)
}

/// A [`ConfigError::Value`]: `key` has `value`, outside what `allowed` says.
pub fn out_of_range(key: &'static str, value: impl ToString, allowed: &str) -> ConfigError {
    ConfigError::Value {
        key,
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

fn validate(path: &Path, raw: RawConfig, purpose: Purpose) -> Result<Settings, ConfigError> {
    let toml = toml::to_string(&raw).unwrap_or_default();
    let memory = memory::validate(&raw.memory)?;
    let model = model::validate(&raw.model)?;
    let input_size = match &model {
        ModelSpec::Gpt(_) => 0,
        _ => raw.model.input_size.unwrap_or(model::DEFAULT_INPUT_SIZE),
    };
    let consumer = match &model {
        ModelSpec::Gpt(c) => data::Consumer::Tokens(c.seq_len),
        _ => data::Consumer::Images(input_size),
    };
    let data = data::validate(&raw.data, consumer)?;
    match &model {
        ModelSpec::Gpt(c) => {
            if c.vocab_size < crate::data::text::VOCAB {
                return Err(out_of_range(
                    "model.vocab_size",
                    c.vocab_size,
                    "must be at least 256: text is read as byte-level tokens",
                ));
            }
            if memory.fuse == Fuse::Blocks {
                return Err(out_of_range(
                    "memory.fuse",
                    "\"blocks\"",
                    "fuses a CNN's conv blocks: model.name = \"gpt\" has none",
                ));
            }
        }
        _ if memory.checkpointing == Checkpointing::Blocks => {
            return Err(out_of_range(
                "memory.checkpointing",
                "\"blocks\"",
                "recomputes whole transformer blocks: model.name = \"gpt\" only (a CNN takes \
                 \"balanced\")",
            ));
        }
        _ if purpose == Purpose::Train && model.classes() != NUM_CLASSES => {
            return Err(out_of_range(
                "model.num_classes",
                model.classes(),
                "the data sets have 10 classes: must be 10",
            ));
        }
        _ => {}
    }
    let model = model
        .fused(memory.fuse == Fuse::Blocks)
        .checkpoint_blocks(memory.checkpointing == Checkpointing::Blocks);
    let train = train::validate(&raw.train, path)?;
    let precision = precision::validate(&raw.precision)?;
    let distributed = distributed::validate(&raw.distributed, raw.backend.kind)?;

    Ok(Settings {
        path: path.to_owned(),
        toml,
        model,
        input_size,
        data,
        train,
        precision,
        backend: raw.backend.kind,
        cuda_index: raw.backend.cuda_index,
        autotune: raw.backend.autotune,
        autotune_cache: raw.backend.autotune_cache.unwrap_or(AutotuneCache::Shared),
        memory,
        mistakes: raw.mistakes,
        distributed,
    })
}
