//! Data parallel over several devices (`[distributed]`), on burn-collective: one peer per
//! device, each a thread running the same training loop on its own slice of every window, the
//! gradients summed over the peers once per window.
//!
//! Every peer starts from the same weights (the model is initialised from `train.seed`, or
//! loaded from the same checkpoint) and applies the same summed gradients, so the replicas stay
//! equal without ever sending weights. Rank 0 is the run as the user sees it: it writes
//! checkpoints, the step log and the summary, and evaluates; the others train silently. Each
//! node's first peer holds its process's memory probe and signal handler, and a signal on any
//! node stops every peer after the same window.
//!
//! Over several nodes (processes, `distributed.nodes`), each runs this with its own devices;
//! burn-collective sums within a node, then across nodes through the orchestrator.

mod fault;
mod link;
mod nodes;
mod peer;
mod shard;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use oomlab_engine::ModelBackend;

use crate::backend::Selected;
use crate::config::Settings;
use crate::memory::{MemoryProbe, NullProbe};
use crate::panics::{self, Captured};
use crate::report::summary::Summary;
use crate::training::{self, RunOptions};
use burn::collective::CollectiveError;

pub use fault::FAULT_ENV;
pub use link::{DistributedError, Link, Shared, PIECE_VALUES};
pub use nodes::{config_hash, serve_orchestrator};
pub use peer::{shard, Peer, Reduced};
pub use shard::{Owners, BUCKET_BYTES};

/// Trains `settings` with one peer per device of `devices` (one device when `[distributed]` is
/// unset): this node's first peer on this thread with `options` and `probe`, the others on
/// threads of their own. Returns the first peer's summary once every peer of this node has
/// finished (over several nodes, only node 0's is the run's).
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
    let Some(nodes) = &spec.nodes else {
        return peers::<B>(settings, spec, devices, backend, options, probe);
    };
    // burn-collective reports a lost node by panicking on its runtime's thread, and the call
    // waiting on it then fails without a reason: the panic is kept quiet and named instead.
    let run = || peers::<B>(settings, spec, devices, backend, options, probe);
    let Captured { result, first } = panics::capture_from(COLLECTIVE_SOURCES, true, run);
    let result = result.unwrap_or_else(|payload| std::panic::resume_unwind(payload));
    result.map_err(|e| match e.downcast::<DistributedError>() {
        Ok(DistributedError::Collective { rank, what, error }) => {
            let reason = first.unwrap_or_else(|| format!("{error:?}"));
            if lost_a_node(&reason) {
                let node = link::other_node(Some((nodes.rank as usize, nodes.count as usize)));
                DistributedError::NodeLost { rank, what, node }.into()
            } else {
                let reason = reason.lines().next().unwrap_or_default().to_string();
                DistributedError::Collective {
                    rank,
                    what,
                    error: CollectiveError::Other(reason),
                }
                .into()
            }
        }
        Ok(other) => other.into(),
        Err(e) => e,
    })
}

/// Whether burn-collective's panic or error is about a lost connection to another node: the
/// messages seen when a node's process was killed mid-run.
fn lost_a_node(reason: &str) -> bool {
    [
        "PeerLost",
        "connect to data server",
        "connect to peer",
        "Peer closed connection",
        "Failed to receive message from websocket",
        "ConnectionReset",
        "Connection reset",
        "ResetWithoutClosingHandshake",
        "ConnectionClosed",
        "Axum(",
    ]
    .iter()
    .any(|m| reason.contains(m))
}

/// Where burn-collective and its websocket layer panic on losing another node (a closed or
/// reset connection, seen at several places when a node's process was killed mid-run).
const COLLECTIVE_SOURCES: &[&str] = &["burn-collective", "burn-communication"];

/// [`train`] with `spec`'s peers.
fn peers<B>(
    settings: &Settings,
    spec: &crate::config::DistributedSpec,
    devices: Vec<B::Device>,
    backend: &Selected,
    options: RunOptions,
    probe: &mut dyn MemoryProbe,
) -> anyhow::Result<Summary>
where
    B: AutodiffBackend + ModelBackend,
    B::InnerBackend: ModelBackend,
{
    if let Some(node) = &spec.nodes {
        nodes::check_before_joining(node, spec.timeout)?;
    }
    // Over several nodes, the peers first agree that they run one config.
    let hash = spec.nodes.as_ref().map(|_| config_hash(settings));
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
            let result = join(rank, &device, &spec, shared, hash)
                .map_err(anyhow::Error::from)
                .and_then(|peer| {
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
    let summary = join(0, &device, spec, shared.clone(), hash)
        .map_err(anyhow::Error::from)
        .and_then(|peer| training::train::<B>(settings, device, backend, options, probe, peer));
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
                    peer: spec.global_rank(rank),
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

/// Registers this node's peer `local` on `device` and, over several nodes, checks that every
/// peer's config `hash` is the same.
fn join<B: burn::tensor::backend::Backend>(
    local: usize,
    device: &B::Device,
    spec: &crate::config::DistributedSpec,
    shared: Arc<Shared>,
    hash: Option<[f32; 8]>,
) -> Result<Peer<B>, DistributedError> {
    let mut peer = Peer::linked(Link::join(local, device.clone(), spec, shared)?, spec.shard);
    if let Some(hash) = hash {
        peer.agree(&hash, device)?;
    }
    Ok(peer)
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
