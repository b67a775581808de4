//! A peer's line to the others: burn-collective's calls, made on a thread of their own so that
//! the peer can stop waiting.
//!
//! burn-collective's calls block without a timeout, and a peer that died leaves the others
//! blocked for ever. Each peer therefore hands its tensors to a worker thread that makes the
//! calls, and waits for the answer in short slices: between them it checks whether another peer
//! has failed (then it fails too, naming that peer) and whether the run's timeout has passed
//! (then it fails naming the peers that never arrived). A worker left blocked is abandoned; the
//! process ends with the run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::collective::{
    self, AllReduceStrategy, CollectiveConfig, CollectiveError, PeerId, ReduceOperation,
};
use burn::tensor::backend::{Backend, BackendTypes};
use burn::tensor::{Shape, Tensor, TensorMetadata, TensorPrimitive};
use burn_communication::Address;

use crate::config::{DistributedSpec, Strategy};

/// How often a waiting peer looks at the others' health.
const POLL: Duration = Duration::from_millis(20);

/// A data-parallel run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum DistributedError {
    /// Another peer failed; this one stopped too.
    #[error("peer {peer} ({device}) failed: {reason}")]
    PeerFailed {
        /// The failed peer's rank.
        peer: usize,
        /// Its device.
        device: String,
        /// Its error, one line.
        reason: String,
    },
    /// The others did not arrive within the timeout.
    #[error(
        "peer {rank} waited {waited_s} s in {what} for {missing} (distributed.timeout_s): stopped"
    )]
    Timeout {
        /// The waiting peer (its rank over all nodes).
        rank: usize,
        /// Which call: `registration` or `all-reduce N`.
        what: String,
        /// Seconds waited.
        waited_s: u64,
        /// Who had not reached the call: `peer 1`, `peers 1, 2`, `node 1`, `another node`.
        missing: String,
    },
    /// Another node's connection closed in a collective call (it died or was killed).
    #[error("peer {rank} lost {node} in {what} (its connection closed): stopped")]
    NodeLost {
        /// The peer that noticed.
        rank: usize,
        /// Which call.
        what: String,
        /// `node N`, or `another node` when more than two run.
        node: String,
    },
    /// The peers run different configs.
    #[error(
        "the nodes' configs differ (a hash of each, compared at registration): every node must \
         run the same config and flags, but for distributed.node_rank and node_address"
    )]
    ConfigMismatch,
    /// Nothing answers at the orchestrator's address.
    #[error(
        "distributed.orchestrator = {address:?}: nothing answered there within \
         distributed.timeout_s ({waited_s} s): start it first (trainer launch starts one)"
    )]
    NoOrchestrator {
        /// The address.
        address: String,
        /// Seconds tried.
        waited_s: u64,
    },
    /// This node's port for tensors is taken.
    #[error("distributed.node_address = {address:?}: cannot listen there: {reason}")]
    PortTaken {
        /// The address.
        address: String,
        /// The system's reason.
        reason: String,
    },
    /// A test's fault (`OOMLAB_FAULT`) stopped this peer.
    #[error("failure injected at window {window} (OOMLAB_FAULT)")]
    Injected {
        /// The peer.
        rank: usize,
        /// The window.
        window: usize,
    },
    /// burn-collective refused a call.
    #[error("peer {rank}: {what}: burn-collective: {error:?}")]
    Collective {
        /// The calling peer.
        rank: usize,
        /// Which call.
        what: String,
        /// burn-collective's error.
        error: CollectiveError,
    },
}

impl DistributedError {
    /// Whether the error is the user's input (exit 2), not the run failing (exit 1).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Self::ConfigMismatch | Self::NoOrchestrator { .. } | Self::PortTaken { .. }
        )
    }
}

/// The most values one message between nodes carries. burn-collective sends a tensor as one
/// websocket message, copied about four times on the way (tensor data, MessagePack, the
/// receiver's bytes and data), and the connections keep buffers as large as the largest
/// message they carried: for MobileNet α 2, a 16 MiB weight cost each process ≈ 100 MiB at the
/// all-reduce and ≈ 50 MiB for good. In pieces of 4 MiB both stay small (as DDP's buckets do).
pub const PIECE_VALUES: usize = 1 << 20;

