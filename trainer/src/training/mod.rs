//! The training loop. It reads like the seed article's PyTorch AMP loop:
//!
//! ```text
//! for i, (images, labels) in enumerate(loader):   for window in epoch's windows:
//!     with autocast():                                for micro in window.chunks(batch):
//!         loss = criterion(model(images), labels)         loss = ce(model.forward(x, &cx), y)
//!     scaler.scale(loss / k).backward()                   grads += (loss · share · scale)'
//!     if (i + 1) % k == 0:                            unscale; skip on inf/NaN; clip
//!         scaler.step(optimizer); scaler.update()     model = optim.step(lr(step), model, grads)
//!         optimizer.zero_grad()                       (grads are fresh for every window)
//! ```
//! `share` is the micro-batch's fraction of the window's samples: with a short last window
//! that is what `loss / k` gets wrong.

pub mod accumulate;
pub mod checkpoint;
pub mod checkpoint_set;
pub mod eval;
pub mod grads;
pub mod interrupt;
pub mod loss_scale;
pub mod lost_updates;
pub mod mistakes;
pub mod optim;
pub mod record;
pub mod record_fit;
pub mod schedule;
pub mod step;

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use oomlab_engine::{ModelBackend, RunContext};

use crate::backend::Selected;
use crate::config::{unsupported_dtype, PrecisionMode, Settings};
use crate::data::{self, shuffled, Split};
use crate::distributed::Peer;
use crate::memory::{MemoryProbe, Phase};
use crate::model::{cast_params, Network};
use crate::report::step_log::StepLog;
use crate::report::summary::Summary;
use accumulate::{window_gradients, Position, Windows};
use checkpoint::LoopState;
use eval::evaluate;
use interrupt::Interrupt;
use mistakes::KeptLosses;

use optim::Optim;
use record::Record;
use step::{Outcome, StepCounters, Stepper};

/// How a run starts and ends, beyond its config.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions<'a> {
    /// Continue from this checkpoint folder.
    pub resume: Option<&'a Path>,
    /// A measuring trial (`find-batch-size`): no evaluation, no checkpoint.
    pub trial: bool,
    /// The process's signal handler (installed in `main`): after a signal the run finishes
    /// its window, checkpoints and stops. `None`: signals are not watched.
    pub interrupt: Option<&'a Interrupt>,
}

