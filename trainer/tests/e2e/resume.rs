use super::common::{arg, run_ok, summary, temp};

/// 256 images in batches of 64: 4 steps per epoch.
fn args<'a>(dir: &'a str, json: &'a str, epochs: &'a str) -> Vec<&'a str> {
    with_config("configs/f32.toml", dir, json, epochs)
}

fn with_config<'a>(config: &'a str, dir: &'a str, json: &'a str, epochs: &'a str) -> Vec<&'a str> {
    vec![
        "--config",
        config,
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

/// The config's micro-batch (`args` sets 64 for the f32 test).
const MICRO_32: [&str; 2] = ["--set", "train.batch_size=32"];

/// f16-mixed, micro-batches of 32 × 4: 256 images are 2 optimizer steps per epoch. A run
/// stopped after 1 step (mid-epoch, between windows) and resumed gives the straight run's
/// result bit for bit: the checkpoint kept the scaler state and the accumulation position.
#[test]
fn resuming_mid_epoch_keeps_the_scaler_and_the_accumulation_position() {
    let config = "configs/amp-accum.toml";
    let straight = temp("resume-amp-straight");
    let (dir, json) = (
        format!("train.output_dir={}", arg(&straight)),
        arg(&straight.join("s.json")),
    );
    let mut args = with_config(config, &dir, &json, "train.epochs=2");
    args.extend(MICRO_32);
    run_ok(&args);
    let straight = summary(&straight.join("s.json"));
    assert_eq!(
        (
            straight["steps"].as_u64(),
            straight["effective_batch"].as_u64()
        ),
        (Some(4), Some(128))
    );

    let split = temp("resume-amp-split");
    let (dir, json) = (
        format!("train.output_dir={}", arg(&split)),
        arg(&split.join("s.json")),
    );
    let mut first = with_config(config, &dir, &json, "train.epochs=2");
    first.extend(["--max-steps", "1"]);
    first.extend(MICRO_32);
    run_ok(&first);
    let checkpoint = split.join("checkpoint");
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(checkpoint.join("state.json")).unwrap())
            .unwrap();
    assert_eq!(
        (state["step"].as_u64(), state["window"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(state["scaler"]["scale"].as_f64().is_some(), "{state}");

    let mut resumed = with_config(config, &dir, &json, "train.epochs=2");
    let checkpoint = arg(&checkpoint);
    resumed.extend(["--resume", &checkpoint]);
    resumed.extend(MICRO_32);
    run_ok(&resumed);
    let resumed = summary(&split.join("s.json"));
    for key in [
        "steps",
        "skipped_steps",
        "loss_scale",
        "eval_loss",
        "eval_accuracy",
    ] {
        assert_eq!(resumed[key], straight[key], "{key}");
    }
}