/// Sums `tensor` over the peers of all nodes, [`PIECE_VALUES`] values at a time.
fn all_reduce_in_pieces<B: Backend>(
    id: PeerId,
    tensor: <B as BackendTypes>::FloatTensorPrimitive,
) -> Result<<B as BackendTypes>::FloatTensorPrimitive, CollectiveError> {
    let shape = tensor.shape();
    let values = shape.num_elements();
    if values <= PIECE_VALUES {
        return collective::all_reduce::<B>(id, tensor, ReduceOperation::Sum);
    }
    let flat = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(B::float_reshape(
        tensor,
        Shape::new([values]),
    )));
    let mut sums = Vec::with_capacity(values.div_ceil(PIECE_VALUES));
    for start in (0..values).step_by(PIECE_VALUES) {
        let len = PIECE_VALUES.min(values - start);
        let piece = flat.clone().narrow(0, start, len);
        let sum =
            collective::all_reduce::<B>(id, piece.into_primitive().tensor(), ReduceOperation::Sum)?;
        sums.push(Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(sum)));
    }
    drop(flat);
    let sum = Tensor::cat(sums, 0).into_primitive().tensor();
    Ok(B::float_reshape(sum, shape))
}

/// The node this one waits on, as an error names it: `node N` when there are two (this node's
/// rank and the count in `nodes`), else `another node` (one process cannot see which).
pub(super) fn other_node(nodes: Option<(usize, usize)>) -> String {
    match nodes {
        Some((me, 2)) => format!("node {}", 1 - me),
        _ => "another node".into(),
    }
}

fn list(ranks: &[usize]) -> String {
    let names: Vec<String> = ranks.iter().map(usize::to_string).collect();
    names.join(", ")
}

/// What the peers of one process share: each one's progress and failure.
#[derive(Debug)]
pub struct Shared {
    devices: Vec<String>,
    /// This node's rank and the node count, when the run spans processes.
    nodes: Option<(usize, usize)>,
    /// Peers over all nodes.
    world: usize,
    /// Collective calls each peer has started (registration is call 1).
    calls: Vec<AtomicUsize>,
    /// The first failure of each peer, one line.
    failed: Mutex<Vec<Option<String>>>,
    timeout: Duration,
}

impl Shared {
    /// The state of a run over `spec`'s devices.
    pub fn new(spec: &DistributedSpec) -> Arc<Self> {
        let n = spec.devices.len();
        Arc::new(Self {
            devices: spec.devices.iter().map(ToString::to_string).collect(),
            nodes: (spec.nodes.as_ref()).map(|n| (n.rank as usize, n.count as usize)),
            world: spec.world(),
            calls: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            failed: Mutex::new(vec![None; n]),
            timeout: spec.timeout,
        })
    }

    /// Peers in the run, over all nodes.
    pub fn peers(&self) -> usize {
        self.world
    }

    /// The rank over all nodes of this node's `local` peer.
    fn global(&self, local: usize) -> usize {
        self.nodes.map_or(0, |(node, _)| node) * self.devices.len() + local
    }

    /// Records that this node's peer `rank` failed (the first reason is kept).
    pub fn fail(&self, rank: usize, reason: &str) {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        let line = reason.lines().next().unwrap_or_default().to_string();
        failed[rank].get_or_insert(line);
    }

    fn failure_other_than(&self, rank: usize) -> Option<DistributedError> {
        let failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        let (peer, reason) = failed
            .iter()
            .enumerate()
            .find_map(|(peer, f)| f.as_ref().filter(|_| peer != rank).map(|r| (peer, r)))?;
        Some(DistributedError::PeerFailed {
            peer: self.global(peer),
            device: self.devices[peer].clone(),
            reason: reason.clone(),
        })
    }

    /// Who had not reached collective call `call`: this node's late peers, or else the
    /// other nodes (which this process cannot see into).
    fn missing(&self, call: usize) -> String {
        let started = self.calls.iter().map(|c| c.load(Ordering::SeqCst));
        let late: Vec<usize> = started
            .enumerate()
            .filter(|(_, n)| *n < call)
            .map(|(peer, _)| self.global(peer))
            .collect();
        match late.len() {
            0 => other_node(self.nodes),
            1 => format!("peer {}", late[0]),
            _ => format!("peers {}", list(&late)),
        }
    }
}

