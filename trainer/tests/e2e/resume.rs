use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::common::{arg, binary, root, run, run_ok, stderr, summary, temp};
use super::reliability::{first_line, toml, with_small};

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

/// One finished epoch in `dir`, for the resume tests.
fn one_epoch(dir: &Path) {
    let set = format!("train.output_dir={}", toml(dir));
    let out = run(&with_small(&[
        "--config",
        "configs/f32.toml",
        "--set",
        &set,
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn resume_refuses_a_config_that_would_reinterpret_the_run() {
    let dir = temp("resume-changed");
    one_epoch(&dir);
    let checkpoint = arg(&dir.join("checkpoint"));
    let set = format!("train.output_dir={}", toml(&dir));
    let out = run(&[
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--set",
        "data.train_size=256",
        "--set",
        "data.eval_size=64",
        "--set",
        "train.batch_size=128",
        "--set",
        "data.seed=5",
        "--set",
        &set,
        "--resume",
        &checkpoint,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        first_line(&out),
        format!(
            "error: --resume {checkpoint}: the config changes data.seed 0 → 5, the window \
             (train.batch_size × train.accum_steps × peers) 64 × 1 × 1 → 128 × 1 × 1 from the \
             checkpoint's run; these define the data order, the windows, the model or the \
             precision and cannot change on resume (the learning rate and its schedule, \
             max_steps, epochs, output paths, loss scaling, the [memory] switches and how a \
             window splits into micro-batches and peers can)"
        )
    );
    // A safe change (the learning rate, more epochs) resumes.
    let ok = run(&[
        &with_small(&["--config", "configs/f32.toml", "--set", &set])[..],
        &[
            "--set",
            "train.lr=5e-4",
            "--set",
            "train.epochs=2",
            "--resume",
            &checkpoint,
        ],
    ]
    .concat());
    assert!(ok.status.success(), "{}", stderr(&ok));
}

#[test]
fn a_damaged_checkpoint_is_named_and_never_loaded() {
    let dir = temp("resume-corrupt");
    one_epoch(&dir);
    let checkpoint = dir.join("checkpoint");
    let set = format!("train.output_dir={}", toml(&dir));
    let resume = |what: &str| {
        let c = arg(&checkpoint);
        let out = run(&[
            &with_small(&["--config", "configs/f32.toml", "--set", &set])[..],
            &["--set", "train.epochs=2", "--resume", &c],
        ]
        .concat());
        assert_eq!(out.status.code(), Some(2), "{what}: {}", stderr(&out));
        first_line(&out)
    };
    let model = checkpoint.join("model.mpk");
    let original = std::fs::read(&model).unwrap();
    let mut flipped = original.clone();
    for b in flipped.iter_mut().skip(1000).take(64) {
        *b ^= 0xFF;
    }
    std::fs::write(&model, &flipped).unwrap();
    assert_eq!(
        resume("flipped bytes"),
        format!(
            "error: checkpoint file {}: checksum mismatch: its content changed after it was \
             written",
            model.display()
        )
    );
    std::fs::write(&model, &original[..original.len() / 2]).unwrap();
    assert!(resume("truncated").contains("truncated or replaced"));
    std::fs::write(&model, &original).unwrap();
    // The saved window edited past the epoch's windows once spun forever.
    let state_path = checkpoint.join("state.json");
    let state = std::fs::read_to_string(&state_path).unwrap();
    // (9 keeps the file's length: the checksum, not the size, catches it.)
    std::fs::write(&state_path, state.replace("\"window\": 0", "\"window\": 9")).unwrap();
    assert!(resume("edited state").contains("state.json: checksum mismatch"));
}

#[test]
fn ctrl_c_checkpoints_and_the_run_resumes_bit_identically() {
    let base = |dir: &Path| -> Vec<String> {
        with_small(&["--config", "configs/f32.toml", "--set", "train.epochs=6"])
            .iter()
            .map(|s| s.to_string())
            .chain([
                "--set".into(),
                format!("train.output_dir={}", toml(dir)),
                "--summary-json".into(),
                arg(&dir.join("s.json")),
            ])
            .collect()
    };
    let straight = temp("sigint-straight");
    let out = run(&base(&straight)
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    assert!(out.status.success(), "{}", stderr(&out));

    let split = temp("sigint-split");
    let mut args = base(&split);
    args.extend(["--set".into(), "train.checkpoint_every=1".into()]);
    let child = Command::new(binary())
        .args(&args)
        .current_dir(root())
        .env("OOMLAB_NO_CUDA", "1")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The first checkpoint (after step 1) shows the loop is running.
    let manifest = split.join("checkpoint").join("manifest.json");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !manifest.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{text}");
    assert!(text.contains("interrupted by SIGINT (Ctrl-C)"), "{text}");
    assert!(text.contains("--resume"), "{text}");
    let steps_before = std::fs::read_to_string(split.join("steps.csv")).unwrap();

    let mut resumed = base(&split);
    resumed.extend(["--resume".into(), arg(&split.join("checkpoint"))]);
    let out = run(&resumed.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", stderr(&out));
    let (a, b) = (
        summary(&straight.join("s.json")),
        summary(&split.join("s.json")),
    );
    for key in ["steps", "eval_loss", "eval_accuracy", "final_train_loss"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    // The step log continues: the resumed run's log starts with the interrupted one's.
    let steps_after = std::fs::read_to_string(split.join("steps.csv")).unwrap();
    assert!(steps_after.starts_with(&steps_before));
    assert_eq!(
        steps_after.lines().count(),
        1 + 24,
        "24 windows, one row each"
    );
}

/// Ctrl-C or `checkpoint_every` at an epoch's last window saves before the epoch is closed
/// (window = windows per epoch). Such a checkpoint resumes: the loop closes that epoch first
/// and trains the next, and every planned step is taken.
#[test]
fn a_checkpoint_after_an_epochs_last_window_resumes() {
    use burn::backend::{Autodiff, Flex};
    use trainer::config::{load_file_for, Purpose};
    use trainer::model::Network;
    use trainer::training::accumulate::Position;
    use trainer::training::checkpoint::{self, LoopState};
    use trainer::training::optim::Optim;
    use trainer::training::step::StepCounters;

    let dir = temp("resume-epoch-end");
    let output = format!("train.output_dir={}", toml(&dir));
    let json = arg(&dir.join("s.json"));
    // 256 images in batches of 64: 4 windows an epoch.
    let mut args = with_small(&["--config", "configs/f32.toml", "--set", &output]);
    let sets: Vec<String> = args
        .iter()
        .skip_while(|a| **a != "--set")
        .collect::<Vec<_>>()
        .chunks(2)
        .filter(|pair| pair[0] == &"--set")
        .map(|pair| pair[1].to_string())
        .collect();
    let settings = load_file_for(&root().join("configs/f32.toml"), &sets, Purpose::Train).unwrap();
    let model =
        Network::<Autodiff<Flex>>::init(&settings.model, settings.train.seed, &Default::default())
            .unwrap();
    let state = LoopState::of(
        &settings,
        Position {
            epoch: 0,
            window: 4,
        },
        StepCounters {
            step: 4,
            ..Default::default()
        },
    );
    let header = "window,step,loss,lr,loss_scale,skipped\n";
    let checkpoint = dir.join("checkpoint");
    checkpoint::save(
        &checkpoint,
        &model,
        &Optim::new(&settings.train),
        &state,
        header,
    )
    .unwrap();

    let resume = arg(&checkpoint);
    args.extend([
        "--set",
        "train.epochs=2",
        "--resume",
        &resume,
        "--summary-json",
        &json,
    ]);
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = summary(&dir.join("s.json"));
    assert_eq!(
        (s["steps"].as_u64(), s["epochs"].as_u64()),
        (Some(8), Some(2))
    );
}
