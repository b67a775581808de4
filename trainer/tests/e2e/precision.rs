use super::common::{arg, run, stderr, summary, temp, train};

/// SimpleModel, 100 steps of 32 from the same seed, in each precision.
fn run_mode(mode: &str) -> serde_json::Value {
    let set = format!("precision.mode={mode}");
    train(
        &format!("acc-{mode}"),
        &[
            "--config",
            "configs/f32.toml",
            "--backend",
            "cpu",
            "--max-steps",
            "100",
            "--set",
            "train.batch_size=32",
            "--set",
            "data.eval_size=1024",
            "--set",
            &set,
        ],
    )
    .1
}

#[test]
fn mixed_precision_reaches_f32_accuracy_within_3_points() {
    let reference = run_mode("f32")["eval_accuracy"].as_f64().unwrap();
    for mode in ["f16-mixed", "bf16-mixed"] {
        let s = run_mode(mode);
        assert_eq!(s["precision"], mode);
        let accuracy = s["eval_accuracy"].as_f64().unwrap();
        println!("{mode}: {accuracy:.4} vs f32 {reference:.4}");
        assert!(
            (accuracy - reference).abs() <= 0.03,
            "{mode}: eval accuracy {accuracy} vs f32 {reference}"
        );
    }
}

#[test]
fn amp_config_reports_precision_scaling_and_batch() {
    let (stdout, s) = train(
        "amp",
        &[
            "--config",
            "configs/amp-accum.toml",
            "--backend",
            "cpu",
            "--max-steps",
            "3",
            "--set",
            "data.eval_size=64",
        ],
    );
    assert_eq!(s["precision"], "f16-mixed");
    assert_eq!(
        s["batch_norm"],
        serde_json::Value::Null,
        "SimpleModel has no BN"
    );
    assert!(
        s["loss_scale"].as_str().unwrap().starts_with("dynamic, "),
        "{s}"
    );
    assert_eq!(
        (s["batch_size"].as_u64(), s["accum_steps"].as_u64()),
        (Some(32), Some(4))
    );
    assert_eq!(s["effective_batch"], 128);
    assert_eq!(s["steps"], 3);
    assert!(stdout.contains("32 × accum 4 = 128 per step"), "{stdout}");
}

#[test]
fn loss_scale_with_f32_runs_with_scaling_off_and_says_so() {
    let dir = temp("f32-scale");
    let json = dir.join("s.json");
    let out = run(&[
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--max-steps",
        "1",
        "--set",
        "precision.loss_scale=1024",
        "--set",
        "data.eval_size=16",
        "--set",
        &format!("train.output_dir={}", arg(&dir)),
        "--summary-json",
        &arg(&json),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with(
            "note: precision.loss_scale = 1024 has no effect with precision.mode = \"f32\": \
             f32 gradients do not underflow, so loss scaling is off\n"
        ),
        "{}",
        stderr(&out)
    );
    assert_eq!(summary(&json)["loss_scale"], "off");
}

#[test]
fn zero_accumulation_steps_fail_clearly() {
    let out = run(&[
        "--config",
        "configs/amp.toml",
        "--set",
        "train.accum_steps=0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "config error: train.accum_steps = 0: must be at least 1 (1 = no accumulation)\n"
    );
}

#[test]
fn pure_f16_runs_and_reports_lost_updates() {
    let (_, s) = train(
        "f16-pure",
        &[
            "--config",
            "configs/f16-pure.toml",
            "--backend",
            "cpu",
            "--max-steps",
            "5",
            "--set",
            "data.eval_size=64",
        ],
    );
    assert_eq!(s["precision"], "f16");
    let lost = s["updates_lost"].as_f64().unwrap();
    assert!(
        lost > 0.5,
        "at lr 2e-5 most f16 updates round away, got {lost}"
    );
}
