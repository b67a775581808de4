//! Hostile and careless input through the binary: no hang, no silent wrong state, nothing
//! lost. Each test reproduces one failure of issue 13 and checks its clean end.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::common::{arg, binary, run, stderr, summary, temp};

/// A small, fast run: 256 images in batches of 64 (4 windows an epoch).
pub(super) const SMALL: [&str; 8] = [
    "--backend",
    "cpu",
    "--set",
    "data.train_size=256",
    "--set",
    "data.eval_size=64",
    "--set",
    "train.batch_size=64",
];

pub(super) fn with_small<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = SMALL.to_vec();
    all.extend_from_slice(args);
    all
}

pub(super) fn first_line(out: &std::process::Output) -> String {
    stderr(out).lines().next().unwrap_or_default().to_string()
}

#[test]
fn config_that_is_not_a_regular_file_is_refused_without_reading() {
    let started = Instant::now();
    let out = run(&["--config", "/dev/zero", "--dry-run"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        first_line(&out),
        "config error: cannot read config /dev/zero: not a regular file"
    );
    let dir = temp("fifo");
    let fifo = dir.join("config.toml");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let out = run(&["--config", &arg(&fifo), "--dry-run"]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(first_line(&out).ends_with("not a regular file"));
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "no read blocks"
    );
}

#[test]
fn an_empty_cifar_split_is_named_not_trained_on() {
    let dir = temp("empty-cifar");
    for n in 1..=5 {
        std::fs::write(dir.join(format!("data_batch_{n}.bin")), b"").unwrap();
    }
    std::fs::write(dir.join("test_batch.bin"), b"").unwrap();
    let path = format!("data.path={}", toml(&dir));
    let output = format!("train.output_dir={}", toml(&dir.join("run")));
    let out = run(&[
        "--backend",
        "cpu",
        "--set",
        "data.source=cifar10",
        "--set",
        &path,
        "--set",
        &output,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let line = first_line(&out);
    assert!(
        line.starts_with("error: no images in ") && line.contains("data_batch_5.bin"),
        "{line}"
    );
    assert!(line.ends_with("every file of the split is empty"), "{line}");
}

/// A path as a TOML string for `--set`.
pub(super) fn toml(path: &Path) -> String {
    format!("\"{}\"", path.display())
}

#[test]
fn outputs_are_checked_before_the_first_step() {
    let dir = temp("outputs");
    let file = dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let set = format!("train.output_dir={}", toml(&file));
    let out = run(&with_small(&["--set", &set]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        first_line(&out).starts_with(&format!(
            "config error: train.output_dir = {}: cannot write there: ",
            file.display()
        )),
        "{}",
        first_line(&out)
    );
    let long = format!("train.output_dir={}", toml(&dir.join("x".repeat(300))));
    let out = run(&with_small(&["--set", &long]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        first_line(&out).contains("File name too long"),
        "{}",
        first_line(&out)
    );
    let json = arg(&dir.join("no-such-folder").join("s.json"));
    let set = format!("train.output_dir={}", toml(&dir.join("run")));
    let out = run(&with_small(&["--set", &set, "--summary-json", &json]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        first_line(&out).starts_with("config error: --summary-json = "),
        "{}",
        first_line(&out)
    );
    assert!(
        !dir.join("run").join("checkpoint").exists(),
        "nothing was trained"
    );
}

#[test]
fn a_new_run_never_replaces_an_earlier_checkpoint_silently() {
    let dir = temp("no-overwrite");
    let set = format!("train.output_dir={}", toml(&dir));
    let once = with_small(&["--max-steps", "1", "--set", &set]);
    assert_eq!(run(&once).status.code(), Some(0));
    let again = run(&once);
    assert_eq!(again.status.code(), Some(2));
    assert_eq!(
        first_line(&again),
        format!(
            "config error: train.output_dir = {}: holds the checkpoint of an earlier run: \
             continue it with --resume {}, replace it with --overwrite, or choose another folder",
            dir.display(),
            dir.join("checkpoint").display()
        )
    );
    let mut overwrite = once.clone();
    overwrite.push("--overwrite");
    assert_eq!(run(&overwrite).status.code(), Some(0));
}

#[test]
fn the_default_folder_of_an_earlier_run_gives_a_numbered_one() {
    // A config named after this test, so its default folder is runs/<name> under a temp root.
    let dir = temp("numbered");
    let config = dir.join("numbered.toml");
    std::fs::write(&config, "").unwrap();
    let args = with_small(&["--config", config.to_str().unwrap(), "--max-steps", "1"]);
    let first = Command::new(binary())
        .args(&args)
        .current_dir(&dir)
        .env("OOMLAB_NO_CUDA", "1")
        .output()
        .unwrap();
    assert!(first.status.success(), "{}", stderr(&first));
    let second = Command::new(binary())
        .args(&args)
        .current_dir(&dir)
        .env("OOMLAB_NO_CUDA", "1")
        .output()
        .unwrap();
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        stderr(&second).contains(
            "note: runs/numbered holds an earlier run; this run writes to runs/numbered-2"
        ),
        "{}",
        stderr(&second)
    );
    assert!(dir.join("runs/numbered/checkpoint/manifest.json").exists());
    assert!(dir
        .join("runs/numbered-2/checkpoint/manifest.json")
        .exists());
}

#[test]
fn f32_steps_with_inf_gradients_are_skipped_and_end_as_diverged() {
    let dir = temp("diverge");
    let set = format!("train.output_dir={}", toml(&dir));
    let out = run(&with_small(&[
        "--config",
        "configs/f32.toml",
        "--set",
        "train.optimizer=sgd",
        "--set",
        "train.lr=1e9",
        "--set",
        &set,
        "--summary-json",
        &arg(&dir.join("s.json")),
    ]));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // The epoch lines come first; the error is the last line.
    let text = stderr(&out);
    let line = text.lines().last().unwrap_or_default();
    assert!(line.starts_with("error: training diverged"), "{line}");
    assert!(line.contains("lower train.lr"), "{line}");
    assert!(
        !dir.join("s.json").exists(),
        "a diverged run reports no summary"
    );
}

#[test]
fn the_schedule_ends_at_min_lr_even_when_steps_are_skipped() {
    let dir = temp("schedule-skips");
    let json = dir.join("s.json");
    let set = format!("train.output_dir={}", toml(&dir));
    let out = run(&with_small(&[
        "--config",
        "configs/amp.toml",
        "--set",
        "precision.init_scale=1099511627776",
        "--set",
        "train.lr_schedule=warmup-cosine",
        "--set",
        "train.min_lr=1e-5",
        "--set",
        "train.epochs=2",
        "--set",
        &set,
        "--summary-json",
        &arg(&json),
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let s = summary(&json);
    assert!(s["skipped_steps"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(
        s["steps"], 8,
        "2 epochs of 4 windows: every planned step is taken"
    );
    assert_eq!(s["final_lr"], 1e-5);
    assert_eq!(s["lr_schedule"], "warmup-cosine");
}

#[test]
fn compare_exits_non_zero_when_a_config_fails_and_keeps_its_runs_inside_out() {
    let dir = temp("compare-fail");
    let out_dir = dir.join("report");
    let out = run(&[
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
        "--set",
        "train.batch_size=16",
        "--sweep",
        "train.batch_size=16,0",
        "--out",
        &arg(&out_dir),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 of 2 configs failed"),
        "{}",
        stderr(&out)
    );
    assert!(
        out_dir.join("report.md").exists(),
        "the report is still written"
    );
    let escape = run(&[
        "compare",
        "configs/f32.toml",
        "--sweep",
        "train.output_dir=a,b",
        "--dry-run",
    ]);
    assert_eq!(escape.status.code(), Some(2));
    let sweep = run(&[
        "compare",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--steps",
        "1",
        "--sweep",
        "data.path=../../x",
        "--out",
        &arg(&out_dir),
        // The folder holds the first compare's report, kept unless replaced.
        "--overwrite",
    ]);
    // data.path does not apply to synthetic data: the row fails, inside --out.
    assert_eq!(sweep.status.code(), Some(1));
    let runs: Vec<String> = std::fs::read_dir(out_dir.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(runs.contains(&"f32-path-..-..-x".to_string()), "{runs:?}");
}

#[test]
fn find_batch_size_with_nothing_fitting_exits_3() {
    let out = run(&[
        "find-batch-size",
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--budget",
        "1MiB",
        "--set",
        "data.train_size=64",
        "--set",
        "data.eval_size=16",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("out of memory: even a micro-batch of 1 does not fit in 921.6 KiB"),
        "{}",
        stderr(&out)
    );
}

/// A batch larger than the split is reported as the batch the run really used.
#[test]
fn the_summary_reports_the_batch_the_run_used() {
    let dir = temp("whole-split");
    let json = dir.join("s.json");
    let set = format!("train.output_dir={}", toml(&dir));
    let out = run(&[
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--set",
        "data.train_size=40",
        "--set",
        "data.eval_size=8",
        "--set",
        "train.batch_size=65536",
        "--max-steps",
        "1",
        "--set",
        &set,
        "--summary-json",
        &arg(&json),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = summary(&json);
    assert_eq!(
        (s["batch_size"].as_u64(), s["effective_batch"].as_u64()),
        (Some(40), Some(40))
    );
}

/// A bounded sample of hostile values through the real binary (one step, tiny data): each
/// run trains or stops with one line and a documented code, never a panic.
#[test]
fn a_sample_of_hostile_values_runs_or_fails_cleanly() {
    let cases = [
        "train.accum_steps=4611686018427387904",
        "precision.init_scale=1e-45",
        "train.batch_size=1",
        "model.name=\"mobilenet\"",
        "precision.mode=\"f16\"",
        "data.seed=18446744073709551615",
        "train.lr=1e308",
        "memory.budget=\"1B\"",
    ];
    for set in cases {
        let dir = temp("hostile");
        let output = format!("train.output_dir={}", toml(&dir));
        let out = run(&[
            "--config",
            "configs/f32.toml",
            "--backend",
            "cpu",
            "--set",
            "data.train_size=16",
            "--set",
            "data.eval_size=8",
            "--set",
            &output,
            "--max-steps",
            "1",
            "--set",
            set,
        ]);
        let text = stderr(&out);
        let code = out.status.code();
        assert!(
            matches!(code, Some(0..=3)),
            "--set {set}: exit {code:?}: {text}"
        );
        assert!(!text.contains("panicked"), "--set {set}: {text}");
    }
}
