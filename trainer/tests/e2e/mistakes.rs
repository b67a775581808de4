//! `[mistakes]`: the two memory mistakes made on purpose, measured on the CPU heap.

use super::common::{arg, run, stderr, step_memory, temp, train};

const SMALL: [&str; 8] = [
    "--config",
    "configs/f32.toml",
    "--backend",
    "cpu",
    "--set",
    "data.train_size=256",
    "--max-steps",
    "2",
];

/// The summary of a 2-step SimpleModel run evaluating `eval_size` images, with `sets`.
fn run_eval(name: &str, eval_size: usize, sets: &[&str]) -> serde_json::Value {
    let eval = format!("data.eval_size={eval_size}");
    let mut args = SMALL.to_vec();
    args.extend(["--set", &eval]);
    for s in sets {
        args.extend(["--set", s]);
    }
    train(name, &args).1
}

#[test]
fn evaluating_with_autograd_keeps_every_batchs_graph_until_evaluation_ends() {
    let bytes = |s: &serde_json::Value, key: &str| s[key].as_u64().unwrap() as f64;
    let on = "mistakes.eval_with_autograd=true";
    let valid = run_eval("eval-valid", 512, &[]);
    let small = run_eval("eval-grad-256", 256, &[on]);
    let large = run_eval("eval-grad-512", 512, &[on]);
    // valid(): one batch's activations at a time, no graph. On the autodiff backend nothing
    // frees a graph no backward consumed until evaluation is over, so what evaluation adds
    // grows with the number of batches: twice the images, twice the bytes.
    let (v, s, l) = (
        bytes(&valid, "eval_added_bytes"),
        bytes(&small, "eval_added_bytes"),
        bytes(&large, "eval_added_bytes"),
    );
    assert!(l > 4.0 * v, "autograd {l} vs valid {v}");
    let growth = l / s;
    assert!((1.8..2.2).contains(&growth), "512 vs 256 images: {growth}");
    // The same model and arithmetic: the training peak (to a few hundred bytes of
    // bookkeeping) and the evaluation's results agree.
    let peak = |s: &serde_json::Value| bytes(s, "training_peak_bytes");
    assert!((peak(&valid) / peak(&large) - 1.0).abs() < 1e-3);
    assert_eq!(valid["eval_accuracy"], large["eval_accuracy"]);
    assert_eq!(valid["mistakes"], "none");
    assert_eq!(large["mistakes"], "eval_with_autograd");
}

#[test]
fn keeping_the_loss_tensors_grows_memory_every_step() {
    // Bytes in use after each step, from steps.csv, and their growth per step.
    let slope = |keep: bool| {
        let dir = temp(&format!("keep-losses-{keep}"));
        let out = run(&[
            "--config",
            "configs/f32.toml",
            "--backend",
            "cpu",
            "--max-steps",
            "30",
            "--set",
            "train.batch_size=16",
            "--set",
            "data.train_size=1024",
            "--set",
            "data.eval_size=16",
            "--set",
            &format!("mistakes.keep_losses={keep}"),
            "--set",
            &format!("train.output_dir={}", arg(&dir)),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let in_use: Vec<f64> = step_memory(&dir)
            .into_iter()
            .map(|(u, _)| u.expect("bytes in use") as f64)
            .collect();
        assert_eq!(in_use.len(), 30, "{in_use:?}");
        (in_use[29] - in_use[0]) / 29.0
    };
    let (kept, dropped) = (slope(true), slope(false));
    // Each kept loss holds its tensor and the add that chains it to the sum (backward freed
    // the activations its graph saved): a few hundred bytes a step, for the whole run.
    assert!(
        kept - dropped > 256.0,
        "kept {kept} B/step vs {dropped} B/step"
    );
}

#[test]
fn compare_draws_memory_per_step_the_timeline_and_the_batch_line() {
    let out_dir = temp("compare-lines");
    let out = run(&[
        "compare",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--steps",
        "2",
        "--set",
        "data.train_size=256",
        "--set",
        "data.eval_size=16",
        "--sweep",
        "train.batch_size=16,32,64",
        "--note",
        "measured by the test",
        "--out",
        &arg(&out_dir),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let svg = |name: &str| std::fs::read_to_string(out_dir.join(name)).unwrap();
    for name in [
        "memory.svg",
        "terms.svg",
        "steps.svg",
        "timeline.svg",
        "batch.svg",
    ] {
        assert!(
            svg(name).contains("measured by the test"),
            "{name} lacks the note"
        );
    }
    assert!(svg("steps.svg").contains("f32 batch_size=32: in use"));
    assert!(svg("timeline.svg").contains("f32 batch_size=64"));
    assert!(svg("batch.svg").contains("MiB per image"));
    // Only the columns that differ stay in the table; the rest is one line under it.
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    let head = md.lines().find(|l| l.starts_with("| config")).unwrap();
    assert!(
        head.contains("batch × accum") && !head.contains("| model |"),
        "{head}"
    );
    assert!(
        md.contains("Same in every row: model simple · params 0.17 M"),
        "{md}"
    );
    // Without a batch sweep there is no batch line, and an old one is not left behind.
    let again = run(&[
        "compare",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--steps",
        "1",
        "--set",
        "data.train_size=64",
        "--set",
        "data.eval_size=16",
        "--out",
        &arg(&out_dir),
        // The first compare's report is there: replacing it is asked for.
        "--overwrite",
    ]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(!out_dir.join("batch.svg").exists());
    assert!(out_dir.join("steps.svg").exists());
}