/// Trains the model `settings` describes on `device` of `backend`, as `peer` of a
/// data-parallel run ([`Peer::solo`] on one device); `probe` measures memory over the
/// training steps.
pub fn train<B>(
    settings: &Settings,
    device: B::Device,
    backend: &Selected,
    options: RunOptions,
    probe: &mut dyn MemoryProbe,
    mut peer: Peer<B::InnerBackend>,
) -> anyhow::Result<Summary>
where
    B: AutodiffBackend + ModelBackend,
    B::InnerBackend: ModelBackend,
{
    let started = Instant::now();
    let (t, p) = (&settings.train, &settings.precision);
    if let Some(half) = p.mode.half() {
        // `run` checked the selected device already; library callers get the same error.
        if !B::supports_dtype(&device, half) {
            return Err(unsupported_dtype(p.mode, &backend.name()).into());
        }
    }
    // The run's own: its precision policy, the probe's boundary listener, the lent sums.
    let cx = RunContext::new(p.policy());
    cx.listen(probe.listener());

    let splits = data::load(&settings.data, settings.input_size)?;
    // The data set stays; what training adds is measured above it.
    probe.resident();
    let model: Network<B> = Network::init(&settings.model, t.seed, &device)?;
    // A window is every peer's micro-batches: N peers × `batch_size` × `accum_steps`.
    let windows = Windows {
        batch_size: t.batch_size,
        accum_steps: t.accum_steps,
        peers: peer.peers(),
    };
    let leader = peer.is_leader();
    let n = splits.len(Split::Train);
    let per_epoch = windows.per_epoch(n);
    // The run ends after this many optimizer steps; in epochs mode a skipped step is made up
    // by a window of the next epoch's order, so the schedule always reaches its end.
    let total_steps = t.max_steps.unwrap_or(t.epochs * per_epoch);
    let (mut model, optim, saved, log) = match options.resume {
        Some(dir) => resume(dir, settings, model, per_epoch, &device)?,
        None => {
            let fresh = LoopState::of(settings, Position::default(), StepCounters::default());
            (model, Optim::new(t), fresh, StepLog::default())
        }
    };
    if p.mode == PrecisionMode::F16 {
        // No master weights: the parameters themselves become f16.
        model = cast_params(model, p.mode.parameter_dtype());
    }
    // A sharded peer keeps its own parameters' optimizer state (a checkpoint holds them all).
    let optim = peer.own(&model, optim);
    let mut stepper = Stepper::new(settings, total_steps, optim, &saved.counters);
    let mut position = saved.position;
    let mut record = Record::new(settings, total_steps, stepper.step, log, started);
    if !leader {
        // Rank 0's bar is the run's.
        record.silence();
    }
    let checkpoint_dir = checkpoint::dir(&t.output_dir);
    let save = |model: &Network<B>,
                stepper: &Stepper<Network<B>, B>,
                position: Position,
                record: &Record,
                peer: &mut Peer<B::InnerBackend>|
     -> anyhow::Result<()> {
        // Sharded, the owners send rank 0 their parts of the optimizer state.
        let whole = peer.whole_state(model, &stepper.optim, &device)?;
        if !leader {
            return Ok(()); // rank 0 writes the run's checkpoint
        }
        if !grads::all_finite(model) {
            // Never checkpoint weights a step has already overflowed.
            return Err(record.diverged_weights(stepper));
        }
        let state = LoopState::of(settings, position, stepper.counters());
        checkpoint::save(
            &checkpoint_dir,
            model,
            whole.as_ref().unwrap_or(&stepper.optim),
            &state,
            &record.log_csv(),
        )
        .with_context(|| format!("saving the checkpoint after step {}", stepper.step))?;
        record.write_log()
    };
    let mistakes = settings.mistakes;
    // `total_loss += loss` when the mistake is on: every window's loss tensor, kept to the end.
    let mut kept = KeptLosses::<B>::new(mistakes.keep_losses);
    let eval_now = |model: &Network<B>, probe: &mut dyn MemoryProbe| {
        let (b, keep) = (t.batch_size, mistakes.keep_losses);
        probe.sample(Phase::EvalStart);
        let result = match mistakes.eval_with_autograd {
            // The mistake: the autodiff model, which builds a graph for backward.
            true => evaluate(model, &splits, b, &cx, &device, keep),
            false => evaluate(&model.valid(), &splits, b, &cx, &device, keep),
        };
        probe.sample(Phase::EvalEnd);
        result
    };
    let done = |s: &Stepper<_, _>| s.step >= total_steps;
    let every = |o: Outcome, s: &Stepper<_, _>| {
        let due = t
            .checkpoint_every
            .is_some_and(|k| o.stepped() && s.step % k == 0);
        due && !options.trial
    };
    // Rank 0 evaluates; the others go on to the next window and wait for it there.
    let evaluates = leader && !options.trial;

    let mut ended_an_epoch = false;
    while !done(&stepper) {
        let order = shuffled(n, t.seed, position.epoch as u64);
        // Resuming mid-epoch skips the windows already trained on.
        for window in windows.split(&order).skip(position.window) {
            if done(&stepper) {
                break;
            }
            probe.sample(Phase::WindowStart);
            record.start(&stepper);
            let load = |idx: &[usize]| splits.batch::<B>(Split::Train, idx, &device);
            let scale = stepper.scaler.scale();
            let b = t.batch_size;
            // This peer's samples; each micro-batch's share is of the whole window.
            let mine = peer.shard(window, b);
            let total = window.len();
            let w = window_gradients(&model, &mine, total, b, &cx, scale, probe, &mut kept, load);
            // A trial takes a few steps and keeps nothing: it ends as it would have.
            let stop = options.interrupt.and_then(Interrupt::requested);
            let stop = stop.filter(|_| !options.trial);
            // Summed over the peers: every peer steps (or skips) on the same gradients.
            let w = peer.reduce(&model, w.grads, w.loss, stop)?;
            let before = record.before_step(&model);
            let outcome;
            // Over every peer's gradients: a peer may hold its own parameters' only.
            let norm = peer.norm(&model, &w)?;
            (model, outcome) = stepper.apply_with_norm(model, w.grads, norm);
            // A sharded peer stepped its own parameters: the owners send theirs to the others.
            model = peer.share(model, outcome.stepped())?;
            settings.memory.free_cache.after_step::<B>(&device);
            probe.sample(Phase::AfterStep);
            record.window(window.len(), w.loss, outcome, &stepper, &model, before)?;
            record.memory(probe.last_step());
            position.window += 1;
            if w.stop.is_some() || every(outcome, &stepper) {
                save(&model, &stepper, position, &record, &mut peer)?;
            }
            if let Some(signal) = w.stop {
                return Err(record.interrupted(signal, &stepper, &checkpoint_dir));
            }
        }
        if position.window >= per_epoch {
            position.next_epoch();
            settings.memory.free_cache.after_epoch::<B>(&device);
            if !options.trial {
                save(&model, &stepper, position, &record, &mut peer)?;
            }
            ended_an_epoch = true;
            if evaluates {
                record.evaluated(position.epoch, true, eval_now(&model, probe));
            }
        }
    }
    // A run that ends mid-epoch (or before its first epoch's end) is saved and evaluated at
    // its end too; every peer decides alike, since a sharded save needs them all.
    let last = !options.trial && (position.window != 0 || !ended_an_epoch);
    if last {
        save(&model, &stepper, position, &record, &mut peer)?;
    }
    let collective = peer.collective_seconds_per_window();
    // Every peer reduced its last window: they leave together, before rank 0 evaluates alone.
    peer.finish()?;
    record.finish();
    // Only rank 0 writes: another node's first peer holds a probe too, but no folder.
    if let (Some(timeline), false, true) = (probe.timeline(), options.trial, leader) {
        crate::report::timeline::write(&t.output_dir, &timeline)?;
    }
    if evaluates && last {
        record.evaluated(position.epoch, false, eval_now(&model, probe));
    }
    let mut summary = Summary::from_run(
        settings,
        backend,
        &model,
        &stepper,
        &record,
        position.epoch,
        probe.report(),
    );
    summary.collective_seconds_per_step = collective;
    Ok(summary)
}

/// Where a run starts: the model, its optimizer, the loop's state and the step log so far.
type Start<B> = (Network<B>, Optim<Network<B>, B>, LoopState, StepLog);

/// Reads, verifies and loads the checkpoint in `dir`, checking that `settings` continue its
/// run, that its counters are ones a run of `per_epoch` windows an epoch reaches and that its
/// records fit the model and the optimizer.
fn resume<B: AutodiffBackend>(
    dir: &Path,
    settings: &Settings,
    model: Network<B>,
    per_epoch: usize,
    device: &B::Device,
) -> anyhow::Result<Start<B>>
where
    Network<B>: AutodiffModule<B>,
{
    if settings.precision.mode == PrecisionMode::F16 {
        anyhow::bail!(
            "--resume is not available with precision.mode = \"f16\": checkpoints store \
             f32 weights, and this mode has none to return to"
        );
    }
    let saved = checkpoint::read(dir, settings)?;
    checkpoint::check_counters(&saved, per_epoch)?;
    let (model, optim) = checkpoint::load(&saved, model, Optim::new(&settings.train), device)?;
    let mut state = saved.state;
    state.config = settings.toml.clone();
    Ok((model, optim, state, StepLog::parse(&saved.steps_csv)))
}
