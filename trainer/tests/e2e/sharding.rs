//! `distributed.shard`: ZeRO-1 (`optimizer`) and ZeRO-2 (`optimizer+gradients`) on peers that
//! are threads and on nodes that are processes, on the CPU.

use super::common::{arg, curve_gap, losses, run, stderr, summary, temp};
use super::distributed::{epoch, flags, strs, TWO_CPUS};

const STAGES: [&str; 2] = [
    "distributed.shard=\"optimizer\"",
    "distributed.shard=\"optimizer+gradients\"",
];

#[test]
fn zero_stages_equal_the_unsharded_run() {
    for config in ["configs/f32.toml", "configs/amp.toml"] {
        let sets = ["train.batch_size=8", "train.accum_steps=2", TWO_CPUS];
        let (plain, expected) = epoch("zero-none", config, &sets, &[]);
        assert_eq!(plain["shard"], "none");
        for stage in STAGES {
            let (s, got) = epoch("zero-stage", config, &[&sets[..], &[stage]].concat(), &[]);
            let gap = curve_gap(&got, &expected);
            println!("{config} {stage}: {got:?} vs {expected:?}: {gap:e}");
            // Two peers: each sum is a + b either way, each parameter is stepped by the same
            // Adam on the same sum, and a weight plus zeros is that weight: the same bits.
            assert_eq!(gap, 0.0, "{config} {stage}: {got:?} vs {expected:?}");
            assert_eq!(s["skipped_steps"], plain["skipped_steps"]);
            assert!(
                s["shard"].as_str().is_some_and(|name| stage.contains(name)),
                "{s}"
            );
        }
    }
}

/// One epoch of MobileNet α 0.5 at batch 4 on two peers with `shard`: the summary.
fn mobilenet(shard: &str) -> serde_json::Value {
    let sets = [
        "model.width_multiplier=0.5",
        "train.batch_size=4",
        "train.max_steps=2",
        TWO_CPUS,
        shard,
    ];
    epoch("zero-state", "configs/mobilenet.toml", &sets, &[]).0
}

#[test]
fn each_peer_keeps_about_half_of_adams_state() {
    let whole = mobilenet("distributed.shard=\"none\"");
    let params = whole["parameters"].as_u64().unwrap();
    let full = whole["optimizer_state_bytes"].as_u64().unwrap();
    // Adam's two moments, f32, for every parameter.
    assert_eq!(full, 8 * params, "{whole}");
    for stage in STAGES {
        let s = mobilenet(stage);
        let mine = s["optimizer_state_bytes"].as_u64().unwrap() as f64;
        let share = mine / full as f64;
        println!("{stage}: rank 0 keeps {share:.3} of the state");
        // Whole parameters are owned, balanced by size: near a half, not exactly.
        assert!((0.45..=0.55).contains(&share), "{stage}: {share}");
    }
}

#[test]
fn a_sharded_checkpoint_is_whole_and_resumes_on_any_number_of_peers() {
    // 96 images, windows of 16: six steps. A sharded run stops after three; its checkpoint
    // resumes on one device at the doubled batch and on two sharded peers, and both take the
    // steps the unsharded run took.
    let straight = temp("zero-straight");
    let base = |dir: &std::path::Path, sets: &[&str]| {
        let epoch = ["data.train_size=96", "data.eval_size=16", "train.epochs=1"];
        let mut args = flags("configs/f32.toml", dir, &[&epoch[..], sets].concat());
        args.extend(["--backend".to_string(), "cpu".to_string()]);
        args
    };
    let out = run(&strs(&base(&straight, &["train.batch_size=8", TWO_CPUS])));
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = losses(&straight);
    assert_eq!(expected.len(), 6);
    for (stage, resume_on) in [
        (STAGES[0], &["train.batch_size=16"][..]),
        (STAGES[1], &["train.batch_size=8", TWO_CPUS, STAGES[1]][..]),
    ] {
        let dir = temp("zero-stopped");
        let first = [&["train.batch_size=8", TWO_CPUS, stage, "train.max_steps=3"][..]].concat();
        let out = run(&strs(&base(&dir, &first)));
        assert!(out.status.success(), "{stage}: {}", stderr(&out));
        let mut args = base(&dir, resume_on);
        args.extend(["--resume".into(), arg(&dir.join("checkpoint"))]);
        let out = run(&strs(&args));
        assert!(out.status.success(), "{stage}: {}", stderr(&out));
        let got = losses(&dir);
        let gap = curve_gap(&got, &expected);
        println!("{stage}, resumed on {resume_on:?}: {got:?} vs {expected:?}: {gap:e}");
        // Adam restarted on a parameter without its moments would be off by far more.
        assert!(gap < 1e-5, "{stage}: {got:?} vs {expected:?}");
    }
}

// One process per peer: each process's heap is one peer's.