type Tensors<B> = Vec<<B as BackendTypes>::FloatTensorPrimitive>;
type Sums<B> = Vec<Option<<B as BackendTypes>::FloatTensorPrimitive>>;
type Answer<B> = Result<Sums<B>, CollectiveError>;

/// What a peer asks its collective thread to do.
enum Request<B: Backend> {
    /// Sum each tensor over the peers: for every peer (no root), or for the peer of that
    /// rank only.
    Reduce(Vec<(<B as BackendTypes>::FloatTensorPrimitive, Option<usize>)>),
    /// The run ended well on every peer: leave the collective.
    Finish,
}

/// One peer's connection to the others.
pub struct Link<B: Backend> {
    /// Its place among this node's peers.
    local: usize,
    /// Its rank over all nodes.
    rank: usize,
    shared: Arc<Shared>,
    requests: SyncSender<Request<B>>,
    answers: Receiver<Answer<B>>,
    /// Collective calls made so far (registration is call 1).
    calls: usize,
    /// Time spent in collective calls since registration.
    busy: Duration,
}

impl<B: Backend> Link<B> {
    /// Registers this node's peer `local` on `device` with the others of `spec` (waiting for
    /// all of them, within the timeout).
    pub fn join(
        local: usize,
        device: B::Device,
        spec: &DistributedSpec,
        shared: Arc<Shared>,
    ) -> Result<Self, DistributedError> {
        let strategy = match spec.strategy {
            Strategy::Tree => AllReduceStrategy::Tree(2),
            Strategy::Ring => AllReduceStrategy::Ring,
            Strategy::Centralized => AllReduceStrategy::Centralized,
        };
        let mut config = CollectiveConfig::default()
            .with_num_devices(spec.devices.len())
            .with_local_all_reduce_strategy(strategy);
        if let Some(nodes) = &spec.nodes {
            let address = |text: &str| {
                text.parse::<Address>()
                    .map_err(|e| DistributedError::Collective {
                        rank: spec.global_rank(local),
                        what: format!("reading the address {text:?}"),
                        error: CollectiveError::Other(format!("{e:?}")),
                    })
            };
            config = config
                .with_num_nodes(nodes.count)
                .with_global_address(address(&nodes.orchestrator)?)
                .with_node_address(address(&nodes.address)?)
                .with_data_service_port(nodes.data_port)
                .with_global_all_reduce_strategy(strategy);
        }
        let rank = spec.global_rank(local);
        let across_nodes = spec.nodes.is_some();
        let (requests, inbox) = mpsc::sync_channel::<Request<B>>(1);
        let (reply, answers) = mpsc::sync_channel::<Answer<B>>(1);
        let id = PeerId::from(rank);
        std::thread::Builder::new()
            .name(format!("collective-{local}"))
            .spawn(move || {
                let registered = collective::register::<B>(id, device, config);
                let ok = registered.is_ok();
                if reply.send(registered.map(|()| Vec::new())).is_err() || !ok {
                    return;
                }
                // A peer that fails leaves without `finish_collective`: burn-collective would
                // otherwise go on with the others alone, summing fewer gradients than the
                // window has. Left registered, it holds them in the next call, where they see
                // its failure.
                while let Ok(request) = inbox.recv() {
                    let answer = match request {
                        Request::Reduce(tensors) => tensors
                            .into_iter()
                            .map(|(t, root)| match root {
                                None if across_nodes => all_reduce_in_pieces::<B>(id, t).map(Some),
                                None => collective::all_reduce::<B>(id, t, ReduceOperation::Sum)
                                    .map(Some),
                                Some(root) => {
                                    let root = PeerId::from(root);
                                    collective::reduce::<B>(id, t, ReduceOperation::Sum, root)
                                }
                            })
                            .collect(),
                        Request::Finish => {
                            collective::finish_collective::<B>(id).map(|()| Vec::new())
                        }
                    };
                    if reply.send(answer).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| DistributedError::Collective {
                rank,
                what: "starting its collective thread".into(),
                error: CollectiveError::Other(e.to_string()),
            })?;
        shared.calls[local].store(1, Ordering::SeqCst);
        let mut link = Self {
            local,
            rank,
            shared,
            requests,
            answers,
            calls: 1,
            busy: Duration::ZERO,
        };
        link.wait("registration")?;
        Ok(link)
    }

    /// This peer's rank over all nodes.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Peers in the run, over all nodes.
    pub fn peers(&self) -> usize {
        self.shared.peers()
    }

    /// The run's shared state.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Sums each of `tensors` over all peers (every peer passes the same shapes, in the same
    /// order); every peer gets the same sums.
    pub fn all_reduce(&mut self, tensors: Tensors<B>) -> Result<Tensors<B>, DistributedError> {
        let tensors = tensors.into_iter().map(|t| (t, None)).collect();
        let sums = self.reduce(tensors)?;
        Ok(sums.into_iter().flatten().collect())
    }

    /// Sums each tensor over all peers, for the peer whose rank is its `root` only (every
    /// peer gets the sums it is the root of, in order) or, with no root, for every peer.
    ///
    /// Across nodes a sum for one root is an all-reduce whose other results are dropped:
    /// burn-collective has no global `reduce`, so it costs what an all-reduce does.
    pub fn reduce(
        &mut self,
        tensors: Vec<(<B as BackendTypes>::FloatTensorPrimitive, Option<usize>)>,
    ) -> Result<Sums<B>, DistributedError> {
        self.calls += 1;
        let what = format!("all-reduce {}", self.calls - 1);
        let across_nodes = self.shared.nodes.is_some();
        let me = self.rank;
        let (tensors, roots): (Vec<_>, Vec<_>) = tensors
            .into_iter()
            .map(|(t, root)| ((t, root.filter(|_| !across_nodes)), root))
            .unzip();
        let sums = self.call(Request::Reduce(tensors), &what)?;
        // A root's sum made by an all-reduce reaches every peer: only the root keeps it.
        Ok(sums
            .into_iter()
            .zip(roots)
            .map(|(sum, root)| sum.filter(|_| root.is_none_or(|r| r == me)))
            .collect())
    }

    /// Leaves the collective once the run has ended well (every peer at the same step).
    pub fn finish(mut self) -> Result<(), DistributedError> {
        self.calls += 1;
        self.call(Request::Finish, "finishing").map(drop)
    }

    fn call(&mut self, request: Request<B>, what: &str) -> Result<Sums<B>, DistributedError> {
        // A failed peer never arrives: do not start a call the others cannot complete.
        if let Some(failure) = self.shared.failure_other_than(self.local) {
            return Err(failure);
        }
        self.shared.calls[self.local].store(self.calls, Ordering::SeqCst);
        if self.requests.send(request).is_err() {
            return Err(self.worker_gone(what));
        }
        let started = Instant::now();
        let answer = self.wait(what);
        self.busy += started.elapsed();
        answer
    }

    /// Time spent in collective calls since registration (waiting for the others included).
    pub fn busy(&self) -> Duration {
        self.busy
    }

    fn wait(&mut self, what: &str) -> Result<Sums<B>, DistributedError> {
        let started = Instant::now();
        loop {
            match self.answers.recv_timeout(POLL) {
                Ok(Ok(tensors)) => return Ok(tensors),
                Ok(Err(error)) => {
                    let what = what.into();
                    let rank = self.rank;
                    return Err(DistributedError::Collective { rank, what, error });
                }
                Err(RecvTimeoutError::Disconnected) => return Err(self.worker_gone(what)),
                Err(RecvTimeoutError::Timeout) => {}
            }
            if let Some(failure) = self.shared.failure_other_than(self.local) {
                return Err(failure);
            }
            let waited = started.elapsed();
            if waited >= self.shared.timeout {
                return Err(DistributedError::Timeout {
                    rank: self.rank,
                    what: what.into(),
                    waited_s: waited.as_secs(),
                    missing: self.shared.missing(self.calls),
                });
            }
        }
    }

    fn worker_gone(&self, what: &str) -> DistributedError {
        DistributedError::Collective {
            rank: self.rank,
            what: what.into(),
            error: CollectiveError::LocalServerMissing,
        }
    }
}
