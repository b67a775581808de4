//! The memory switches and tools, run through the binary on the CPU: free_cache, the budget
//! and its out-of-memory diagnosis, `compare` and `find-batch-size`.

use super::common::{arg, root, run, run_ok, stderr, temp, train};

/// Small SimpleModel runs: the data set is kept small so the heap is mostly the step.
const SMALL: [&str; 4] = ["--set", "data.train_size=256", "--set", "data.eval_size=32"];

/// `trainer compare` of `configs` on the CPU, two steps each on the small data set, into
/// `out_dir`.
fn compare_small(configs: &[String], out_dir: &std::path::Path) -> Vec<String> {
    let mut args = vec!["compare".to_string()];
    args.extend(configs.iter().cloned());
    args.extend(["--backend", "cpu", "--steps", "2", "--out"].map(String::from));
    args.push(arg(out_dir));
    args.extend(SMALL.iter().map(|s| s.to_string()));
    args
}

fn simple(name: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--config", "configs/f32.toml", "--backend", "cpu"];
    args.extend(SMALL);
    args.extend(extra);
    train(name, &args).1
}

/// On the CPU, Flex keeps no cache to free: the switch runs, is reported, and the heap peak
/// stays where it was. (On CUDA it lowers what is reserved after a step, not the peak in use.)
#[test]
fn free_cache_is_reported_and_does_not_lower_the_peak_in_use() {
    let base = ["--max-steps", "4", "--set", "train.batch_size=32"];
    let never = simple("cache-never", &base);
    let step = simple(
        "cache-step",
        &[&base[..], &["--set", "memory.free_cache=step"]].concat(),
    );
    let epoch = simple(
        "cache-epoch",
        &[
            &base[..],
            &[
                "--set",
                "memory.free_cache=epoch",
                "--set",
                "data.train_size=64",
            ],
        ]
        .concat(),
    );
    assert_eq!(never["free_cache"], "never");
    assert_eq!(step["free_cache"], "step");
    assert_eq!(epoch["free_cache"], "epoch");
    assert_eq!(
        epoch["epochs"], 2,
        "64 images at 32 a step: 4 steps are two epochs"
    );
    let peak = |s: &serde_json::Value| s["peak_bytes"].as_f64().unwrap();
    let ratio = peak(&step) / peak(&never);
    assert!(
        (0.97..1.03).contains(&ratio),
        "peak with free_cache=step / never = {ratio}"
    );
}

