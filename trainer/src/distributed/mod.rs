//! Data parallel over several devices (`[distributed]`), on burn-collective: one peer per
//! device, each a thread running the same training loop on its own slice of every window, the
//! gradients summed over the peers once per window.
//!
//! Every peer starts from the same weights (the model is initialised from `train.seed`, or
//! loaded from the same checkpoint) and applies the same summed gradients, so the replicas stay
//! equal without ever sending weights. Rank 0 is the run as the user sees it: it holds the
//! memory probe and the signal handler, writes checkpoints, the step log and the summary, and
//! evaluates; the others train silently and stop where it stops.

mod fault;
mod link;
mod peer;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use oomlab_engine::ModelBackend;

use crate::backend::Selected;
use crate::config::Settings;
use crate::memory::{MemoryProbe, NullProbe};
use crate::report::summary::Summary;
use crate::training::{self, RunOptions};

pub use fault::FAULT_ENV;
pub use link::{DistributedError, Link, Shared};
pub use peer::{shard, Peer, Reduced};

/// Trains `settings` with one peer per device of `devices` (one device when `[distributed]` is
/// unset): rank 0 on this thread with `options` and `probe`, the others on threads of their
/// own. Returns rank 0's summary once every peer has finished.
pub fn train<B>(
    settings: &Settings,
    devices: Vec<B::Device>,
    backend: &Selected,
    options: RunOptions,
    probe: &mut dyn MemoryProbe,
) -> anyhow::Result<Summary>
where
    B: AutodiffBackend + ModelBackend,
    B::InnerBackend: ModelBackend,
{
    let Some(spec) = &settings.distributed else {
        let device = devices.into_iter().next().unwrap_or_default();
        return training::train::<B>(settings, device, backend, options, probe, Peer::solo());
    };
    let shared = Shared::new(spec);
    let (done, finished) = mpsc::channel::<(usize, Result<(), String>)>();
    for (rank, device) in devices.iter().enumerate().skip(1) {
        let (settings, backend) = (settings.clone(), backend.clone());
        let (device, shared, done) = (device.clone(), shared.clone(), done.clone());
        let spec = spec.clone();
        let resume = options.resume.map(std::path::Path::to_path_buf);
        let trial = options.trial;
        let peer = move || {
            let report = Report {
                rank,
                shared: shared.clone(),
                done,
                sent: false,
            };
            let options = RunOptions {
                resume: resume.as_deref(),
                trial,
                interrupt: None,
            };
            let result = Link::join(rank, device.clone(), &spec, shared)
                .map_err(anyhow::Error::from)
                .and_then(|link| {
                    let peer = Peer::linked(link);
                    training::train::<B>(&settings, device, &backend, options, &mut NullProbe, peer)
                });
            report.send(result.map(drop).map_err(|e| format!("{e:#}")));
        };
        std::thread::Builder::new()
            .name(format!("peer-{rank}"))
            .spawn(peer)?;
    }
    drop(done);
    let device = devices.into_iter().next().unwrap_or_default();
    let summary = Link::join(0, device.clone(), spec, shared.clone())
        .map_err(anyhow::Error::from)
        .and_then(|link| {
            training::train::<B>(
                settings,
                device,
                backend,
                options,
                probe,
                Peer::linked(link),
            )
        });
    let summary = match summary {
        Ok(summary) => summary,
        Err(e) => {
            shared.fail(0, &format!("{e:#}"));
            return Err(e);
        }
    };
    // The others end at the same step; each gets the timeout to say so.
    let started = Instant::now();
    for _ in 1..spec.devices.len() {
        let left = spec.timeout.saturating_sub(started.elapsed());
        match finished.recv_timeout(left) {
            Ok((_, Ok(()))) => {}
            Ok((rank, Err(reason))) => {
                let device = spec.devices[rank].to_string();
                return Err(DistributedError::PeerFailed {
                    peer: rank,
                    device,
                    reason,
                }
                .into());
            }
            Err(_) => {
                return Err(anyhow::anyhow!(
                    "peer 0 finished; the other peers did not within distributed.timeout_s ({} s)",
                    spec.timeout.as_secs()
                ))
            }
        }
    }
    Ok(summary)
}

/// A peer thread's end, sent to rank 0: its result, or on a panic the panic's failure. The
/// failure is also recorded in [`Shared`], where waiting peers look.
struct Report {
    rank: usize,
    shared: Arc<Shared>,
    done: mpsc::Sender<(usize, Result<(), String>)>,
    sent: bool,
}

impl Report {
    fn send(mut self, result: Result<(), String>) {
        if let Err(reason) = &result {
            self.shared.fail(self.rank, reason);
        }
        self.sent = true;
        let _ = self.done.send((self.rank, result));
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if !self.sent {
            let reason = "panicked (its message is above)";
            self.shared.fail(self.rank, reason);
            let _ = self.done.send((self.rank, Err(reason.into())));
        }
    }
}
