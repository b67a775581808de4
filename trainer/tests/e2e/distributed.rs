//! `[distributed]`: data parallel over peers that are threads of one process, on the CPU.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::{arg, binary, curve_gap, losses, root, run, run_env, stderr, summary, temp};

pub(super) const TWO_CPUS: &str = "distributed.devices=[\"cpu\",\"cpu\"]";

/// Trains `config` for one epoch of 72 images (windows of 32, 32 and a short 8) with
/// `sets`, in a fresh folder `name`, with `env`; returns the summary and the step losses.
pub(super) fn epoch(
    name: &str,
    config: &str,
    sets: &[&str],
    env: &[(&str, &str)],
) -> (serde_json::Value, Vec<f64>) {
    let dir = temp(name);
    let json = dir.join("summary.json");
    let out_dir = format!("train.output_dir={}", arg(&dir));
    let mut args = vec![
        "--config",
        config,
        "--backend",
        "cpu",
        "--set",
        "data.train_size=72",
        "--set",
        "data.eval_size=16",
        "--set",
        "train.epochs=1",
        "--set",
        &out_dir,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    let json_arg = arg(&json);
    args.extend(["--summary-json", &json_arg]);
    let mut env = env.to_vec();
    env.push(("OOMLAB_NO_WGPU", "1"));
    let out = run_env(&args, &env);
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    (summary(&json), losses(&dir))
}

/// Two peers with micro-batches of 8 against one device with 16, accumulation 2: windows of
/// 32, and an epoch's last window of 8, which peer 0 takes whole and peer 1 sits out.
fn two_peers_against_one(config: &str, extra: &[&str]) -> (Vec<f64>, Vec<f64>, serde_json::Value) {
    let peers = [
        &["train.batch_size=8", "train.accum_steps=2", TWO_CPUS][..],
        extra,
    ]
    .concat();
    let solo = [&["train.batch_size=16", "train.accum_steps=2"][..], extra].concat();
    let tag = config
        .trim_start_matches("configs/")
        .trim_end_matches(".toml");
    let (s2, two) = epoch(&format!("dp-{tag}-2"), config, &peers, &[]);
    let (_, one) = epoch(&format!("dp-{tag}-1"), config, &solo, &[]);
    (two, one, s2)
}

#[test]
fn two_peers_equal_one_device_at_the_doubled_micro_batch() {
    let (two, one, s) = two_peers_against_one("configs/f32.toml", &[]);
    assert_eq!(two.len(), 3, "windows of 32, 32 and 8");
    assert_eq!(s["effective_batch"], 32);
    assert_eq!(s["peers"], serde_json::json!(["cpu", "cpu"]));
    // Up to the order of summation: the peers' gradients are added after their own sums.
    let gap = curve_gap(&two, &one);
    println!("f32: {two:?} vs {one:?}: {gap:e}");
    assert!(gap < 1e-5, "f32: {two:?} vs {one:?}");
}

#[test]
fn two_peers_equal_one_device_in_mixed_precision() {
    let (two, one, s) = two_peers_against_one("configs/amp.toml", &[]);
    assert_eq!(s["skipped_steps"], 0);
    // Each peer's weight gradients are rounded to f16 over its own 8 images before the sum (one
    // f16 ulp is 2^-11 of a value), so the curves part at that scale, not at f32's.
    let gap = curve_gap(&two, &one);
    println!("f16-mixed: {two:?} vs {one:?}: {gap:e}");
    assert!(gap < 1e-3, "f16-mixed: {two:?} vs {one:?}");
}

#[test]
fn batch_norm_is_per_replica() {
    // Each peer normalises its own 8 images: the same as one device whose micro-batches are
    // those 8 images (batch 8, accumulation 4), not one with micro-batches of 16. SGD, because
    // Adam turns the sums' order (last bits) into whole steps on the few near-zero gradients of
    // channels whose batch variance is tiny; under SGD the curves agree to the order's noise.
    let mobilenet = ["model.width_multiplier=0.25", "train.optimizer=sgd"];
    let peers = [
        &["train.batch_size=8", "train.accum_steps=2", TWO_CPUS][..],
        &mobilenet,
    ]
    .concat();
    let per_replica = [
        &["train.batch_size=8", "train.accum_steps=4"][..],
        &mobilenet,
    ]
    .concat();
    let global = [
        &["train.batch_size=16", "train.accum_steps=2"][..],
        &mobilenet,
    ]
    .concat();
    let (_, two) = epoch("dp-bn-2", "configs/mobilenet.toml", &peers, &[]);
    let (_, expected) = epoch("dp-bn-8x4", "configs/mobilenet.toml", &per_replica, &[]);
    let (_, global) = epoch("dp-bn-16x2", "configs/mobilenet.toml", &global, &[]);
    let (same, other) = (curve_gap(&two, &expected), curve_gap(&two, &global));
    println!("per replica {same:e}, against batch statistics over 16: {other:e}");
    assert!(same < 1e-4, "{two:?} vs {expected:?}");
    // The statistics over 16 images are another computation, visibly (a few per cent).
    assert!(other > 100.0 * same.max(1e-6), "{two:?} vs {global:?}");
}

#[test]
fn an_overflow_on_one_peer_skips_the_step_on_every_peer() {
    let sets = ["train.batch_size=8", "train.accum_steps=2", TWO_CPUS];
    let (s1, on_one) = epoch(
        "dp-inf-1",
        "configs/amp.toml",
        &sets,
        &[("OOMLAB_FAULT", "overflow:1:2")],
    );
    let (s0, on_zero) = epoch(
        "dp-inf-0",
        "configs/amp.toml",
        &sets,
        &[("OOMLAB_FAULT", "overflow:0:2")],
    );
    let (_, clean) = epoch("dp-inf-none", "configs/amp.toml", &sets, &[]);
    for s in [&s1, &s0] {
        assert_eq!(s["skipped_steps"], 1, "{s}");
        // The scale backed off once, from 65536.
        assert!(s["loss_scale"].as_str().unwrap().contains("32768"), "{s}");
    }
    // Window 2 was skipped and, as on one device, a window more was taken to make the epoch's
    // three steps; which peer overflowed makes no difference.
    assert_eq!(on_one, on_zero);
    assert_eq!(on_one.len(), 3);
    assert_eq!(on_one[0], clean[0]);
    assert_ne!(on_one[1], clean[1]);
}

#[test]
fn a_failed_peer_ends_the_run_with_one_line_naming_it() {
    let dir = temp("dp-fail");
    let out_dir = format!("train.output_dir={}", arg(&dir));
    let args = [
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--set",
        "data.train_size=96",
        "--set",
        "train.batch_size=8",
        "--set",
        TWO_CPUS,
        "--set",
        "train.checkpoint_every=1",
        "--set",
        &out_dir,
    ];
    let out = run_env(
        &args,
        &[("OOMLAB_NO_WGPU", "1"), ("OOMLAB_FAULT", "fail:1:3")],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).lines().last(),
        Some("error: peer 1 (cpu) failed: failure injected at window 3 (OOMLAB_FAULT)")
    );
    // Rank 0 stopped at the failed window: its last checkpoint is after window 2.
    assert_eq!(losses(&dir).len(), 2);
    // That checkpoint is whole: the run resumes from it on one device at the doubled micro-batch
    // (into another folder) and on two peers, and both take the same third step.
    let checkpoint = arg(&dir.join("checkpoint"));
    let alone = temp("dp-fail-alone");
    let alone_dir = format!("train.output_dir={}", arg(&alone));
    for (sets, out_dir) in [
        (["train.batch_size=16", "train.accum_steps=1"], &alone_dir),
        (["train.batch_size=8", TWO_CPUS], &out_dir),
    ] {
        let resumed = run(&[
            "--config",
            "configs/f32.toml",
            "--backend",
            "cpu",
            "--set",
            "data.train_size=96",
            "--set",
            sets[0],
            "--set",
            sets[1],
            "--set",
            out_dir,
            "--set",
            "train.max_steps=3",
            "--resume",
            &checkpoint,
        ]);
        assert!(resumed.status.success(), "{}", stderr(&resumed));
    }
    let (one, two) = (losses(&alone), losses(&dir));
    assert_eq!(two.len(), 3);
    assert!(curve_gap(&one, &two) < 1e-5, "{one:?} vs {two:?}");
}