#[test]
fn a_budget_under_the_estimate_stops_before_training_with_ranked_fixes() {
    let dir = temp("budget");
    let out = run(&[
        "--config",
        "configs/mobilenet.toml",
        "--backend",
        "cpu",
        "--set",
        "memory.budget=10MiB",
        "--set",
        &format!("train.output_dir={}", arg(&dir)),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines[0], "out of memory before training: over memory.budget = 10.0 MiB",
        "{err}"
    );
    assert!(
        lines[1].starts_with("predicted peak of this config: "),
        "{err}"
    );
    assert_eq!(lines[2], "fixes, largest predicted saving first:", "{err}");
    let fixes: Vec<&str> = lines[3..lines.len() - 1].to_vec();
    // MobileNet α 0.5 in f32 at batch 64: mixed precision, two accumulation splits,
    // checkpointing and fused blocks apply; α is already 0.5.
    assert_eq!(fixes.len(), 5, "{err}");
    assert!(
        fixes
            .iter()
            .any(|f| f.ends_with("--set memory.fuse=blocks")),
        "{err}"
    );
    for fix in &fixes {
        assert!(fix.contains(" --set "), "{fix}");
    }
    assert_eq!(
        lines.last(),
        Some(&"no checkpoint had been written yet"),
        "{err}"
    );
    assert!(
        !dir.join("checkpoint").exists(),
        "nothing is trained or written"
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}

/// A GPT over its budget gets the transformer's fixes, each with the saving the estimate
/// predicts: whole-block checkpointing, memory-efficient attention, a shorter sequence.
#[test]
fn a_gpt_over_its_budget_is_offered_the_transformer_fixes() {
    let dir = temp("budget-gpt");
    let out = run(&[
        "--config",
        "configs/gpt-small.toml",
        "--backend",
        "cpu",
        "--set",
        "memory.budget=200MiB",
        "--set",
        &format!("train.output_dir={}", arg(&dir)),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    for (what, set) in [
        (
            "whole-block checkpointing",
            "--set memory.checkpointing=blocks",
        ),
        (
            "memory-efficient attention",
            "--set model.attention=memory_efficient",
        ),
        ("a shorter sequence (64 tokens)", "--set model.seq_len=64"),
    ] {
        let line = err.lines().find(|l| l.trim_start().starts_with(what));
        assert!(line.is_some_and(|l| l.ends_with(set)), "{what}: {err}");
    }
    // Fusing is a CNN's fix: not offered.
    assert!(!err.contains("memory.fuse"), "{err}");
}

#[test]
fn a_budget_over_the_estimate_trains() {
    let s = simple(
        "budget-ok",
        &["--max-steps", "1", "--set", "memory.budget=8GiB"],
    );
    assert_eq!(s["steps"], 1);
}

#[test]
fn compare_runs_each_config_and_reports_failures_as_rows() {
    let dir = temp("compare");
    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "[train]\nbatch_size = 0\n").unwrap();
    let out_dir = dir.join("report");
    let configs = [
        "configs/f32.toml".into(),
        "configs/amp.toml".into(),
        arg(&broken),
    ];
    let out = run(&compare_small(&configs, &out_dir)
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    // One config failed: the report is written and the exit code says so.
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 of 3 configs failed"),
        "{}",
        stderr(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(rows.len(), 4, "header and three configs:\n{stdout}");
    // No model here has batch norm: a column that is "—" in every row is left out.
    assert!(
        rows[0].starts_with(
            "| config | model | params | precision | batch × accum | predicted | peak in use"
        ),
        "{}",
        rows[0]
    );
    assert!(
        rows[1].starts_with("| f32 | simple | 0.17 M | f32 |"),
        "{}",
        rows[1]
    );
    assert!(
        rows[2].starts_with("| amp | simple | 0.17 M | f16-mixed |"),
        "{}",
        rows[2]
    );
    assert!(
        rows[3].starts_with("| broken | — | — | — |")
            && rows[3].ends_with("| config error: train.batch_size = 0: must be at least 1 |"),
        "{}",
        rows[3]
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap())
            .unwrap();
    let peak = |i: usize| report[i]["peak_bytes"].as_f64().unwrap();
    assert!(peak(1) < peak(0), "f16-mixed below f32: {report}");
    assert_eq!(report[2]["peak_bytes"], serde_json::Value::Null);
    let csv = std::fs::read_to_string(out_dir.join("report.csv")).unwrap();
    assert_eq!(csv.lines().count(), 4, "{csv}");
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(md.contains(rows[1]), "{md}");
    let svg = std::fs::read_to_string(out_dir.join("memory.svg")).unwrap();
    for text in [
        "<svg",
        "f32",
        "amp",
        "broken",
        "failed",
        "measured peak in use",
    ] {
        assert!(svg.contains(text), "memory.svg lacks {text}");
    }
    // The predicted peak by term: mixed precision shrinks the activations (and adds half
    // weight copies to the parameters), not the optimizer state; the CPU heap's prediction is
    // the terms plus gemm's slabs.
    let term = |i: usize, key: &str| report[i]["terms"][key].as_u64().unwrap();
    assert!(term(1, "activations") < term(0, "activations"), "{report}");
    assert!(term(1, "parameters") > term(0, "parameters"), "{report}");
    assert_eq!(term(1, "optimizer_state"), term(0, "optimizer_state"));
    assert_eq!(term(0, "data"), term(1, "data"));
    let keys = [
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "data",
    ];
    let sum: u64 = keys.iter().map(|k| term(0, k)).sum();
    let predicted = report[0]["predicted_peak_bytes"].as_u64().unwrap();
    assert!(
        sum < predicted && predicted - sum < 8 << 20,
        "{sum} vs {predicted}"
    );
    assert_eq!(report[2]["terms"], serde_json::Value::Null);
    let svg = std::fs::read_to_string(out_dir.join("terms.svg")).unwrap();
    for text in [
        "<svg",
        "f32",
        "amp",
        "optimizer state",
        "measured training peak",
    ] {
        assert!(svg.contains(text), "terms.svg lacks {text}");
    }
}

/// `--sweep model.seq_len=…` over naive and memory-efficient attention: seq_len.svg fits the
/// naive peak as quadratic in the sequence and the memory-efficient one as linear.
#[test]
fn a_seq_len_sweep_tells_quadratic_attention_from_linear() {
    let dir = temp("sweep-seq");
    let out = arg(&dir.join("report"));
    let done = run(&[
        "compare",
        "configs/gpt-small.toml",
        "configs/gpt-small-memory-efficient.toml",
        "--backend",
        "cpu",
        // Two: the optimizer's state, which the estimate counts, is made in the first update.
        "--steps",
        "2",
        "--sweep",
        "model.seq_len=32,64,128",
        "--set",
        "train.batch_size=8",
        "--set",
        "data.corpus_bytes=20000",
        "--set",
        "data.eval_size=2",
        "--out",
        &out,
    ]);
    assert!(done.status.success(), "{}", stderr(&done));
    let svg = std::fs::read_to_string(dir.join("report").join("seq_len.svg")).unwrap();
    assert!(svg.contains("gpt-small: quadratic, "), "{svg}");
    assert!(
        svg.contains("gpt-small-memory-efficient: linear, "),
        "{svg}"
    );
    // A language model's rate is in tokens: sequences/s × seq_len.
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report").join("report.json")).unwrap(),
    )
    .unwrap();
    let table = std::fs::read_to_string(dir.join("report").join("report.md")).unwrap();
    assert!(!table.contains("images/s"), "{table}");
    let mut lines = table.lines().skip_while(|l| !l.starts_with("| config"));
    let cells = |l: &str| -> Vec<String> { l.split('|').map(|c| c.trim().to_string()).collect() };
    let header = cells(lines.next().unwrap());
    let column = header.iter().position(|c| c == "tokens/s").expect(&table);
    for (row, line) in report.as_array().unwrap().iter().zip(lines.skip(1)) {
        let rate = row["images_per_sec"].as_f64().unwrap() * row["seq_len"].as_f64().unwrap();
        assert_eq!(cells(line)[column], format!("{rate:.0}"), "{table}");
        // The estimate holds at every sweep point, the quadratic ones included.
        let (peak, predicted) = (
            row["peak_bytes"].as_f64().unwrap(),
            row["predicted_peak_bytes"].as_f64().unwrap(),
        );
        assert!(
            (peak / predicted - 1.0).abs() <= 0.10,
            "{}: measured {peak}, predicted {predicted}",
            row["name"]
        );
    }
}

#[test]
fn compare_sweeps_one_key_and_dry_runs_without_training() {
    let dir = temp("sweep");
    let out = dir.join("report");
    let base = [
        "compare",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--steps",
        "1",
        "--sweep",
        "train.batch_size=8,32",
    ];
    let out_arg = arg(&out);
    let dry = run(&[&base[..], &["--out", &out_arg, "--dry-run"]].concat());
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert_eq!(
        String::from_utf8_lossy(&dry.stdout),
        "dry run: 2 runs, every config loads; nothing was run\n"
    );
    assert!(!out.exists(), "a dry run writes nothing");
    let done = run(&[&base[..], &SMALL[..], &["--out", &out_arg]].concat());
    assert!(done.status.success(), "{}", stderr(&done));
    // One step measures no optimizer state: the report says so.
    assert!(
        String::from_utf8_lossy(&done.stdout).contains("\nNote: one step: the optimizer makes"),
        "{}",
        String::from_utf8_lossy(&done.stdout)
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.lines()
            .next()
            .unwrap()
            .ends_with("to check the estimate)"),
        "{md}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report[0]["name"], "f32 batch_size=8");
    assert_eq!(report[1]["name"], "f32 batch_size=32");
    assert_eq!(report[1]["batch_size"], 32);
    assert!(report[0]["peak_bytes"].as_u64() < report[1]["peak_bytes"].as_u64());
    let bad = run(&[
        "compare",
        "configs/f32.toml",
        "--sweep",
        "train.batch_size",
        "--dry-run",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(
        stderr(&bad),
        "config error: --sweep = train.batch_size: expected KEY=V1,V2,…, e.g. --sweep \
         train.batch_size=32,64,128\n"
    );
}

/// With loss scaling on, a run keeps its per-window log and draws the scale.
#[test]
fn a_scaled_run_logs_every_window_and_draws_the_scale() {
    let dir = temp("steps");
    let output_dir = format!("train.output_dir={}", arg(&dir));
    let out = run(&[
        "--config",
        "configs/amp.toml",
        "--backend",
        "cpu",
        "--max-steps",
        "3",
        "--set",
        "train.batch_size=16",
        "--set",
        "data.train_size=64",
        "--set",
        "data.eval_size=16",
        "--set",
        &output_dir,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let csv = std::fs::read_to_string(dir.join("steps.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "window,step,loss,lr,loss_scale,skipped,in_use_bytes,reserved_bytes"
    );
    let cells: Vec<Vec<&str>> = lines[1..].iter().map(|l| l.split(',').collect()).collect();
    let taken = cells.iter().filter(|c| c[5] == "false").count();
    assert_eq!(taken, 3, "three optimizer steps: {csv}");
    // The CPU heap after every step: a measured size; no pool, so nothing reserved.
    for c in &cells {
        assert!(c[6].parse::<u64>().is_ok_and(|b| b > 1 << 20), "{csv}");
        assert_eq!(c[7], "", "{csv}");
    }
    assert!(
        lines[1].starts_with("1,0,") && lines[1].contains(",65536,"),
        "{csv}"
    );
    let svg = std::fs::read_to_string(dir.join("loss_scale.svg")).unwrap();
    assert!(svg.contains("Dynamic loss scale per window"), "{svg}");
}

#[test]
fn find_batch_size_finds_the_largest_micro_batch_under_the_budget() {
    let dir = temp("find");
    let json = dir.join("found.json");
    let mut args = vec![
        "find-batch-size",
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--budget",
        "40MiB",
    ];
    args.extend(SMALL);
    let output_dir = format!("train.output_dir={}", arg(&dir));
    let json_arg = arg(&json);
    args.extend(["--set", &output_dir, "--json", &json_arg]);
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let found: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let limit = found["limit_bytes"].as_u64().unwrap();
    assert_eq!(limit, (40.0 * 1024.0 * 1024.0 * 0.9) as u64);
    let best = found["batch_size"].as_u64().unwrap();
    let trials = found["trials"].as_array().unwrap();
    let mut smallest_bad = u64::MAX;
    for t in trials {
        let (b, fits) = (
            t["batch_size"].as_u64().unwrap(),
            t["fits"].as_bool().unwrap(),
        );
        let peak = t["peak_bytes"].as_u64().unwrap();
        assert_eq!(fits, peak <= limit, "{t}");
        if fits {
            assert!(b <= best, "{b} fits but {best} was reported");
        } else {
            smallest_bad = smallest_bad.min(b);
        }
    }
    assert!(best > 1 && smallest_bad > best, "{found}");
    assert!(
        smallest_bad - best <= (best / 16).max(1),
        "bisected: {found}"
    );
    let (b, k) = (
        found["suggested_batch_size"].as_u64().unwrap(),
        found["suggested_accum_steps"].as_u64().unwrap(),
    );
    assert_eq!(b * k, 128, "f32.toml's effective batch is kept");
    assert!(b <= best, "{found}");
    assert!(
        (1..k).all(|j| 128 % j != 0 || 128 / j > best),
        "{k} is not the fewest micro-batches: {found}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&format!("largest micro-batch that fits: {best} ")),
        "{stdout}"
    );
    assert!(
        !dir.join("find-batch-size").exists(),
        "trial runs are cleaned up"
    );
    // The answer's trial peaked where a real run at that size peaks: with the optimizer's
    // state, which a one-step trial would not have made yet.
    let trial = trials.iter().find(|t| t["batch_size"] == best).unwrap();
    let batch = format!("train.batch_size={best}");
    let mut real = vec!["--config", "configs/f32.toml", "--backend", "cpu"];
    real.extend(SMALL);
    real.extend(["--max-steps", "3", "--set", &batch]);
    let (_, s) = train("find-real", &real);
    let (trial, real) = (
        trial["peak_bytes"].as_f64().unwrap(),
        s["peak_bytes"].as_f64().unwrap(),
    );
    assert!(
        (trial / real - 1.0).abs() < 0.01,
        "trial peak {trial} vs a run's {real}"
    );
}

/// `--search seq_len` on a tiny GPT: the longest context that fits a budget at the config's
/// micro-batch, each trial's peak measured (growing with the context), the answer bisected.
#[test]
fn find_batch_size_finds_the_longest_seq_len_under_the_budget() {
    let dir = temp("find-seq");
    let json = dir.join("found.json");
    let (output_dir, json_arg) = (format!("train.output_dir={}", arg(&dir)), arg(&json));
    let mut args = vec![
        "find-batch-size",
        "--config",
        "configs/gpt-small.toml",
        "--backend",
        "cpu",
        "--budget",
        "24MiB",
        "--search",
        "seq_len",
        "--json",
        &json_arg,
        "--set",
        &output_dir,
    ];
    for set in [
        "model.n_layer=1",
        "model.d_model=64",
        "train.batch_size=4",
        "data.corpus_bytes=65536",
        "data.eval_size=4",
    ] {
        args.extend(["--set", set]);
    }
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let found: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(found["searched"], "model.seq_len");
    assert_eq!(found["batch_size"], 4);
    let limit = found["limit_bytes"].as_u64().unwrap();
    let best = found["seq_len"].as_u64().unwrap();
    let mut trials: Vec<(u64, u64, bool)> = found["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert_eq!(t["batch_size"], 4, "{t}");
            let (s, peak) = (
                t["seq_len"].as_u64().unwrap(),
                t["peak_bytes"].as_u64().unwrap(),
            );
            assert_eq!(t["fits"].as_bool().unwrap(), peak <= limit, "{t}");
            (s, peak, peak <= limit)
        })
        .collect();
    trials.sort();
    // From 32 tokens on the activations lead; below, the epoch's order of the train windows
    // (8 bytes a window, fewer windows as they grow) outweighs them.
    let long: Vec<_> = trials.iter().filter(|t| t.0 >= 32).collect();
    assert!(
        long.len() >= 4 && long.windows(2).all(|w| w[0].1 < w[1].1),
        "a longer context peaks higher: {trials:?}"
    );
    let smallest_bad = trials.iter().find(|t| !t.2).map(|t| t.0).unwrap();
    assert!(trials.iter().any(|t| t.0 == best && t.2), "{found}");
    assert!(best > 1 && smallest_bad > best, "{found}");
    assert!(
        smallest_bad - best <= (best / 16).max(1),
        "bisected: {found}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&format!(
            "longest seq_len that fits at micro-batch 4: {best} "
        )) && stdout.contains(&format!("--set model.seq_len={best}\n")),
        "{stdout}"
    );
}

/// A CNN has no seq_len to search: one line, exit 2, before any trial.
#[test]
fn find_batch_size_searches_seq_len_on_a_gpt_only() {
    let out = run(&[
        "find-batch-size",
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--budget",
        "1GiB",
        "--search",
        "seq_len",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "config error: --search = seq_len: only a GPT has a seq_len (model.name = \"gpt\"); this \
         config's model is simple\n"
    );
}

#[test]
fn find_batch_size_on_the_cpu_needs_a_budget() {
    let out = run(&[
        "find-batch-size",
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "config error: --budget = (none): the CPU has no memory limit to find: give --budget \
         SIZE or memory.budget\n"
    );
}

/// `trainer compare` puts ResNet beside SimpleModel and MobileNet: one row each, with its
/// model, batch-norm dtype and a predicted and measured peak (ResNet-18 at α = 1/8 here, from
/// `configs/resnet18.toml`, to keep the test short).
#[test]
fn compare_shows_resnet_beside_simple_model_and_mobilenet() {
    let dir = temp("compare-resnet");
    let resnet = dir.join("resnet18-small.toml");
    let shipped = std::fs::read_to_string(root().join("configs/resnet18.toml")).unwrap();
    let small = shipped.replace("width_multiplier = 1.0", "width_multiplier = 0.125");
    assert_ne!(
        small, shipped,
        "configs/resnet18.toml sets width_multiplier = 1.0"
    );
    std::fs::write(&resnet, small).unwrap();
    let out_dir = dir.join("report");
    let configs = [
        "configs/f32.toml".into(),
        "configs/mobilenet.toml".into(),
        arg(&resnet),
    ];
    let args = compare_small(&configs, &out_dir);
    let stdout = run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(rows.len(), 4, "header and three configs:\n{stdout}");
    for (row, model) in rows[1..].iter().zip([
        "| f32 | simple |",
        "| mobilenet | mobilenet(α=0.5) |",
        "| resnet18-small | resnet18(cifar, α=0.125) |",
    ]) {
        assert!(row.starts_with(model), "{row}");
        assert!(row.contains(" MiB |"), "{row}");
    }
    assert!(
        rows[3].contains("| f32 |"),
        "ResNet's batch norm dtype: {}",
        rows[3]
    );
}
