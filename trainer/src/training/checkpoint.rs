//! Checkpoints: model weights, optimizer state, the loop's position and the step log, written
//! at epoch ends, every `train.checkpoint_every` steps and when a run is interrupted.
//!
//! A checkpoint is a folder: `model.mpk`, `optim.mpk`, `state.json`, `steps.csv` and
//! `manifest.json`, written and swapped in as one set (see [`super::checkpoint_set`]).
//!
//! Resuming continues the *same* run. What defines the data order, the windows, the model and
//! the precision must not change ([`FIXED_ON_RESUME`]), nor the window's size (micro-batch ×
//! accumulation × peers: a run may resume on another number of peers, or at another
//! micro-batch, when the product stays); everything else may (learning rate,
//! schedule length, `max_steps`, `epochs`, output paths, loss-scaling settings, memory
//! switches), and the new config's loss scaling wins over the saved scale.

use std::path::{Path, PathBuf};

use anyhow::Context;
use burn::module::AutodiffModule;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use super::accumulate::Position;
use super::checkpoint_set::{self, CheckpointError};
use super::optim::{self, Optim};
use super::record_fit::{self, Node};
use super::step::StepCounters;
use crate::config::{
    Settings, TrainSpec, MAX_CONFIG_BYTES, MAX_EPOCHS, MAX_SCALE, MAX_STEPS, MIN_SCALE,
};

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

