//! `trainer launch`: a run over several processes on this machine, as a multi-node run is over
//! several machines. It starts the orchestrator, then one `trainer` per node with the same
//! flags, each told its node rank and a port of its own, and waits for all of them.
//!
//! The nodes run in process groups of their own, so a terminal's Ctrl-C reaches the launcher
//! only, which forwards it to each node exactly once; every node then stops after the same
//! window (the stop rides on the all-reduce) and node 0 writes the checkpoint. A node that
//! fails or dies ends the others within `distributed.timeout_s`: they notice it themselves.

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use super::{dry_run_ok, settings};
use crate::cli::{Cli, LaunchArgs};
use crate::config::{ConfigError, Purpose};
use crate::exit::Exit;
use crate::training::interrupt::{forward, Interrupt, Stopped, PARENT_PID_ENV};

/// How long the orchestrator gets to start listening.
const ORCHESTRATOR_START: Duration = Duration::from_secs(30);

/// How long the other nodes get past `distributed.timeout_s` after one failed, before they
/// are killed.
const NODE_GRACE: Duration = Duration::from_secs(30);

/// How long the orchestrator (or a node left running) gets to stop after SIGTERM, before it is
/// killed.
const ORCHESTRATOR_STOP: Duration = Duration::from_secs(5);

/// A node ended badly: the launch ends as that node did.
#[derive(Debug, thiserror::Error)]
#[error("node {node} of {nodes} {how} (its own line is above)")]
pub struct NodeFailed {
    /// The node's rank.
    pub node: u32,
    /// Nodes in the run.
    pub nodes: u32,
    /// `exited with code N` or `was killed by signal N`.
    pub how: String,
    /// The exit the launch takes.
    pub exit: Exit,
}

/// Starts the orchestrator and `args.nodes` nodes with `args.flags`, and waits for them.
pub fn run(args: LaunchArgs, dry: bool, interrupt: &Interrupt) -> anyhow::Result<()> {
    let inner =
        Cli::try_parse_from(std::iter::once("trainer".to_string()).chain(args.flags.clone()))
            .map_err(|e| {
                let text = e.to_string();
                let line = text.lines().next().unwrap_or_default();
                ConfigError::Key {
                    key: "trainer launch".into(),
                    message: format!("its training flags: {}", line.trim_start_matches("error: ")),
                }
            })?;
    if inner.command.is_some() {
        return Err(ConfigError::Key {
            key: "trainer launch".into(),
            message: "runs training: give it training flags, not a command".into(),
        }
        .into());
    }
    let run = &inner.run;
    let per_node =
        ["nodes", "node_rank", "orchestrator", "node_address"].map(|k| format!("distributed.{k}="));
    if let Some(set) =
        (run.config.overrides.iter()).find(|o| per_node.iter().any(|k| o.starts_with(k.as_str())))
    {
        return Err(ConfigError::Key {
            key: format!("--set {set}"),
            message: "trainer launch sets the nodes, their ranks and addresses: leave it out"
                .into(),
        }
        .into());
    }
    let (config, overrides, flags) = (
        run.config.config.as_deref(),
        &run.config.overrides,
        run.flag_overrides(),
    );
    // Every port is held until all are chosen, so no two of them are the same.
    let orchestrator_port = match args.port {
        Some(port) => TcpListener::bind(("0.0.0.0", port))
            .map(|listener| (listener, port))
            .map_err(|e| ConfigError::Key {
                key: format!("trainer launch --port {port}"),
                message: format!("cannot listen there: {e}"),
            })?,
        None => free_port()?,
    };
    let port = orchestrator_port.1;
    let orchestrator = format!("ws://127.0.0.1:{port}");
    let node_sets = |rank: u32, data_port: u16| {
        vec![
            format!("distributed.nodes={}", args.nodes),
            format!("distributed.node_rank={rank}"),
            format!("distributed.orchestrator=\"{orchestrator}\""),
            format!("distributed.node_address=\"ws://127.0.0.1:{data_port}\""),
        ]
    };
    // Every node's settings are these with its rank: checked once here, before anything runs.
    let check = [overrides.clone(), node_sets(0, 1)].concat();
    let checked = settings(config, &check, &flags, Purpose::Train)?;
    let timeout = checked.distributed.map_or(Duration::ZERO, |d| d.timeout);
    if dry {
        return dry_run_ok(&format!("{} nodes would start", args.nodes));
    }
    if let Some(signal) = interrupt.requested() {
        let what = "stopped before any node started".into();
        return Err(Stopped { signal, what }.into());
    }
    let held: Vec<(TcpListener, u16)> = (0..args.nodes)
        .map(|_| free_port())
        .collect::<anyhow::Result<_>>()?;
    let ports: Vec<u16> = held.iter().map(|(_, p)| *p).collect();
    drop((held, orchestrator_port));

    let exe = std::env::current_exe().context("finding the trainer executable")?;
    let mut orchestrator_process = Orchestrator(start_orchestrator(&exe, port)?);
    let mut nodes = Nodes(Vec::with_capacity(ports.len()));
    for (rank, data_port) in (0..args.nodes).zip(&ports) {
        let mut command = Command::new(&exe);
        command.args(&args.flags);
        for set in node_sets(rank, *data_port) {
            command.args(["--set", &set]);
        }
        let child = command
            .stdin(Stdio::null())
            .env(PARENT_PID_ENV, std::process::id().to_string())
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting node {rank}"))?;
        nodes.0.push(child);
    }
    let mut ends: Vec<(u32, ExitStatus)> = Vec::new();
    // A failed node ends the others within their timeout; a grace beyond it bounds the rest.
    let linger = Some(timeout + NODE_GRACE);
    let waited = interrupt.wait_all(&mut nodes.0, linger, |i, status| {
        ends.push((i as u32, status))
    });
    orchestrator_process.stop();
    waited.context("waiting for the nodes")?;

    // Node 0 speaks for the run when it failed; otherwise the first node that failed does.
    let failed = |(_, status): &&(u32, ExitStatus)| !status.success();
    let first = ends
        .iter()
        .find(|e| e.0 == 0 && failed(e))
        .or_else(|| ends.iter().find(failed));
    let Some(&(node, status)) = first else {
        return Ok(());
    };
    let (how, exit) = match (status.code(), status.signal()) {
        (Some(code), _) => (format!("exited with code {code}"), exit_of(code)),
        (None, Some(signal)) => (format!("was killed by signal {signal}"), Exit::Runtime),
        (None, None) => ("ended without a code".into(), Exit::Runtime),
    };
    Err(NodeFailed {
        node,
        nodes: args.nodes,
        how,
        exit,
    }
    .into())
}

