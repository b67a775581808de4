//! Checkpoints: model weights, optimizer state, the loop's position and the step log, written
//! at epoch ends, every `train.checkpoint_every` steps and when a run is interrupted.
//!
//! A checkpoint is a folder: `model.mpk`, `optim.mpk`, `state.json`, `steps.csv` and
//! `manifest.json`, written and swapped in as one set (see [`super::checkpoint_set`]).
//!
//! Resuming continues the *same* run. What defines the data order, the windows, the model and
//! the precision must not change ([`FIXED_ON_RESUME`]); everything else may (learning rate,
//! schedule length, `max_steps`, `epochs`, output paths, loss-scaling settings, memory
//! switches), and the new config's loss scaling wins over the saved scale.

use std::path::{Path, PathBuf};

use anyhow::Context;
use burn::module::AutodiffModule;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use super::accumulate::Position;
use super::checkpoint_set::{self, CheckpointError};
use super::optim::Optim;
use super::step::StepCounters;
use crate::config::Settings;

/// Where the loop stood when the checkpoint was written, and what run it belongs to:
/// `state.json`. Its keys are flat (`step`, `epoch`, `window`, `skipped`, `scaler`, …).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoopState {
    /// Epoch and window.
    #[serde(flatten)]
    pub position: Position,
    /// Steps taken and skipped, and the loss scale.
    #[serde(flatten)]
    pub counters: StepCounters,
    /// Model name, checked on resume.
    pub model: String,
    /// Optimizer name, checked on resume.
    pub optimizer: String,
    /// The config (after overrides) that produced the run.
    pub config: String,
}

impl LoopState {
    /// A run of `settings` at `position`, with the stepper's `counters`.
    pub fn of(settings: &Settings, position: Position, counters: StepCounters) -> Self {
        Self {
            position,
            counters,
            model: settings.model.name(),
            optimizer: settings.train.optimizer.name().into(),
            config: settings.toml.clone(),
        }
    }
}

/// Keys a resumed run must share with the checkpoint's run: the data order (data, seed, batch
/// and accumulation), the model, the optimizer kind and the precision.
pub const FIXED_ON_RESUME: [&str; 16] = [
    "model.name",
    "model.num_classes",
    "model.input_size",
    "model.width_multiplier",
    "model.stem_stride",
    "data.source",
    "data.path",
    "data.train_size",
    "data.eval_size",
    "data.seed",
    "train.batch_size",
    "train.accum_steps",
    "train.seed",
    "train.optimizer",
    "precision.mode",
    "precision.batch_norm_f32",
];

/// The files of a checkpoint set (besides its manifest).
pub const FILES: [&str; 4] = ["model.mpk", "optim.mpk", "state.json", "steps.csv"];

/// Writes `model`, `optim`, `state` and the step log (`steps_csv`) as one set into `dir`.
pub fn save<M: AutodiffModule<B>, B: AutodiffBackend>(
    dir: &Path,
    model: &M,
    optim: &Optim<M, B>,
    state: &LoopState,
    steps_csv: &str,
) -> anyhow::Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let tmp = checkpoint_set::begin(dir)?;
    let written = write_set(&tmp, model, optim, state, steps_csv)
        .and_then(|()| checkpoint_set::commit(&tmp, dir, &FILES));
    if written.is_err() {
        // A full disk or an I/O error leaves no partial set behind; the previous one stands.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    written
}

