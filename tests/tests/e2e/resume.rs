use super::common::{arg, run_ok, summary, temp};

/// 256 images in batches of 64: 4 steps per epoch.
fn args<'a>(dir: &'a str, json: &'a str, epochs: &'a str) -> Vec<&'a str> {
    vec![
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--set",
        "data.train_size=256",
        "--set",
        "data.eval_size=64",
        "--set",
        "train.batch_size=64",
        "--set",
        epochs,
        "--set",
        dir,
        "--summary-json",
        json,
    ]
}

#[test]
fn resuming_from_an_epoch_checkpoint_continues_the_same_run() {
    let straight = temp("resume-straight");
    let (dir, json) = (
        format!("train.output_dir={}", arg(&straight)),
        arg(&straight.join("s.json")),
    );
    run_ok(&args(&dir, &json, "train.epochs=2"));
    let straight = summary(&straight.join("s.json"));
    assert_eq!(straight["steps"], 8);

    let split = temp("resume-split");
    let (dir, json) = (
        format!("train.output_dir={}", arg(&split)),
        arg(&split.join("s.json")),
    );
    run_ok(&args(&dir, &json, "train.epochs=1"));
    let checkpoint = split.join("checkpoint");
    for file in ["model.mpk", "optim.mpk", "state.json"] {
        assert!(
            checkpoint.join(file).exists(),
            "{file} missing from the checkpoint"
        );
    }
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(checkpoint.join("state.json")).unwrap())
            .unwrap();
    assert_eq!(
        (state["step"].as_u64(), state["epoch"].as_u64()),
        (Some(4), Some(1))
    );

    let mut resumed = args(&dir, &json, "train.epochs=2");
    let checkpoint = arg(&checkpoint);
    resumed.extend(["--resume", &checkpoint]);
    run_ok(&resumed);
    let resumed = summary(&split.join("s.json"));
    assert_eq!(resumed["steps"], 8);
    // Same weights, same Adam moments, same data order: the same numbers, bit for bit.
    assert_eq!(resumed["eval_loss"], straight["eval_loss"]);
    assert_eq!(resumed["eval_accuracy"], straight["eval_accuracy"]);
}
