//! Memory on the CPU, measured by the binary's counting allocator: the ratios the fixes promise.
//! Every run is MobileNet's CIFAR preset (α = 1, 32×32, stem stride 1) for two optimizer steps,
//! so the peak includes Adam's state; memory, not time, is asserted.

use super::common::{out_dir, table_value, train};

/// Peak heap bytes of a MobileNet run with these extra `--set`s.
fn peak(name: &str, sets: &[&str]) -> f64 {
    let mut args = vec![
        "--config",
        "configs/mobilenet.toml",
        "--backend",
        "cpu",
        "--max-steps",
        "2",
    ];
    for set in [
        "model.width_multiplier=1.0",
        "data.train_size=256",
        "data.eval_size=16",
    ]
    .iter()
    .chain(sets)
    {
        args.extend(["--set", set]);
    }
    let (_, s) = train(name, &args);
    assert_eq!(s["memory_probe"], "heap", "{s}");
    let peak = s["peak_bytes"].as_f64().unwrap();
    println!("{name}: peak {:.1} MiB", peak / (1 << 20) as f64);
    peak
}

#[test]
fn mixed_precision_accumulation_and_checkpointing_cut_the_peak_and_bn_in_f32_is_nearly_free() {
    let f32 = peak("mem-f32", &["train.batch_size=128"]);
    let f16 = peak(
        "mem-f16",
        &["train.batch_size=128", "precision.mode=f16-mixed"],
    );
    let bn16 = peak(
        "mem-bn16",
        &[
            "train.batch_size=128",
            "precision.mode=f16-mixed",
            "precision.batch_norm_f32=false",
        ],
    );
    let accum = peak("mem-accum", &["train.batch_size=32", "train.accum_steps=4"]);
    let ckpt = peak(
        "mem-ckpt",
        &["train.batch_size=128", "memory.checkpointing=balanced"],
    );
    assert!(f16 <= 0.6 * f32, "f16-mixed {f16} vs f32 {f32}");
    // ReLU outputs are recomputed, not kept: a third of MobileNet's saved activations.
    assert!(
        ckpt <= 0.8 * f32,
        "balanced checkpointing {ckpt} vs f32 {f32}"
    );
    assert!(accum <= 0.4 * f32, "32 × 4 {accum} vs 128 {f32}");
    assert!(f16 < 1.10 * bn16, "BN in f32 {f16} vs BN in f16 {bn16}");
}

#[test]
fn the_summary_reports_peaks_and_phases() {
    let (stdout, s) = train(
        "mem-simple",
        &[
            "--config",
            "configs/f32.toml",
            "--backend",
            "cpu",
            "--max-steps",
            "2",
            "--set",
            "data.eval_size=16",
        ],
    );
    let get = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {s}"));
    let (peak, fwd, bwd, step) = (
        get("peak_bytes"),
        get("live_after_forward_bytes"),
        get("live_after_backward_bytes"),
        get("live_after_step_bytes"),
    );
    assert!(peak >= fwd && fwd > bwd, "{s}");
    assert!(step > 0);
    assert_eq!(
        s["reserved_peak_bytes"],
        serde_json::Value::Null,
        "no reserve on the heap"
    );
    assert!(stdout.contains("peak in use"), "{stdout}");
    // The training peak: the heap peak above what was resident before the model (the data
    // set: 8,192 training images of 3,072 bytes by default, and the batcher), predicted by
    // the estimate's device peak, which holds no data.
    let (resident, training) = (get("resident_bytes"), get("training_peak_bytes"));
    assert_eq!(training + resident, peak, "{s}");
    assert!(resident > 8_192 * 3_072, "the data set is resident: {s}");
    let predicted = get("predicted_training_peak_bytes") as f64;
    let error = training as f64 / predicted - 1.0;
    assert!(
        error.abs() < 0.15,
        "training peak vs predicted {error:+.3}: {s}"
    );
    let row = table_value(&stdout, "training peak").expect("a training peak row");
    assert!(
        row.contains(" resident before the model (predicted "),
        "{row}"
    );
}

/// Every shipped config, two steps on a small data set: the estimate is within 10% of the
/// training peak (above what was resident before the model) and of the heap peak the counting
/// allocator measured (`bf16.toml` included: on the CPU the estimate adds the f32 copies Flex's
/// bf16 kernels make in backward). The estimate walks each model's own plan: ResNet's configs
/// are checked with no estimator code of their own.
#[test]
fn the_estimate_is_within_10_percent_of_the_measured_peak_for_every_shipped_config() {
    for config in super::common::shipped_configs() {
        let name = std::path::Path::new(&config)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        // Two steps on a small data set: images, or a small built-in corpus for the GPT.
        let data = match name.starts_with("gpt") {
            true => "data.corpus_bytes=65536",
            false => "data.train_size=512",
        };
        let (_, s) = train(
            &format!("est-{name}"),
            &[
                "--config",
                &config,
                "--backend",
                "cpu",
                "--max-steps",
                "2",
                "--set",
                data,
                "--set",
                "data.eval_size=16",
            ],
        );
        let error = s["prediction_error"].as_f64().unwrap();
        let training = s["training_peak_bytes"].as_f64().unwrap();
        let predicted = s["predicted_training_peak_bytes"].as_f64().unwrap();
        let training_error = training / predicted - 1.0;
        println!(
            "{name}: heap peak {} predicted {} ({:+.1}%), training peak {training} predicted {predicted} ({:+.1}%)",
            s["peak_bytes"],
            s["predicted_peak_bytes"],
            100.0 * error,
            100.0 * training_error
        );
        assert!(
            error.abs() <= 0.10,
            "{name}: measured/predicted − 1 = {error}"
        );
        assert!(
            training_error.abs() <= 0.10,
            "{name}: training peak measured/predicted − 1 = {training_error}"
        );
    }
}

