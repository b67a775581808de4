use super::common::{arg, run, stderr, table_value, temp, train};

/// ln(10): the loss of a model that guesses uniformly over 10 classes.
const CHANCE_LOSS: f64 = std::f64::consts::LN_10;

/// A tiny GPT through the binary on the built-in corpus: 150 steps take the eval loss far below
/// ln 256 (a model that knows nothing), and the summary speaks of tokens and perplexity.
#[test]
fn a_tiny_gpt_learns_the_built_in_corpus() {
    let (stdout, s) = train(
        "gpt",
        &[
            "--config",
            "configs/gpt-small.toml",
            "--backend",
            "cpu",
            "--max-steps",
            "150",
            "--set",
            "model.n_layer=2",
            "--set",
            "model.d_model=64",
            "--set",
            "model.seq_len=32",
            "--set",
            "data.corpus_bytes=200000",
            "--set",
            "data.eval_size=64",
            "--set",
            "train.lr=3e-3",
        ],
    );
    assert_eq!(
        s["model"],
        "gpt(2 layers, 4 heads, d=64, seq=32, naive attention)"
    );
    let params = s["parameters"].as_u64().unwrap();
    // (256 + 32)·64 embeddings, 2 blocks of 12·64² + 13·64, the final LayerNorm.
    assert_eq!(
        params,
        (256 + 32) * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64
    );
    let loss = s["eval_loss"].as_f64().unwrap();
    assert!(loss < 0.4 * (256f64).ln(), "{s}");
    let perplexity = s["eval_perplexity"].as_f64().unwrap();
    assert!((perplexity - loss.exp()).abs() < 1e-9 * perplexity, "{s}");
    let (images, tokens) = (
        s["images_per_sec"].as_f64().unwrap(),
        s["tokens_per_sec"].as_f64().unwrap(),
    );
    assert!((tokens - 32.0 * images).abs() < 1e-6 * tokens, "{s}");
    assert!(stdout.contains("tokens/s") && stdout.contains("eval perplexity"));
    assert!(!stdout.contains("images/s"), "{stdout}");
    // Evaluation's speed counts tokens too.
    let eval_rate = s["eval_per_sec"].as_f64().unwrap();
    assert_eq!(
        table_value(&stdout, "eval speed"),
        Some(format!("{eval_rate:.0} tokens/s")),
        "{stdout}"
    );
}

#[test]
fn simple_model_learns_the_synthetic_data() {
    let (stdout, s) = train(
        "simple",
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
            "data.eval_size=512",
        ],
    );
    assert!(
        stdout.contains("summary") && stdout.contains("eval accuracy"),
        "{stdout}"
    );
    assert_eq!(s["model"], "simple");
    assert_eq!(s["parameters"], 165_642);
    assert_eq!(s["backend"], "cpu");
    assert_eq!(s["precision"], "f32");
    assert_eq!(s["batch_size"], 32);
    assert_eq!(s["steps"], 100);
    assert_eq!(s["config"], "configs/f32.toml");
    assert!(s["images_per_sec"].as_f64().unwrap() > 0.0);
    assert!(s["wall_seconds"].as_f64().unwrap() > 0.0);
    let eval_rate = s["eval_per_sec"].as_f64().unwrap();
    assert!(eval_rate > 0.0, "{s}");
    assert_eq!(
        table_value(&stdout, "eval speed"),
        Some(format!("{eval_rate:.0} images/s")),
        "{stdout}"
    );
    assert!(
        s["final_train_loss"].as_f64().unwrap() < 0.6 * CHANCE_LOSS,
        "{s}"
    );
    let accuracy = s["eval_accuracy"].as_f64().unwrap();
    assert!(
        accuracy > 0.5,
        "eval accuracy {accuracy} after 100 steps (chance is 0.1)"
    );
}

#[test]
fn mobilenet_learns_the_synthetic_data() {
    let (_, s) = train(
        "mobilenet",
        &[
            "--config",
            "configs/mobilenet.toml",
            "--backend",
            "cpu",
            "--max-steps",
            "60",
            "--set",
            "model.width_multiplier=0.25",
            "--set",
            "train.batch_size=32",
            "--set",
            "data.eval_size=256",
            "--set",
            "train.lr=1e-2",
        ],
    );
    assert_eq!(s["model"], "mobilenet(α=0.25)");
    assert_eq!(s["steps"], 60);
    let accuracy = s["eval_accuracy"].as_f64().unwrap();
    // Measured: 0.50 at lr 1e-2 (0.22 at the config's 2e-3: BN running statistics lag early on).
    assert!(
        accuracy > 0.3,
        "eval accuracy {accuracy} after 60 steps (chance is 0.1)"
    );
}