/// The exit a node's code means.
fn exit_of(code: i32) -> Exit {
    [
        Exit::BadInput,
        Exit::OutOfMemory,
        Exit::Hangup,
        Exit::Interrupted,
        Exit::Terminated,
    ]
    .into_iter()
    .find(|e| i32::from(e.code()) == code)
    .unwrap_or(Exit::Runtime)
}

/// A port free on this machine now, with the listener that holds it.
fn free_port() -> anyhow::Result<(TcpListener, u16)> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).context("finding a free port")?;
    let port = listener.local_addr().context("finding a free port")?.port();
    Ok((listener, port))
}

/// Starts `trainer orchestrator --port PORT` and waits until it listens.
fn start_orchestrator(exe: &std::path::Path, port: u16) -> anyhow::Result<Child> {
    let mut child = Command::new(exe)
        .args(["orchestrator", "--port", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Its one line at the stop (SIGTERM received) is not the run's.
        .stderr(Stdio::null())
        .env(PARENT_PID_ENV, std::process::id().to_string())
        // Out of the terminal's process group: it must outlive the nodes' last all-reduce.
        .process_group(0)
        .spawn()
        .context("starting the orchestrator")?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("the orchestrator on port {port} ended at start ({status})");
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(child);
        }
        if started.elapsed() > ORCHESTRATOR_START {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "the orchestrator on port {port} did not listen within {} s",
                ORCHESTRATOR_START.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The orchestrator process, stopped when the launch ends however it ends.
struct Orchestrator(Child);

impl Orchestrator {
    fn stop(&mut self) {
        stop(std::slice::from_mut(&mut self.0));
    }
}

impl Drop for Orchestrator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The nodes started: those still running when the launch ends early (a node that could not
/// start, a failed wait) are stopped, not left training on their own.
struct Nodes(Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        stop(&mut self.0);
    }
}

/// SIGTERM to each of `children` still running, a bounded wait, then SIGKILL and reaping.
fn stop(children: &mut [Child]) {
    for child in children.iter_mut() {
        if let Ok(None) = child.try_wait() {
            forward(child.id(), libc::SIGTERM);
        }
    }
    let started = Instant::now();
    while started.elapsed() < ORCHESTRATOR_STOP {
        if children
            .iter_mut()
            .all(|c| !matches!(c.try_wait(), Ok(None)))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for child in children.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}