#[test]
fn estimate_prints_the_parameter_count_of_any_model() {
    let out = super::common::run_ok(&[
        "estimate",
        "--config",
        "configs/mobilenet.toml",
        "--set",
        "model.input_size=224",
        "--set",
        "model.num_classes=1000",
    ]);
    // α = 0.5 from the config; Burn's count for it is checked in trainer/tests/numerics.
    assert!(
        out.starts_with("memory estimate (micro-batch 64, 1331592 trainable parameters)"),
        "{out}"
    );
    assert!(out.contains("block 13 pointwise"), "{out}");
}

/// `trainer estimate` at GPT-2 small's sizes prints GPT-2 small's published parameter count.
#[test]
fn estimate_prints_gpt2_smalls_parameter_count() {
    let out = super::common::run_ok(&[
        "estimate",
        "--config",
        "configs/gpt-small.toml",
        "--set",
        "model.n_layer=12",
        "--set",
        "model.n_head=12",
        "--set",
        "model.d_model=768",
        "--set",
        "model.seq_len=1024",
        "--set",
        "model.vocab_size=50257",
        "--set",
        "train.batch_size=8",
    ]);
    assert!(
        out.starts_with("memory estimate (micro-batch 8, 124439808 trainable parameters)"),
        "{out}"
    );
}

/// A large model at batch 1 peaks at the optimizer step, where every gradient and the
/// optimizer's state are alive: Adam's second moment costs one more parameter-sized buffer than
/// SGD with momentum, and the estimate predicts both peaks.
#[test]
fn a_parameter_dominated_run_peaks_at_the_optimizer_step_as_predicted() {
    let run = |optimizer: &str| {
        let set = format!("train.optimizer={optimizer}");
        let args = [
            "--config",
            "configs/mobilenet.toml",
            "--backend",
            "cpu",
            // The optimizer's state exists from the first step on: the second has all of it.
            "--max-steps",
            "2",
            "--set",
            "model.width_multiplier=2.0",
            "--set",
            "train.batch_size=1",
            "--set",
            "data.train_size=16",
            "--set",
            "data.eval_size=4",
            "--set",
            &set,
        ];
        train(&format!("param-dominated-{optimizer}"), &args).1
    };
    let (sgd, adam) = (run("sgd"), run("adam"));
    let bytes = |s: &serde_json::Value, k: &str| s[k].as_f64().unwrap();
    for s in [&sgd, &adam] {
        let (measured, predicted) = (
            bytes(s, "training_peak_bytes"),
            bytes(s, "predicted_training_peak_bytes"),
        );
        assert!(
            (measured / predicted - 1.0).abs() < 0.05,
            "measured {measured} vs predicted {predicted}"
        );
    }
    // 12.7 M f32 parameters: one moment is 48.5 MiB.
    let moment = 4.0 * bytes(&sgd, "parameters");
    let extra = bytes(&adam, "training_peak_bytes") - bytes(&sgd, "training_peak_bytes");
    assert!(
        (extra / moment - 1.0).abs() < 0.05,
        "Adam − SGD = {extra} bytes, one moment = {moment}"
    );
}

/// Whole-block checkpointing on the GPT, through the binary: the same losses as the plain
/// run, a training peak under half of it, each within 10% of its estimate; both memory
/// timelines sample every boundary (embeddings, each block, the head) in both passes.
#[test]
fn block_checkpointing_cuts_the_gpt_peak_with_the_same_losses() {
    let run = |checkpointing: &str| {
        let set = format!("memory.checkpointing={checkpointing}");
        let name = format!("gpt-ckpt-{checkpointing}");
        let (_, s) = train(
            &name,
            &[
                "--config",
                "configs/gpt-small.toml",
                "--backend",
                "cpu",
                "--max-steps",
                "3",
                "--set",
                "data.corpus_bytes=65536",
                "--set",
                "data.eval_size=4",
                "--set",
                &set,
            ],
        );
        let error = s["prediction_error"].as_f64().unwrap();
        assert!(error.abs() <= 0.10, "{checkpointing}: {error}");
        let csv = std::fs::read_to_string(out_dir(&name).join("memory_timeline.csv")).unwrap();
        let samples: Vec<(&str, &str)> = csv
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f[1], f[2])
            })
            .collect();
        for layer in ["embed", "block1", "block2", "block3", "block4", "head"] {
            for phase in ["forward", "backward"] {
                assert!(
                    samples.contains(&(phase, layer)),
                    "{checkpointing}: no {phase} sample at {layer}: {csv}"
                );
            }
        }
        s
    };
    let (plain, blocks) = (run("none"), run("blocks"));
    assert_eq!(plain["final_train_loss"], blocks["final_train_loss"]);
    assert_eq!(plain["eval_loss"], blocks["eval_loss"]);
    let peak = |s: &serde_json::Value| s["training_peak_bytes"].as_f64().unwrap();
    let ratio = peak(&blocks) / peak(&plain);
    assert!(ratio < 0.5, "blocks/plain training peak {ratio}");
}