/// Keys a resumed run must share with the checkpoint's run: the data order (data and seed),
/// the model, the optimizer kind and the precision. The window (micro-batch × accumulation ×
/// peers) must stay too ([`window`]); how it splits may change.
pub const FIXED_ON_RESUME: [&str; 14] = [
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
    // Encoded in memory and written by std, so a full disk reads "No space left on device"
    // naming the file rather than an encoder's error.
    let model = Recorder::<B>::record(&BytesRecorder::new(), model.clone().into_record(), ())
        .map_err(|e| anyhow::anyhow!("encoding the model: {e}"))?;
    for (name, bytes) in [
        ("model.mpk", model),
        ("optim.mpk", optim.to_bytes()?),
        (
            "state.json",
            (serde_json::to_string_pretty(state)? + "\n").into_bytes(),
        ),
        ("steps.csv", steps_csv.as_bytes().to_vec()),
    ] {
        let path = tmp.join(name);
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Checkpoints' records: named MessagePack, the format `NamedMpkFileRecorder` writes.
type BytesRecorder = NamedMpkBytesRecorder<FullPrecisionSettings>;

/// The most bytes a checkpoint's `name` may hold: `state.json` carries a config (at most
/// [`MAX_CONFIG_BYTES`], escaped) and a few counters; the rest the largest model allowed
/// (MobileNet α = 4 with 100 000 classes keeps 1.7 GB of weights and twice that of Adam
/// moments) stays well under 16 GiB.
pub fn max_bytes(name: &str) -> u64 {
    match name {
        "state.json" => 4 * MAX_CONFIG_BYTES,
        _ => 1 << 34,
    }
}

/// A verified checkpoint: the loop's state, the step log and the records, as read and hashed.
pub struct Saved {
    /// Where the set was read from.
    pub dir: PathBuf,
    /// `state.json`.
    pub state: LoopState,
    /// `steps.csv`.
    pub steps_csv: String,
    /// `model.mpk`, verified; checked against the model by [`load`].
    model: Vec<u8>,
    /// `optim.mpk`, verified; checked against the optimizer by [`load`].
    optim: Vec<u8>,
    /// The optimizer the run configures.
    train: TrainSpec,
}

/// Reads and verifies the checkpoint at `dir` and checks that `settings` continue its run.
pub fn read(dir: &Path, settings: &Settings) -> Result<Saved, CheckpointError> {
    let set = checkpoint_set::locate(dir)?;
    let mut files = checkpoint_set::verify(&set, &FILES, max_bytes)?;
    let mut take = |name: &str| files.remove(name).unwrap_or_default();
    let corrupt = |name: &str, what: String| CheckpointError::Corrupt {
        path: set.join(name),
        what,
    };
    let state: LoopState = serde_json::from_slice(&take("state.json"))
        .map_err(|e| corrupt("state.json", format!("not a loop state: {e}")))?;
    let mut changed = changed_keys(&state.config, &settings.toml);
    let saved = crate::config::load_str(&state.config, &set.join("state.json"), &[])
        .map(|saved| Window::of(&saved))
        .map_err(|e| corrupt("state.json", format!("its config: {e}")))?;
    let now = Window::of(settings);
    if saved.samples() != now.samples() {
        changed.push(format!(
            "the window (train.batch_size × train.accum_steps × peers) {saved} → {now}"
        ));
    }
    if !changed.is_empty() {
        return Err(CheckpointError::Mismatch {
            dir: dir.to_path_buf(),
            message: format!(
                "the config changes {} from the checkpoint's run; these define the data order, \
                 the windows, the model or the precision and cannot change on resume (the \
                 learning rate and its schedule, max_steps, epochs, output paths, loss scaling, \
                 the [memory] switches and how a window splits into micro-batches and peers \
                 can)",
                changed.join(", ")
            ),
        });
    }
    let expected = LoopState::of(settings, Position::default(), StepCounters::default());
    for (key, saved, now) in [
        ("model", &state.model, &expected.model),
        ("optimizer", &state.optimizer, &expected.optimizer),
    ] {
        if saved != now {
            return Err(corrupt(
                "state.json",
                format!("{key} {saved:?} where this run's is {now:?}"),
            ));
        }
    }
    let steps_csv = String::from_utf8(take("steps.csv"))
        .map_err(|_| corrupt("steps.csv", "not UTF-8 text".into()))?;
    Ok(Saved {
        state,
        steps_csv,
        model: take("model.mpk"),
        optim: take("optim.mpk"),
        train: settings.train.clone(),
        dir: set,
    })
}

/// Checks that the saved counters are ones a run of `per_epoch` windows an epoch can reach:
/// each within its bound, the window inside an epoch, and every window trained counted once,
/// as a step taken or one skipped.
pub fn check_counters(saved: &Saved, per_epoch: usize) -> Result<(), CheckpointError> {
    let fault = |what: String| CheckpointError::Corrupt {
        path: saved.dir.join("state.json"),
        what,
    };
    let (p, c) = (&saved.state.position, &saved.state.counters);
    if p.epoch > MAX_EPOCHS {
        return Err(fault(format!(
            "epoch {} is more than the {MAX_EPOCHS} epochs a run may train",
            p.epoch
        )));
    }
    // A checkpoint written after an epoch's last window (Ctrl-C, checkpoint_every) holds
    // window = per_epoch; the loop then starts by closing that epoch. Past it, the state was
    // not written by a run of this config and no window would ever be trained.
    if p.window > per_epoch {
        return Err(fault(format!(
            "window {} is past the {per_epoch} windows of an epoch",
            p.window
        )));
    }
    for (key, n) in [("step", c.step), ("skipped", c.skipped)] {
        if n > MAX_STEPS {
            return Err(fault(format!(
                "{key} {n} is more than the {MAX_STEPS} steps a run may take"
            )));
        }
    }
    // All four are bounded above, so these products and sums cannot overflow.
    let windows = p.epoch * per_epoch + p.window;
    if c.step + c.skipped != windows {
        return Err(fault(format!(
            "step {} and skipped {} do not add up to the windows trained: {windows} by epoch \
             {}, window {} at {per_epoch} windows an epoch",
            c.step, c.skipped, p.epoch, p.window
        )));
    }
    if let Some(s) = c.scaler {
        if !(MIN_SCALE..=MAX_SCALE).contains(&s.scale) {
            return Err(fault(format!(
                "scaler.scale {} is outside {MIN_SCALE}..={MAX_SCALE}",
                s.scale
            )));
        }
        if s.clean_steps > c.step {
            return Err(fault(format!(
                "scaler.clean_steps {} is more than the {} steps taken",
                s.clean_steps, c.step
            )));
        }
    }
    Ok(())
}

/// How a run cuts its windows: micro-batch × accumulation × peers samples an optimizer step,
/// which decides where every window of the data order begins.
struct Window {
    batch: usize,
    accum: usize,
    peers: usize,
}

impl Window {
    fn of(settings: &Settings) -> Self {
        let t = &settings.train;
        let peers = settings.distributed.as_ref().map_or(1, |d| d.world());
        Self {
            batch: t.batch_size,
            accum: t.accum_steps,
            peers,
        }
    }

    fn samples(&self) -> usize {
        self.batch * self.accum * self.peers
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} × {} × {}", self.batch, self.accum, self.peers)
    }
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

/// Loads the weights and optimizer state of a verified checkpoint into `model` (freshly
/// initialised by the run) and `optim`, after checking that every record fits them.
pub fn load<M: AutodiffModule<B>, B: AutodiffBackend>(
    saved: &Saved,
    model: M,
    optim: Optim<M, B>,
    device: &B::Device,
) -> anyhow::Result<(M, Optim<M, B>)> {
    let corrupt = |name: &str, what: String| CheckpointError::Corrupt {
        path: saved.dir.join(name),
        what,
    };
    let recorder = BytesRecorder::new();
    let fresh = Recorder::<B>::record(&recorder, model.clone().into_record(), ())
        .map_err(|e| anyhow::anyhow!("encoding the model: {e}"))?;
    let params = Node::parse(&saved.model)
        .and_then(|actual| record_fit::fit_model(&Node::parse(&fresh)?, &actual))
        .map_err(|what| corrupt("model.mpk", what))?;
    let template = Node::parse(&optim::state_template::<B>(&saved.train, device)?)
        .map_err(|e| anyhow::anyhow!("the optimizer's own state: {e}"))?;
    Node::parse(&saved.optim)
        .and_then(|actual| {
            record_fit::fit_optim(&template, &actual, &params, saved.train.optimizer.name())
        })
        .map_err(|what| corrupt("optim.mpk", what))?;
    let record = Recorder::<B>::load(&recorder, saved.model.clone(), device)
        .map_err(|e| corrupt("model.mpk", format!("does not fit this model: {e}")))?;
    let model = model.load_record(record);
    let optim = optim
        .from_bytes(saved.optim.clone(), device)
        .map_err(|e| corrupt("optim.mpk", format!("does not fit this optimizer: {e}")))?;
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
    // A set whose manifest is no regular file is still a set (not to be overwritten).
    !matches!(
        checkpoint_set::locate(dir),
        Err(CheckpointError::Missing(_))
    )
}
