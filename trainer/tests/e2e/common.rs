//! Running the binary and reading what it wrote.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root: configs are named relative to it.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `trainer` binary cargo built for this test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_trainer"))
}

/// The folder of one test's outputs (this process's; [`temp`] makes it afresh).
pub fn out_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("oomlab-e2e-{name}-{}", std::process::id()))
}

/// A fresh folder for one test's outputs.
pub fn temp(name: &str) -> PathBuf {
    let dir = out_dir(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `trainer ARGS` from the repository root, CUDA and wgpu disabled so every machine
/// takes the same path (`auto` is the CPU).
pub fn run(args: &[&str]) -> Output {
    run_env(args, &[("OOMLAB_NO_WGPU", "1")])
}

/// [`run`] with `env` set, CUDA disabled, wgpu left on.
pub fn run_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(binary());
    command
        .args(args)
        .current_dir(root())
        .env("OOMLAB_NO_CUDA", "1");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("spawn trainer")
}

/// Runs and asserts success, returning stdout.
pub fn run_ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "trainer {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A parsed `--summary-json` file.
pub fn summary(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A string path argument.
pub fn arg(path: &Path) -> String {
    path.display().to_string()
}

/// Runs `trainer ARGS` with its checkpoints and `--summary-json` in a fresh folder named
/// `name`, asserts success, and returns stdout and the parsed summary.
pub fn train(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let dir = temp(name);
    let json = dir.join("summary.json");
    let output_dir = format!("train.output_dir={}", arg(&dir));
    let json_arg = arg(&json);
    let mut all = args.to_vec();
    all.extend(["--set", &output_dir, "--summary-json", &json_arg]);
    let stdout = run_ok(&all);
    (stdout, summary(&json))
}

/// The value of `key` in the summary table printed on stdout, whatever the column width.
pub fn table_value(stdout: &str, key: &str) -> Option<String> {
    stdout.lines().find_map(|line| {
        let rest = line.strip_prefix("  ")?.strip_prefix(key)?;
        // A key that only starts with `key` ("steps" vs "steps skipped") has no gap after it.
        rest.starts_with("  ").then(|| rest.trim().to_string())
    })
}

/// The losses of the steps taken, from steps.csv, read by the trainer's own parser.
pub fn losses(dir: &Path) -> Vec<f64> {
    let csv = std::fs::read_to_string(dir.join("steps.csv")).unwrap();
    trainer::report::step_log::StepLog::parse(&csv)
        .step_losses()
        .collect()
}

/// Bytes in use and reserved after each window, from steps.csv, read by the trainer's own
/// parser (a figure the probe did not measure is `None`).
pub fn step_memory(dir: &Path) -> Vec<(Option<u64>, Option<u64>)> {
    let csv = std::fs::read_to_string(dir.join("steps.csv")).unwrap();
    trainer::report::step_log::StepLog::parse(&csv)
        .memory()
        .collect()
}

/// Largest relative difference between two loss curves of the same length.
pub fn curve_gap(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1e-12))
        .fold(0.0, f64::max)
}

/// The shipped configs (`configs/*.toml`) as `configs/NAME.toml`, sorted; at least eight.
pub fn shipped_configs() -> Vec<String> {
    let mut configs: Vec<String> = std::fs::read_dir(root().join("configs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| format!("configs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    configs.sort();
    assert!(configs.len() >= 8, "{configs:?}");
    configs
}
