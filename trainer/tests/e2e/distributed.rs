//! `[distributed]`: data parallel over peers that are threads of one process, on the CPU.

use super::common::{arg, curve_gap, losses, run, run_env, stderr, summary, temp};

const TWO_CPUS: &str = "distributed.devices=[\"cpu\",\"cpu\"]";

/// Trains `config` for one epoch of 72 images (windows of 32, 32 and a short 8) with
/// `sets`, in a fresh folder `name`, with `env`; returns the summary and the step losses.
fn epoch(
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