#[test]
fn a_peer_that_stops_answering_ends_the_run_within_the_timeout() {
    let dir = temp("dp-hang");
    let out_dir = format!("train.output_dir={}", arg(&dir));
    let started = std::time::Instant::now();
    let out = run_env(
        &[
            "--config",
            "configs/f32.toml",
            "--backend",
            "cpu",
            "--set",
            "data.train_size=96",
            "--set",
            "train.batch_size=8",
            "--set",
            TWO_CPUS,
            "--set",
            "distributed.timeout_s=3",
            "--set",
            &out_dir,
        ],
        &[("OOMLAB_NO_WGPU", "1"), ("OOMLAB_FAULT", "hang:1:2")],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim(),
        "error: peer 0 waited 3 s in all-reduce 2 for peer 1 (distributed.timeout_s): stopped"
    );
    // Bounded: the timeout plus two steps, not a hang (no assertion on how fast).
    println!("ended after {:?}", started.elapsed());
}

// Over several processes (nodes).

/// `--config CONFIG`, a `--set` for each of `sets`, and one making `dir` the output folder.
pub(super) fn flags(config: &str, dir: &Path, sets: &[&str]) -> Vec<String> {
    let out_dir = format!("train.output_dir={}", arg(dir));
    let mut args = vec!["--config".to_string(), config.to_string()];
    for set in sets.iter().copied().chain([out_dir.as_str()]) {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args
}

/// The flags of a run of 256 images in micro-batches of 8, one epoch, into `dir`.
pub(super) fn small_run(config: &str, dir: &Path, sets: &[&str]) -> Vec<String> {
    let base = [
        "data.train_size=256",
        "data.eval_size=32",
        "train.batch_size=8",
        "train.epochs=1",
    ];
    let mut args = flags(config, dir, &[&base[..], sets].concat());
    args.extend(["--backend".to_string(), "cpu".to_string()]);
    args
}

pub(super) fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn launch_over_two_processes_equals_the_threaded_run() {
    for (config, devices, threads, tolerance) in [
        // Two peers: a + b is b + a, so the sums are the same bits.
        (
            "configs/f32.toml",
            "distributed.devices=[\"cpu\"]",
            TWO_CPUS,
            0.0,
        ),
        // Four: the two nodes' sums are added in another order than four threads' are.
        (
            "configs/amp.toml",
            TWO_CPUS,
            "distributed.devices=[\"cpu\",\"cpu\",\"cpu\",\"cpu\"]",
            1e-5,
        ),
    ] {
        let (launched, threaded) = (temp("dp-launch"), temp("dp-threads"));
        let mut args = vec!["launch".to_string(), "--nodes".into(), "2".into()];
        args.extend(small_run(
            config,
            &launched,
            &[devices, "distributed.timeout_s=60"],
        ));
        let out = run(&strs(&args));
        assert!(out.status.success(), "{config}: {}", stderr(&out));
        let steps = if devices == TWO_CPUS { 8 } else { 16 };
        assert!(
            stderr(&out).contains(&format!(
                "node 1 of 2: trained {steps} steps with the others (peak "
            )),
            "{}",
            stderr(&out)
        );
        let out = run(&strs(&small_run(config, &threaded, &[threads])));
        assert!(out.status.success(), "{config}: {}", stderr(&out));
        let (a, b) = (losses(&launched), losses(&threaded));
        assert_eq!(a.len(), steps, "many windows, not one all-reduce");
        let gap = curve_gap(&a, &b);
        assert!(gap <= tolerance, "{config}: {a:?} vs {b:?}: {gap:e}");
    }
}

/// A process of this test, killed when the test ends however it ends.
pub(super) struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(super) fn start(args: &[String]) -> Process {
    let child = Command::new(binary())
        .args(args)
        .current_dir(root())
        .env("OOMLAB_NO_CUDA", "1")
        .env("OOMLAB_NO_WGPU", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn trainer");
    Process(child)
}

/// Waits (at most five minutes) for `process` to end; its exit code and stderr.
pub(super) fn finish(mut process: Process) -> (Option<i32>, String) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while process.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "no exit within five minutes");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut text = String::new();
    if let Some(mut pipe) = process.0.stderr.take() {
        let _ = pipe.read_to_string(&mut text);
    }
    (process.0.wait().unwrap().code(), text)
}

