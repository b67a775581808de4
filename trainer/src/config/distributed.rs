//! `[distributed]`: data parallel over several devices, one peer (a thread) per device, on one
//! node (process) or several.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{out_of_range, BackendKind, ConfigError};

/// The most peers a run may have.
pub const MAX_PEERS: usize = 64;

/// The longest collective timeout accepted: a day.
pub const MAX_TIMEOUT_S: u64 = 86_400;

/// The most nodes (processes) a run may have.
pub const MAX_NODES: u32 = 64;

/// One device of a data-parallel run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The CPU (Flex). Several peers may share it.
    Cpu,
    /// CUDA device `index`.
    Cuda(usize),
    /// The one device `backend.kind` selects (a node of a multi-node run without `devices`).
    Selected,
}

impl DeviceSpec {
    /// The backend this device belongs to.
    pub fn kind(self) -> BackendKind {
        match self {
            Self::Cpu => BackendKind::Cpu,
            Self::Cuda(_) => BackendKind::Cuda,
            Self::Selected => BackendKind::Auto,
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "cpu" => Some(Self::Cpu),
            _ => {
                let index = text.strip_prefix("cuda:")?;
                // Digits only: `cuda:+1` and `cuda: 1` are not device names.
                let digits = !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit());
                digits.then(|| index.parse().ok()).flatten().map(Self::Cuda)
            }
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
            Self::Selected => f.write_str("auto"),
        }
    }
}

/// How the peers sum their gradients (burn-collective's all-reduce strategies).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// A binary tree: reduce up, broadcast down.
    #[default]
    Tree,
    /// A ring: each peer sends one slice a round (bandwidth-optimal for large tensors).
    Ring,
    /// One peer sums everything and sends the result back.
    Centralized,
}

/// What each peer keeps of the training state (ZeRO's stages 1 and 2).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Shard {
    /// Every peer keeps everything: plain data parallel.
    #[default]
    #[serde(rename = "none")]
    None,
    /// Each parameter's optimizer state lives on one peer, its owner, which steps it and
    /// shares the updated weights (ZeRO-1).
    #[serde(rename = "optimizer")]
    Optimizer,
    /// As `optimizer`, and each summed gradient is kept by its owner only (ZeRO-2).
    #[serde(rename = "optimizer+gradients")]
    OptimizerGradients,
}

impl Shard {
    /// The name a config writes.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Optimizer => "optimizer",
            Self::OptimizerGradients => "optimizer+gradients",
        }
    }

    /// Whether each peer keeps only its own parameters' optimizer state.
    pub fn optimizer(self) -> bool {
        self != Self::None
    }
}

/// `[distributed]` as written.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawDistributed {
    /// One peer per entry: `"cpu"` or `"cuda:N"`. Unset: one device, no collective.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<String>>,
    /// The all-reduce strategy.
    pub strategy: Strategy,
    /// What each peer keeps of the optimizer state and gradients.
    pub shard: Shard,
    /// Seconds a peer waits in a collective call before it gives up on the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
    /// Processes in the run, each with `devices` (default 1: this process only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// This process's place among the nodes: 0 writes the outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_rank: Option<u32>,
    /// The orchestrator every node registers with, `ws://HOST:PORT` (`trainer launch` starts
    /// one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orchestrator: Option<String>,
    /// Where the other nodes reach this one for tensors, `ws://HOST:PORT` (default: 127.0.0.1,
    /// the orchestrator's port + 1 + node_rank).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_address: Option<String>,
}

/// This process's part of a run over several nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Nodes in the run.
    pub count: u32,
    /// This node's rank.
    pub rank: u32,
    /// The orchestrator's address, `ws://HOST:PORT`.
    pub orchestrator: String,
    /// This node's address for the others, `ws://HOST:PORT`.
    pub address: String,
    /// The port of `address`, where this node serves tensors.
    pub data_port: u16,
}

