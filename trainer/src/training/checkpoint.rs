//! Checkpoints: model weights, optimizer state and the loop's position, written at epoch ends.
//!
//! A checkpoint is a folder: `model.mpk`, `optim.mpk`, `state.json`. Files are written under
//! temporary names and renamed, so a crash mid-write leaves the previous checkpoint whole.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use burn::module::AutodiffModule;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use super::accumulate::Position;
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

/// Writes `model`, `optim` and `state` into `dir`.
pub fn save<M: AutodiffModule<B>, B: AutodiffBackend>(
    dir: &Path,
    model: &M,
    optim: &Optim<M, B>,
    state: &LoopState,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating checkpoint folder {}", dir.display()))?;
    let tmp = dir.join(".partial");
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    model
        .clone()
        .save_file(
            tmp.join("model"),
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
        )
        .with_context(|| format!("writing {}", tmp.join("model.mpk").display()))?;
    optim.save(&tmp.join("optim"))?;
    let state_path = tmp.join("state.json");
    std::fs::write(&state_path, serde_json::to_string_pretty(state)?)
        .with_context(|| format!("writing {}", state_path.display()))?;
    for name in ["model.mpk", "optim.mpk", "state.json"] {
        let (from, to) = (tmp.join(name), dir.join(name));
        std::fs::rename(&from, &to)
            .with_context(|| format!("moving {} to {}", from.display(), to.display()))?;
    }
    std::fs::remove_dir(&tmp).ok();
    Ok(())
}

/// Reads a checkpoint folder back into `model` and `optim`, checking it fits the config.
pub fn load<M: AutodiffModule<B>, B: AutodiffBackend>(
    dir: &Path,
    model: M,
    optim: Optim<M, B>,
    expect: &LoopState,
    device: &B::Device,
) -> anyhow::Result<(M, Optim<M, B>, LoopState)> {
    let state_path = dir.join("state.json");
    let text = std::fs::read_to_string(&state_path).with_context(|| {
        format!(
            "--resume {}: no checkpoint there ({} unreadable)",
            dir.display(),
            state_path.display()
        )
    })?;
    let state: LoopState =
        serde_json::from_str(&text).with_context(|| format!("reading {}", state_path.display()))?;
    for (what, saved, now) in [
        ("model", &state.model, &expect.model),
        ("optimizer", &state.optimizer, &expect.optimizer),
    ] {
        if saved != now {
            bail!(
                "--resume {}: checkpoint {what} is {saved}, the config's is {now}",
                dir.display()
            );
        }
    }
    let model = model
        .load_file(
            dir.join("model"),
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            device,
        )
        .with_context(|| format!("reading {}", dir.join("model.mpk").display()))?;
    let optim = optim.load(&dir.join("optim"), device)?;
    Ok((model, optim, state))
}

/// The default checkpoint folder inside a run's output folder.
pub fn dir(output: &Path) -> PathBuf {
    output.join("checkpoint")
}

/// "the last checkpoint in DIR is intact", or that none was written yet: for failure messages.
pub fn describe(dir: &Path) -> String {
    if dir.join("state.json").exists() {
        format!("the last checkpoint in {} is intact", dir.display())
    } else {
        "no checkpoint had been written yet".into()
    }
}
