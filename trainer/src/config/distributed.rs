//! `[distributed]`: data parallel over several devices, one peer (a thread) per device.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{out_of_range, BackendKind, ConfigError};

/// The most peers a run may have.
pub const MAX_PEERS: usize = 64;

/// The longest collective timeout accepted: a day.
pub const MAX_TIMEOUT_S: u64 = 86_400;

/// One device of a data-parallel run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The CPU (Flex). Several peers may share it.
    Cpu,
    /// CUDA device `index`.
    Cuda(usize),
}

impl DeviceSpec {
    /// The backend this device belongs to.
    pub fn kind(self) -> BackendKind {
        match self {
            Self::Cpu => BackendKind::Cpu,
            Self::Cuda(_) => BackendKind::Cuda,
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

/// `[distributed]` as written.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawDistributed {
    /// One peer per entry: `"cpu"` or `"cuda:N"`. Unset: one device, no collective.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<String>>,
    /// The all-reduce strategy.
    pub strategy: Strategy,
    /// Seconds a peer waits in a collective call before it gives up on the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
}

/// A data-parallel run: which devices, how they reduce, how long a peer waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSpec {
    /// One peer per device, rank = position.
    pub devices: Vec<DeviceSpec>,
    /// The all-reduce strategy.
    pub strategy: Strategy,
    /// How long a peer waits for the others in one collective call.
    pub timeout: Duration,
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
    let Some(names) = &raw.devices else {
        return Ok(None);
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
    Ok(Some(DistributedSpec {
        devices,
        strategy: raw.strategy,
        timeout: Duration::from_secs(timeout_s),
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
}