/// `ws://HOST:PORT` split, or `None` when it is not one.
pub fn ws_address(text: &str) -> Option<(&str, u16)> {
    let rest = text.strip_prefix("ws://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let valid_host = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    let digits = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    let port = digits.then(|| port.parse::<u16>().ok()).flatten()?;
    (valid_host && port != 0).then_some((host, port))
}

/// A data-parallel run: which devices, how they reduce, how long a peer waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSpec {
    /// One peer per device, rank = position.
    pub devices: Vec<DeviceSpec>,
    /// The all-reduce strategy.
    pub strategy: Strategy,
    /// What each peer keeps of the optimizer state and gradients.
    pub shard: Shard,
    /// How long a peer waits for the others in one collective call.
    pub timeout: Duration,
    /// The nodes, when the run spans several processes.
    pub nodes: Option<NodeSpec>,
}

impl DistributedSpec {
    /// Peers over all nodes.
    pub fn world(&self) -> usize {
        self.devices.len() * self.nodes.as_ref().map_or(1, |n| n.count as usize)
    }

    /// The rank over all nodes of this node's `local` peer.
    pub fn global_rank(&self, local: usize) -> usize {
        let node = self.nodes.as_ref().map_or(0, |n| n.rank as usize);
        node * self.devices.len() + local
    }

    /// Whether this process writes the run's outputs (it holds rank 0).
    pub fn leads(&self) -> bool {
        self.nodes.as_ref().is_none_or(|n| n.rank == 0)
    }
}

/// The wait before a peer gives up, unless `timeout_s` says otherwise: it bounds a window's
/// compute on the slowest peer plus rank 0's evaluation and checkpoint, which the others wait
/// through.
pub const DEFAULT_TIMEOUT_S: u64 = 600;

/// Validates `[distributed]`; `None` when the run uses one device.
pub fn validate(
    raw: &RawDistributed,
    backend: BackendKind,
) -> Result<Option<DistributedSpec>, ConfigError> {
    let timeout_s = raw.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(1..=MAX_TIMEOUT_S).contains(&timeout_s) {
        let allowed = format!("seconds a peer waits for the others: 1 to {MAX_TIMEOUT_S}");
        return Err(out_of_range("distributed.timeout_s", timeout_s, &allowed));
    }
    let nodes = nodes(raw)?;
    // A node of several gets one device by default: the one `backend.kind` selects.
    if let (Some(n), None, BackendKind::Wgpu) = (&nodes, &raw.devices, backend) {
        let allowed =
            "backend.kind = \"wgpu\" cannot run a node (set it to \"cpu\", \"cuda\" or \"auto\")";
        return Err(out_of_range("distributed.nodes", n.count, allowed));
    }
    let Some(names) = &raw.devices else {
        return Ok(nodes.map(|nodes| DistributedSpec {
            devices: vec![DeviceSpec::Selected],
            strategy: raw.strategy,
            shard: raw.shard,
            timeout: Duration::from_secs(timeout_s),
            nodes: Some(nodes),
        }))
        .and_then(|spec| ring_across(spec, raw));
    };
    let list = format!("{names:?}");
    if names.is_empty() || names.len() > MAX_PEERS {
        let allowed = format!("one peer per entry: 1 to {MAX_PEERS} devices");
        return Err(out_of_range("distributed.devices", list, &allowed));
    }
    let mut devices = Vec::with_capacity(names.len());
    for name in names {
        let device = DeviceSpec::parse(name).ok_or_else(|| {
            let allowed = format!("{name:?} is not a device: \"cpu\" or \"cuda:<index>\"");
            out_of_range("distributed.devices", &list, &allowed)
        })?;
        if let DeviceSpec::Cuda(_) = device {
            if devices.contains(&device) {
                let allowed = format!("{name} is listed twice: one peer per CUDA device");
                return Err(out_of_range("distributed.devices", &list, &allowed));
            }
        }
        devices.push(device);
    }
    let kind = devices[0].kind();
    if devices.iter().any(|d| d.kind() != kind) {
        let allowed = "every device of one kind: all \"cpu\" or all \"cuda:<index>\"";
        return Err(out_of_range("distributed.devices", list, allowed));
    }
    if backend != BackendKind::Auto && backend != kind {
        let allowed = format!(
            "backend.kind = \"{}\" cannot run them (set it to \"{}\" or \"auto\")",
            backend.name(),
            kind.name()
        );
        return Err(out_of_range("distributed.devices", list, &allowed));
    }
    ring_across(
        Some(DistributedSpec {
            devices,
            strategy: raw.strategy,
            shard: raw.shard,
            timeout: Duration::from_secs(timeout_s),
            nodes,
        }),
        raw,
    )
}