/// ResNet-18 with the CIFAR stem learns the synthetic data in f32 and in f16 mixed precision
/// (a quarter of the width, to keep the test short: the same blocks and stages).
#[test]
fn resnet18_learns_the_synthetic_data_in_f32_and_f16_mixed() {
    for config in ["configs/resnet18.toml", "configs/resnet18-amp.toml"] {
        let (_, s) = train(
            &format!("resnet-{}", config.len()),
            &[
                "--config",
                config,
                "--backend",
                "cpu",
                "--max-steps",
                "40",
                "--set",
                "model.width_multiplier=0.25",
                "--set",
                "train.batch_size=32",
                "--set",
                "data.eval_size=256",
                "--set",
                "train.lr=3e-3",
            ],
        );
        assert_eq!(s["model"], "resnet18(cifar, α=0.25)", "{config}");
        assert_eq!(s["steps"], 40, "{config}");
        let accuracy = s["eval_accuracy"].as_f64().unwrap();
        assert!(
            accuracy > 0.3,
            "{config}: eval accuracy {accuracy} after 40 steps (chance is 0.1)"
        );
    }
}

fn short_run(name: &str, seed: u64) -> serde_json::Value {
    let seed = format!("train.seed={seed}");
    train(
        name,
        &[
            "--backend",
            "cpu",
            "--max-steps",
            "12",
            "--set",
            "train.batch_size=16",
            "--set",
            "data.eval_size=128",
            "--set",
            &seed,
        ],
    )
    .1
}

#[test]
fn the_same_seed_gives_the_same_run_on_the_cpu() {
    let (a, b, other) = (
        short_run("seed-a", 7),
        short_run("seed-b", 7),
        short_run("seed-c", 8),
    );
    for key in ["final_train_loss", "eval_loss", "eval_accuracy"] {
        assert_eq!(a[key], b[key], "{key} differs between two runs with seed 7");
    }
    assert_ne!(
        a["final_train_loss"], other["final_train_loss"],
        "seed 8 gave seed 7's run"
    );
}

#[test]
fn without_config_the_embedded_default_runs() {
    let (_, s) = train(
        "embedded",
        &[
            "--backend",
            "cpu",
            "--max-steps",
            "2",
            "--set",
            "train.batch_size=8",
            "--set",
            "data.eval_size=16",
        ],
    );
    assert_eq!(s["config"], "embedded/amp.toml");
    assert_eq!(s["precision"], "f16-mixed");
}

#[test]
fn auto_falls_back_to_the_cpu_with_one_line() {
    let dir = temp("auto");
    let out = run(&[
        "--backend",
        "auto",
        "--max-steps",
        "1",
        "--set",
        "train.batch_size=4",
        "--set",
        "data.eval_size=8",
        "--set",
        &format!("train.output_dir={}", arg(&dir)),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).lines().next().unwrap_or_default(),
        "backend auto: no CUDA device (disabled by OOMLAB_NO_CUDA), no wgpu GPU (disabled by \
         OOMLAB_NO_WGPU); using the CPU (Flex)"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        table_value(&stdout, "backend").as_deref(),
        Some("cpu"),
        "{stdout}"
    );
}

#[test]
fn cuda_without_a_device_is_a_clear_error() {
    let out = run(&["--backend", "cuda", "--max-steps", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: backend.kind = \"cuda\": no usable CUDA device 0: disabled by OOMLAB_NO_CUDA \
         (use --backend cpu or auto)\n"
    );
}

/// ResNet takes every switch the other models take: bf16, batch norm in f16, accumulation,
/// activation checkpointing, fused conv → BN → ReLU blocks, freeing cached memory; each run
/// trains and its summary reports the switch.
#[test]
fn resnet_takes_every_switch() {
    for (switch, key, value) in [
        ("precision.mode=bf16-mixed", "precision", "bf16-mixed"),
        ("precision.batch_norm_f32=false", "batch_norm", "f16"),
        ("train.accum_steps=2", "accum_steps", "2"),
        ("memory.checkpointing=balanced", "checkpointing", "balanced"),
        ("memory.fuse=blocks", "fuse", "blocks"),
        ("memory.free_cache=step", "free_cache", "step"),
    ] {
        let (_, s) = train(
            &format!("resnet-switch-{key}"),
            &[
                "--config",
                "configs/resnet18-amp.toml",
                "--backend",
                "cpu",
                "--max-steps",
                "2",
                "--set",
                "model.width_multiplier=0.125",
                "--set",
                "train.batch_size=8",
                "--set",
                "data.train_size=32",
                "--set",
                "data.eval_size=8",
                "--set",
                switch,
            ],
        );
        let reported = match &s[key] {
            serde_json::Value::String(v) => v.clone(),
            other => other.to_string(),
        };
        assert_eq!(reported, value, "{switch}: {s}");
        assert_eq!(s["steps"], 2, "{switch}");
        assert!(
            s["final_train_loss"].as_f64().unwrap().is_finite(),
            "{switch}"
        );
    }
}