fn write_set<M: AutodiffModule<B>, B: AutodiffBackend>(
    tmp: &Path,
    model: &M,
    optim: &Optim<M, B>,
    state: &LoopState,
    steps_csv: &str,
) -> anyhow::Result<()> {
    model
        .clone()
        .save_file(
            tmp.join("model"),
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
        )
        .with_context(|| format!("writing {}", tmp.join("model.mpk").display()))?;
    optim.save(&tmp.join("optim"))?;
    for (name, text) in [
        ("state.json", serde_json::to_string_pretty(state)? + "\n"),
        ("steps.csv", steps_csv.to_string()),
    ] {
        let path = tmp.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A verified checkpoint: the loop's state and the step log as written.
pub struct Saved {
    /// Where the set was read from.
    pub dir: PathBuf,
    /// `state.json`.
    pub state: LoopState,
    /// `steps.csv`.
    pub steps_csv: String,
}

/// Reads and verifies the checkpoint at `dir` and checks that `settings` continue its run.
pub fn read(dir: &Path, settings: &Settings) -> Result<Saved, CheckpointError> {
    let set = checkpoint_set::locate(dir)?;
    checkpoint_set::verify(&set, &FILES)?;
    let read = |name: &str| {
        let path = set.join(name);
        std::fs::read_to_string(&path).map_err(|e| CheckpointError::Corrupt {
            path: path.clone(),
            what: format!("unreadable: {e}"),
        })
    };
    let state_path = set.join("state.json");
    let state: LoopState =
        serde_json::from_str(&read("state.json")?).map_err(|e| CheckpointError::Corrupt {
            path: state_path,
            what: format!("not a loop state: {e}"),
        })?;
    let changed = changed_keys(&state.config, &settings.toml);
    if !changed.is_empty() {
        return Err(CheckpointError::Mismatch {
            dir: dir.to_path_buf(),
            message: format!(
                "the config changes {} from the checkpoint's run; these define the data order, \
                 the windows, the model or the precision and cannot change on resume (the \
                 learning rate and its schedule, max_steps, epochs, output paths, loss scaling \
                 and the [memory] switches can)",
                changed.join(", ")
            ),
        });
    }
    let steps_csv = read("steps.csv")?;
    Ok(Saved {
        dir: set,
        state,
        steps_csv,
    })
}

/// `key saved → now` for every key of [`FIXED_ON_RESUME`] that differs between two configs
/// (each the TOML a run was validated from).
fn changed_keys(saved: &str, now: &str) -> Vec<String> {
    let (saved, now) = (
        saved.parse::<toml::Table>().unwrap_or_default(),
        now.parse::<toml::Table>().unwrap_or_default(),
    );
    let get = |t: &toml::Table, key: &str| -> String {
        let (section, leaf) = key.split_once('.').unwrap_or(("", key));
        t.get(section)
            .and_then(|s| s.get(leaf))
            .map_or_else(|| "(default)".into(), ToString::to_string)
    };
    FIXED_ON_RESUME
        .iter()
        .filter_map(|key| {
            let (a, b) = (get(&saved, key), get(&now, key));
            (a != b).then(|| format!("{key} {a} → {b}"))
        })
        .collect()
}

/// Loads the weights and optimizer state of a verified checkpoint.
pub fn load<M: AutodiffModule<B>, B: AutodiffBackend>(
    saved: &Saved,
    model: M,
    optim: Optim<M, B>,
    device: &B::Device,
) -> anyhow::Result<(M, Optim<M, B>)> {
    let model = model
        .load_file(
            saved.dir.join("model"),
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            device,
        )
        .map_err(|e| CheckpointError::Corrupt {
            path: saved.dir.join("model.mpk"),
            what: format!("does not fit this model: {e}"),
        })?;
    let optim = optim.load(&saved.dir.join("optim"), device)?;
    Ok((model, optim))
}

/// The default checkpoint folder inside a run's output folder.
pub fn dir(output: &Path) -> PathBuf {
    output.join("checkpoint")
}

/// "the last checkpoint in DIR is intact", or that none was written yet: for failure messages.
pub fn describe(dir: &Path) -> String {
    match checkpoint_set::locate(dir) {
        Ok(set) => format!(
            "the last checkpoint in {} is intact (--resume {})",
            set.display(),
            set.display()
        ),
        Err(_) => "no checkpoint had been written yet".into(),
    }
}

/// Whether `dir` holds a checkpoint set (complete or cut short by a crash mid-swap).
pub fn exists(dir: &Path) -> bool {
    checkpoint_set::locate(dir).is_ok()
}