/// Refuses a ring over more than two nodes: burn-collective's global ring refuses tensors of
/// fewer elements than nodes.
fn ring_across(
    spec: Option<DistributedSpec>,
    raw: &RawDistributed,
) -> Result<Option<DistributedSpec>, ConfigError> {
    let nodes = spec
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .map_or(1, |n| n.count);
    if nodes > 2 && raw.strategy == Strategy::Ring {
        let allowed = format!(
            "burn-collective's ring across {nodes} nodes refuses tensors of fewer elements than \
             nodes: use \"tree\" or \"centralized\""
        );
        return Err(out_of_range("distributed.strategy", "ring", &allowed));
    }
    Ok(spec)
}

/// The nodes of `raw`, when it has more than one.
fn nodes(raw: &RawDistributed) -> Result<Option<NodeSpec>, ConfigError> {
    let count = raw.nodes.unwrap_or(1);
    if !(1..=MAX_NODES).contains(&count) {
        let allowed = format!("processes in the run: 1 to {MAX_NODES}");
        return Err(out_of_range("distributed.nodes", count, &allowed));
    }
    let rank = raw.node_rank.unwrap_or(0);
    if rank >= count {
        let allowed = format!(
            "this node's rank among distributed.nodes = {count}: 0 to {}",
            count - 1
        );
        return Err(out_of_range("distributed.node_rank", rank, &allowed));
    }
    if count == 1 {
        for (key, value) in [
            ("distributed.orchestrator", &raw.orchestrator),
            ("distributed.node_address", &raw.node_address),
        ] {
            if let Some(value) = value {
                let value = format!("{value:?}");
                return Err(out_of_range(key, value, "only with distributed.nodes > 1"));
            }
        }
        return Ok(None);
    }
    let Some(orchestrator) = raw.orchestrator.clone() else {
        let allowed = "several nodes need distributed.orchestrator = \"ws://HOST:PORT\"";
        return Err(out_of_range("distributed.nodes", count, allowed));
    };
    let Some((_, port)) = ws_address(&orchestrator) else {
        let allowed = "an address ws://HOST:PORT (HOST a name or IP, PORT 1 to 65535)";
        return Err(out_of_range(
            "distributed.orchestrator",
            format!("{orchestrator:?}"),
            allowed,
        ));
    };
    let address = match &raw.node_address {
        Some(address) => address.clone(),
        None => {
            let port = u32::from(port) + 1 + rank;
            if port > u32::from(u16::MAX) {
                let allowed =
                    "its port + 1 + node_rank is past 65535: set distributed.node_address";
                return Err(out_of_range(
                    "distributed.orchestrator",
                    format!("{orchestrator:?}"),
                    allowed,
                ));
            }
            format!("ws://127.0.0.1:{port}")
        }
    };
    let Some((_, data_port)) = ws_address(&address) else {
        let allowed = "an address ws://HOST:PORT (HOST a name or IP, PORT 1 to 65535)";
        return Err(out_of_range(
            "distributed.node_address",
            format!("{address:?}"),
            allowed,
        ));
    };
    Ok(Some(NodeSpec {
        count,
        rank,
        orchestrator,
        address,
        data_port,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_strictly() {
        assert_eq!(DeviceSpec::parse("cpu"), Some(DeviceSpec::Cpu));
        assert_eq!(DeviceSpec::parse("cuda:3"), Some(DeviceSpec::Cuda(3)));
        for bad in [
            "CPU", "cuda", "cuda:", "cuda:+1", "cuda: 1", "cuda:1x", "gpu:0",
        ] {
            assert_eq!(DeviceSpec::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn addresses_parse_strictly() {
        assert_eq!(
            ws_address("ws://127.0.0.1:29500"),
            Some(("127.0.0.1", 29500))
        );
        assert_eq!(
            ws_address("ws://node-3.cluster:80"),
            Some(("node-3.cluster", 80))
        );
        for bad in [
            "127.0.0.1:29500",
            "http://a:1",
            "ws://:1",
            "ws://a",
            "ws://a:0",
            "ws://a:65536",
            "ws://a:+1",
            "ws://a b:1",
            "ws://a:1/x",
        ] {
            assert_eq!(ws_address(bad), None, "{bad}");
        }
    }
}
