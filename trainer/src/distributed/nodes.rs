//! A run over several processes (nodes): the orchestrator they register with, the checks a
//! node makes before it joins, and the hash by which the nodes agree that they run one config.
//!
//! burn-collective retries an unreachable orchestrator for ever (printing a line a second) and
//! loses the error of a data port it cannot bind, leaving the peers blocked; so a node first
//! binds its port once itself and reaches the orchestrator within `distributed.timeout_s`.

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::link::DistributedError;
use crate::config::{ws_address, NodeSpec, Settings};

/// How often a node tries the orchestrator's address while it waits for it.
const RETRY: Duration = Duration::from_millis(200);

/// burn-communication's websocket server installs a logger the first time one starts (INFO,
/// on stdout) and logs every tensor download through it: a node's stdout is its summary. A
/// logger that drops everything goes first; theirs is then refused, as it allows for.
fn quiet_transport() {
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
}

/// Serves the orchestrator on `port` (all interfaces) until SIGINT or SIGTERM.
pub fn serve_orchestrator(port: u16) -> anyhow::Result<()> {
    quiet_transport();
    // Bound once here, so that a taken port is an error and not a silent, idle orchestrator.
    TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| anyhow::anyhow!("orchestrator port {port}: cannot listen there: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(burn_collective::start_global_orchestrator(port));
    Ok(())
}

/// Checks that `node` can serve tensors on its port and reach the orchestrator, trying the
/// orchestrator until `timeout` (it may start after the nodes).
pub fn check_before_joining(node: &NodeSpec, timeout: Duration) -> Result<(), DistributedError> {
    quiet_transport();
    TcpListener::bind(("0.0.0.0", node.data_port)).map_err(|e| DistributedError::PortTaken {
        address: node.address.clone(),
        reason: e.to_string(),
    })?;
    let unreachable = || DistributedError::NoOrchestrator {
        address: node.orchestrator.clone(),
        waited_s: timeout.as_secs(),
    };
    let (host, port) = ws_address(&node.orchestrator).ok_or_else(unreachable)?;
    let started = Instant::now();
    loop {
        let addresses = (host, port).to_socket_addrs().into_iter().flatten();
        for address in addresses {
            if TcpStream::connect_timeout(&address, RETRY).is_ok() {
                return Ok(());
            }
        }
        if started.elapsed() >= timeout {
            return Err(unreachable());
        }
        std::thread::sleep(RETRY);
    }
}

/// The run's config as numbers every peer can sum: 8 chunks of 12 bits of a SHA-256 of the
/// validated config, without what may differ between nodes (the node's rank and address, the
/// output folder, which only node 0 writes). Sums of up to 4096 peers stay exact in f32.
pub fn config_hash(settings: &Settings) -> [f32; 8] {
    let mut config: toml::Table = toml::from_str(&settings.toml).unwrap_or_default();
    if let Some(toml::Value::Table(d)) = config.get_mut("distributed") {
        d.remove("node_rank");
        d.remove("node_address");
    }
    if let Some(toml::Value::Table(t)) = config.get_mut("train") {
        t.remove("output_dir");
    }
    let digest = Sha256::digest(toml::to_string(&config).unwrap_or_default().as_bytes());
    let mut chunks = [0.0; 8];
    for (i, chunk) in chunks.iter_mut().enumerate() {
        let bits = u16::from_be_bytes([digest[2 * i], digest[2 * i + 1]]) & 0x0fff;
        *chunk = f32::from(bits);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{load_str, Settings};

    fn settings(text: &str, sets: &[&str]) -> Settings {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        load_str(text, std::path::Path::new("t.toml"), &sets).unwrap()
    }

    #[test]
    fn the_hash_ignores_what_nodes_may_differ_in_and_nothing_else() {
        let text =
            "[model]\nname = \"simple\"\n[backend]\nkind = \"cpu\"\n[distributed]\nnodes = 2\n\
                    orchestrator = \"ws://127.0.0.1:4000\"\n";
        let base = config_hash(&settings(text, &[]));
        let node1 = settings(
            text,
            &["distributed.node_rank=1", "train.output_dir=\"elsewhere\""],
        );
        assert_eq!(config_hash(&node1), base);
        let other = settings(text, &["train.lr=0.5"]);
        assert_ne!(config_hash(&other), base);
    }

    #[test]
    fn a_taken_port_is_refused() {
        let taken = TcpListener::bind(("0.0.0.0", 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let node = NodeSpec {
            count: 2,
            rank: 1,
            orchestrator: "ws://127.0.0.1:1".into(),
            address: format!("ws://127.0.0.1:{port}"),
            data_port: port,
        };
        let error = check_before_joining(&node, Duration::from_secs(1)).unwrap_err();
        assert!(
            matches!(error, DistributedError::PortTaken { .. }),
            "{error}"
        );
    }
}