/// The flags of MobileNet α 2 at batch 1 with Adam, 3 steps, one peer per node, into `dir`.
fn wide_mobilenet(dir: &std::path::Path, sets: &[&str]) -> Vec<String> {
    let base = [
        "backend.kind=\"cpu\"",
        "model.width_multiplier=2.0",
        "train.batch_size=1",
        "train.max_steps=3",
        "data.train_size=16",
        "data.eval_size=4",
        "distributed.timeout_s=120",
    ];
    flags("configs/mobilenet.toml", dir, &[&base[..], sets].concat())
}

/// Node 0 of two (no orchestrator runs there: for what is decided before joining).
const NODE_OF_TWO: [&str; 2] = [
    "distributed.nodes=2",
    "distributed.orchestrator=\"ws://127.0.0.1:29500\"",
];

/// The CPU heap peak `trainer estimate` predicts for one node of two with `shard`.
fn predicted(shard: &str) -> u64 {
    let dir = temp("zero-estimate");
    let json = dir.join("estimate.json");
    let sets = [&[shard][..], &NODE_OF_TWO].concat();
    let mut args = vec!["estimate".to_string()];
    args.extend(wide_mobilenet(&dir, &sets));
    args.extend(["--json".into(), arg(&json)]);
    let out = run(&strs(&args));
    assert!(out.status.success(), "{}", stderr(&out));
    let e = summary(&json);
    let bytes = |v: &serde_json::Value| v["bytes"].as_u64().unwrap_or(0);
    e["device_peak_bytes"].as_u64().unwrap() + bytes(&e["host_data"]) + bytes(&e["cpu_runtime"])
}

/// Two processes of MobileNet α 2 at batch 1 with `shard` (and `budget`): node 0's summary.
fn launched(name: &str, shard: &str, budget: Option<String>) -> (serde_json::Value, String) {
    let dir = temp(name);
    let json = dir.join("summary.json");
    let mut args = vec!["launch".to_string(), "--nodes".into(), "2".into()];
    let budget = budget.map(|b| format!("memory.budget={b}"));
    let sets: Vec<&str> = [Some(shard), budget.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    args.extend(wide_mobilenet(&dir, &sets));
    args.extend(["--summary-json".into(), arg(&json)]);
    let out = run(&strs(&args));
    assert!(out.status.success(), "{shard}: {}", stderr(&out));
    (summary(&json), stderr(&out))
}

#[test]
fn sharding_halves_each_processs_optimizer_state_and_fits_the_budget() {
    let (none, optimizer) = (
        "distributed.shard=\"none\"",
        "distributed.shard=\"optimizer\"",
    );
    let (whole, sharded) = (predicted(none), predicted(optimizer));
    println!("predicted per process: unsharded {whole}, ZeRO-1 {sharded}");
    assert!(sharded < whole);
    // A budget between the two: the unsharded run is refused before training, with ZeRO
    // among its fixes; the sharded one trains under it.
    let budget = (whole + sharded) / 2;
    let dir = temp("zero-refused");
    let budget_set = format!("memory.budget={budget}B");
    let args = wide_mobilenet(&dir, &[&[none, &budget_set][..], &NODE_OF_TWO].concat());
    let out = run(&strs(&args));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("ZeRO-1: optimizer state sharded over 2 peers"));

    let (plain, _) = launched("zero-plain", none, None);
    let (zero1, node1) = launched("zero-1", optimizer, Some(format!("{budget}B")));
    let (zero2, _) = launched("zero-2", STAGES[1], None);
    let params = plain["parameters"].as_u64().unwrap();
    let state = |s: &serde_json::Value| s["optimizer_state_bytes"].as_u64().unwrap();
    let peak = |s: &serde_json::Value| s["peak_bytes"].as_u64().unwrap();
    assert_eq!(state(&plain), 8 * params);
    for s in [&zero1, &zero2] {
        let share = state(s) as f64 / state(&plain) as f64;
        assert!((0.45..=0.55).contains(&share), "{share}");
    }
    // Node 1 says what it held.
    assert!(
        node1.contains("node 1 of 2: trained 3 steps with the others (peak "),
        "{node1}"
    );
    // What each process measured: ZeRO-1 saves about the state it no longer keeps (a share of
    // a parameter-dominated peak). Across processes ZeRO-2 saves nothing more: burn-collective
    // has no global reduce, so every sum is made on every node before the others' are dropped.
    let saved = peak(&plain) as f64 - peak(&zero1) as f64;
    let expected = (state(&plain) - state(&zero1)) as f64;
    println!(
        "peaks: {} / {} / {}; ZeRO-1 saved {saved} for {expected} of state",
        peak(&plain),
        peak(&zero1),
        peak(&zero2)
    );
    assert!(
        (0.8..=1.2).contains(&(saved / expected)),
        "{saved} vs {expected}"
    );
    // (The transport's buffers make a few MB of difference between runs.)
    assert!(peak(&zero2) as f64 <= 1.05 * peak(&zero1) as f64);
    assert!(peak(&zero1) <= budget, "{} > {budget}", peak(&zero1));
    // The estimate of each sharded process, measured.
    for s in [&zero1, &zero2] {
        let error = s["prediction_error"].as_f64().unwrap();
        assert!(error.abs() < 0.1, "{s}");
    }
}