fn free_port() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    listener.local_addr().unwrap().port()
}

/// An orchestrator on a free port, and the `--set`s that make node `rank` of 2 use it.
pub(super) fn orchestrator() -> (Process, impl Fn(u32) -> Vec<String>) {
    let port = free_port();
    let process = start(&["orchestrator".into(), "--port".into(), port.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the orchestrator did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let node = move |rank: u32| {
        let data = free_port();
        [
            "distributed.nodes=2".to_string(),
            format!("distributed.node_rank={rank}"),
            format!("distributed.orchestrator=\"ws://127.0.0.1:{port}\""),
            format!("distributed.node_address=\"ws://127.0.0.1:{data}\""),
        ]
        .into_iter()
        .flat_map(|set| ["--set".to_string(), set])
        .collect()
    };
    (process, node)
}

#[test]
fn a_killed_node_ends_the_other_within_the_timeout_with_one_line() {
    let (_orchestrator, node) = orchestrator();
    let (dir0, dir1) = (temp("dp-kill-0"), temp("dp-kill-1"));
    let sets = [
        "train.epochs=1000",
        "train.checkpoint_every=1",
        "distributed.timeout_s=3",
    ];
    let node0 = start(&[small_run("configs/f32.toml", &dir0, &sets), node(0)].concat());
    let mut node1 = start(&[small_run("configs/f32.toml", &dir1, &sets), node(1)].concat());
    let manifest = dir0.join("checkpoint").join("manifest.json");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !manifest.exists() {
        assert!(
            Instant::now() < deadline,
            "no checkpoint within five minutes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    node1.0.kill().unwrap();
    let (code, text) = finish(node0);
    assert_eq!(code, Some(1), "{text}");
    // One line names the lost node: burn-collective notices the closed connection, or (should
    // it not) the wait runs out.
    let last = text.lines().last().unwrap_or_default();
    let lost = last.starts_with("error: peer 0 lost node 1 in all-reduce ")
        && last.ends_with(" (its connection closed): stopped");
    let timed_out = last.starts_with("error: peer 0 waited 3 s in all-reduce ")
        && last.ends_with(" for node 1 (distributed.timeout_s): stopped");
    assert!(lost || timed_out, "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    // The last checkpoint is whole: it resumes, here on one device at the doubled batch, and
    // takes one step more.
    let state = std::fs::read_to_string(dir0.join("checkpoint").join("state.json")).unwrap();
    let step = serde_json::from_str::<serde_json::Value>(&state).unwrap()["step"]
        .as_u64()
        .unwrap();
    let json = dir0.join("resumed.json");
    let resumed = run(&strs(
        &[
            small_run("configs/f32.toml", &dir0, &["train.batch_size=16"]),
            vec!["--max-steps".into(), (step + 1).to_string()],
            vec!["--resume".into(), arg(&dir0.join("checkpoint"))],
            vec!["--summary-json".into(), arg(&json)],
        ]
        .concat(),
    ));
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert_eq!(summary(&json)["steps"].as_u64(), Some(step + 1));
}

#[test]
fn nodes_with_different_configs_exit_2_with_one_line() {
    let (_orchestrator, node) = orchestrator();
    let (dir0, dir1) = (temp("dp-mismatch-0"), temp("dp-mismatch-1"));
    let node0 = start(
        &[
            small_run("configs/f32.toml", &dir0, &["distributed.timeout_s=30"]),
            node(0),
        ]
        .concat(),
    );
    let node1 = start(
        &[
            small_run(
                "configs/f32.toml",
                &dir1,
                &["distributed.timeout_s=30", "train.lr=0.002"],
            ),
            node(1),
        ]
        .concat(),
    );
    let line =
        "error: the nodes' configs differ (a hash of each, compared at registration): every \
                node must run the same config and flags, but for distributed.node_rank and \
                node_address";
    for process in [node0, node1] {
        let (code, text) = finish(process);
        assert_eq!(code, Some(2), "{text}");
        assert_eq!(text.lines().last(), Some(line), "{text}");
    }
}

#[test]
fn a_node_without_its_orchestrator_exits_2_with_one_line() {
    let dir = temp("dp-no-orchestrator");
    let port = free_port();
    let address = format!("distributed.orchestrator=\"ws://127.0.0.1:{port}\"");
    let sets = ["distributed.nodes=2", &address, "distributed.timeout_s=1"];
    let out = run(&strs(&small_run("configs/f32.toml", &dir, &sets)));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "error: distributed.orchestrator = \"ws://127.0.0.1:{port}\": nothing answered there \
             within distributed.timeout_s (1 s): start it first (trainer launch starts one)\n"
        )
    );
}
