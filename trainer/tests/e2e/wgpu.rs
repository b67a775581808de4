//! The GPU path on a software Vulkan device: burn-wgpu through CubeCL on Mesa's llvmpipe, with
//! a real CubeCL memory pool (in use vs reserved). `.ci/run` installs `mesa-vulkan-drivers`;
//! without a Vulkan driver these tests fail and say so. llvmpipe runs at a CPU's speed and its
//! first steps compile kernels: steps and shapes stay small, and autotune is minimal. The tests
//! assume llvmpipe is the only adapter, as on CI (a machine with a GPU picks it under `auto`).

use std::path::Path;

use super::common::{
    arg, curve_gap, losses, run_env, stderr, step_memory, summary, table_value, temp,
};

/// Minimal autotune: fewer kernels to time on a CPU-speed device (the docs say what it costs).
const ENV: [(&str, &str); 1] = [("CUBECL_AUTOTUNE_LEVEL", "minimal")];

/// Runs `trainer` on `config` on wgpu with `extra` flags in a fresh folder (summary at
/// `s.json` there); returns how it ended and the folder.
fn launch(name: &str, config: &str, extra: &[&str]) -> (std::process::Output, std::path::PathBuf) {
    let dir = temp(name);
    let (out_dir, json) = (
        format!("train.output_dir={}", arg(&dir)),
        dir.join("s.json"),
    );
    let json_arg = arg(&json);
    let mut args = vec!["--config", config, "--backend", "wgpu", "--set", &out_dir];
    args.extend(["--summary-json", &json_arg, "--set", "data.eval_size=32"]);
    args.extend(extra);
    (run_env(&args, &ENV), dir)
}

/// Trains `config` on wgpu with `extra` flags in a fresh folder; returns its summary and folder.
fn wgpu(name: &str, config: &str, extra: &[&str]) -> (serde_json::Value, std::path::PathBuf) {
    let (out, dir) = launch(name, config, extra);
    assert!(
        out.status.success(),
        "trainer {config} {extra:?} on wgpu failed ({}); a Vulkan driver is needed (apt-get \
         install mesa-vulkan-drivers):\n{}",
        out.status,
        stderr(&out)
    );
    (summary(&dir.join("s.json")), dir)
}

fn bytes(s: &serde_json::Value, key: &str) -> f64 {
    s[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing: {s}"))
}

/// Rows of memory_timeline.csv: (phase, layer, in_use_bytes, reserved_bytes).
fn timeline(dir: &Path) -> Vec<(String, String, u64, u64)> {
    let text = std::fs::read_to_string(dir.join("memory_timeline.csv")).unwrap();
    assert!(dir.join("memory_timeline.svg").exists());
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let n = |i: usize| f[i].parse::<u64>().unwrap();
            (f[1].into(), f[2].into(), n(4), n(5))
        })
        .collect()
}

/// The measured device peak lies within `tolerance` of `trainer estimate`'s device prediction.
fn within_estimate(s: &serde_json::Value, tolerance: f64) {
    let error = s["prediction_error"].as_f64().unwrap();
    println!(
        "{} {}: measured vs predicted {error:+.3}",
        s["config"], s["precision"]
    );
    assert!(
        error.abs() < tolerance,
        "measured vs predicted {error:+.3}: {s}"
    );
}

/// How close a measured wgpu peak must be to the estimate: CubeCL keeps no peak, so the probe
/// samples at layer boundaries (and inside max-pool's backward, where SimpleModel peaks), and
/// the estimate predicts the peak itself.
const WITHIN: f64 = 0.15;

/// 20 steps of 32 at lr 3e-4: the loss falls by half on the CPU with the same numbers.
const SIMPLE: [&str; 8] = [
    "--max-steps",
    "20",
    "--set",
    "train.batch_size=32",
    "--set",
    "data.train_size=640",
    "--set",
    "train.lr=3e-4",
];

/// SimpleModel learns in f32 and in f16-mixed on a real CubeCL pool; f16 activations lower
/// the device peak; the summary names the adapter and how the peak was measured; the timeline
/// holds both passes and its highest sample, inside the max-pool's backward, is the reported
/// peak, within 15% of the estimate.
#[test]
fn simple_model_learns_on_wgpu_in_f32_and_f16_mixed() {
    let (f32s, f32_dir) = wgpu("wgpu-f32", "configs/f32.toml", &SIMPLE);
    let (amp, amp_dir) = wgpu("wgpu-amp", "configs/amp.toml", &SIMPLE);
    for (s, dir) in [(&f32s, &f32_dir), (&amp, &amp_dir)] {
        let backend = s["backend"].as_str().unwrap();
        assert!(
            backend.starts_with("wgpu: ") && backend.ends_with(", Vulkan"),
            "{s}"
        );
        assert_eq!(s["memory_probe"], "wgpu");
        assert_eq!(s["steps"], 20);
        let method = s["peak_method"].as_str().unwrap();
        assert!(method.contains("samples at layer boundaries"), "{method}");
        let (peak, reserved) = (bytes(s, "peak_bytes"), bytes(s, "reserved_peak_bytes"));
        assert!(peak > 0.0 && reserved >= peak, "{s}");
        assert!(s["reserved_after_step_bytes"].as_u64().is_some(), "{s}");
        let losses = losses(dir);
        let (first, last) = (
            losses[0],
            losses[losses.len() - 3..].iter().sum::<f64>() / 3.0,
        );
        assert!(last < 0.7 * first, "loss {first} → {last}: {losses:?}");
        let rows = timeline(dir);
        for layer in ["conv", "relu", "pool", "fc"] {
            for phase in ["forward", "backward"] {
                assert!(
                    rows.iter().any(|r| r.0 == phase && r.1 == layer),
                    "no {phase} sample at {layer}"
                );
            }
        }
        let highest = rows.iter().max_by_key(|r| r.2).unwrap();
        assert_eq!(highest.2 as f64, peak, "the timeline is the peak window");
        // The max-pool's input gradient beside its input, output gradient and argmax: seen
        // only from inside its backward (the boundaries around it see one side each).
        assert_eq!((&*highest.0, &*highest.1), ("backward", "pool (inside)"));
        within_estimate(s, WITHIN);
    }
    assert_eq!(amp["precision"], "f16-mixed");
    let ratio = bytes(&amp, "peak_bytes") / bytes(&f32s, "peak_bytes");
    assert!(ratio < 0.9, "f16-mixed / f32 device peak = {ratio}");
}

/// Configs whose device peak another test here holds to the estimate: each llvmpipe run
/// compiles its kernels afresh (most of its half minute), so they are not run twice.
const ESTIMATED_ELSEWHERE: [&str; 6] = [
    "configs/f32.toml",       // simple_model_learns_on_wgpu_in_f32_and_f16_mixed
    "configs/amp.toml",       // simple_model_learns_on_wgpu_in_f32_and_f16_mixed
    "configs/mobilenet.toml", // checkpointing_lowers_the_device_peak_on_wgpu
    "configs/mobilenet-checkpointing.toml", // checkpointing_lowers_the_device_peak_on_wgpu
    "configs/mobilenet-amp.toml", // mobilenet_f16_mixed_with_batch_norm_in_f32_trains_on_wgpu
    "configs/resnet18-amp.toml", // resnet18_f16_mixed_trains_on_wgpu_within_the_estimate
];

/// Every other shipped config's device peak on a CubeCL pool lies within 15% of its estimate
/// (two steps of 16; MobileNet and ResNet at α = 1/4, as the estimate takes any width). A
/// config whose precision the adapter cannot compute (bf16 on llvmpipe) is refused with one
/// line.
///
/// The longest test of the suite (llvmpipe compiles every config's kernels): two tests of half
/// the configs each, so that both test threads share it.
#[test]
fn every_shipped_config_is_within_the_estimate_on_wgpu_first_half() {
    every_shipped_config_within_the_estimate(0);
}

/// The other half of the above.
#[test]
fn every_shipped_config_is_within_the_estimate_on_wgpu_second_half() {
    every_shipped_config_within_the_estimate(1);
}

/// The shipped configs of `half` (0: even places in the sorted list, 1: odd) on wgpu.
fn every_shipped_config_within_the_estimate(half: usize) {
    let configs = super::common::shipped_configs();
    for config in ESTIMATED_ELSEWHERE {
        assert!(
            configs.iter().any(|c| c == config),
            "{config} is not shipped"
        );
    }
    let mine = (configs.into_iter())
        .filter(|c| !ESTIMATED_ELSEWHERE.contains(&c.as_str()))
        .enumerate()
        .filter(|(i, _)| i % 2 == half)
        .map(|(_, c)| c);
    for config in mine {
        let name = Path::new(&config).file_stem().unwrap().to_string_lossy();
        let text = std::fs::read_to_string(super::common::root().join(&config)).unwrap();
        let toml: toml::Table = text.parse().unwrap();
        let mut extra = vec!["--max-steps", "2", "--set", "train.batch_size=16"];
        match toml["model"]["name"].as_str() {
            Some("gpt") => extra.extend(TINY_GPT),
            Some("simple") => extra.extend(["--set", "data.train_size=64"]),
            _ => extra.extend([
                "--set",
                "data.train_size=64",
                "--set",
                "model.width_multiplier=0.25",
            ]),
        }
        let (out, dir) = launch(&format!("wgpu-every-{name}"), &config, &extra);
        let mode = toml.get("precision").and_then(|p| p.get("mode"));
        let bf16 = mode.and_then(|m| m.as_str()) == Some("bf16-mixed");
        if bf16 && !out.status.success() {
            assert_eq!(out.status.code(), Some(2), "{config}: {}", stderr(&out));
            let line = stderr(&out);
            assert!(
                line.trim().ends_with(
                    "does not support bf16 arithmetic on this device; use \"f32\" or \"f16-mixed\""
                ),
                "{config}: {line}"
            );
            continue;
        }
        assert!(out.status.success(), "{config}: {}", stderr(&out));
        within_estimate(&summary(&dir.join("s.json")), WITHIN);
    }
}

/// A GPT small enough for llvmpipe: 2 blocks, 64 wide, 32 tokens, a 20 kB corpus.
const TINY_GPT: [&str; 10] = [
    "--set",
    "model.n_layer=2",
    "--set",
    "model.d_model=64",
    "--set",
    "model.seq_len=32",
    "--set",
    "data.corpus_bytes=20000",
    "--set",
    "data.eval_size=4",
];

/// The tiny GPT with memory-efficient attention trains on wgpu in f32 and in f16-mixed: the
/// engine's attention op on CubeCL, its losses close to the CPU's, its peak within the
/// estimate.
#[test]
fn a_tiny_gpt_with_memory_efficient_attention_trains_on_wgpu() {
    for config in ["configs/gpt-small.toml", "configs/gpt-small-amp.toml"] {
        let mut extra = vec![
            "--max-steps",
            "3",
            "--set",
            "train.batch_size=8",
            "--set",
            "model.attention=memory_efficient",
        ];
        extra.extend(TINY_GPT);
        let name = Path::new(config).file_stem().unwrap().to_string_lossy();
        let (s, _) = wgpu(&format!("wgpu-gpt-me-{name}"), config, &extra);
        let mut args = vec!["--config", config, "--backend", "cpu"];
        args.extend(&extra);
        let (_, cpu) = super::common::train(&format!("wgpu-gpt-me-cpu-{name}"), &args);
        let (gpu_loss, cpu_loss) = (
            s["final_train_loss"].as_f64().unwrap(),
            cpu["final_train_loss"].as_f64().unwrap(),
        );
        assert!(
            (gpu_loss - cpu_loss).abs() < 0.01 * cpu_loss,
            "{config}: wgpu {gpu_loss}, cpu {cpu_loss}"
        );
        within_estimate(&s, WITHIN);
    }
}

const MOBILENET: [&str; 8] = [
    "--max-steps",
    "2",
    "--set",
    "train.batch_size=16",
    "--set",
    "data.train_size=64",
    "--set",
    "model.width_multiplier=0.25",
];

/// MobileNet in f16-mixed with batch norm in f32 (the project's BN op on CubeCL) trains.
#[test]
fn mobilenet_f16_mixed_with_batch_norm_in_f32_trains_on_wgpu() {
    let (s, dir) = wgpu(
        "wgpu-mobilenet-amp",
        "configs/mobilenet-amp.toml",
        &MOBILENET,
    );
    assert_eq!(s["precision"], "f16-mixed");
    assert_eq!(s["batch_norm"], "f32");
    assert!(s["final_train_loss"].as_f64().unwrap().is_finite(), "{s}");
    let rows = timeline(&dir);
    assert!(rows.iter().any(|r| r.1 == "block13" && r.0 == "backward"));
    within_estimate(&s, WITHIN);
}

/// ResNet-18 (CIFAR stem, α = 1/8) in f16-mixed trains on a CubeCL pool, and its device peak
/// matches the estimate walked from its own plan (residual blocks, downsample branches).
#[test]
fn resnet18_f16_mixed_trains_on_wgpu_within_the_estimate() {
    let args = [
        "--max-steps",
        "2",
        "--set",
        "model.width_multiplier=0.125",
        "--set",
        "train.batch_size=8",
        "--set",
        "data.train_size=32",
    ];
    let (s, _) = wgpu("wgpu-resnet", "configs/resnet18-amp.toml", &args);
    assert_eq!(s["model"], "resnet18(cifar, α=0.125)", "{s}");
    assert_eq!(s["steps"], 2, "{s}");
    within_estimate(&s, WITHIN);
}

/// Activation checkpointing lowers the device peak, and both peaks match the estimate.
#[test]
fn checkpointing_lowers_the_device_peak_on_wgpu() {
    let (plain, _) = wgpu("wgpu-mobilenet", "configs/mobilenet.toml", &MOBILENET);
    let (ckpt, _) = wgpu(
        "wgpu-mobilenet-ckpt",
        "configs/mobilenet-checkpointing.toml",
        &MOBILENET,
    );
    assert_eq!(ckpt["checkpointing"], "balanced");
    let ratio = bytes(&ckpt, "peak_bytes") / bytes(&plain, "peak_bytes");
    assert!(ratio < 0.95, "checkpointing / plain device peak = {ratio}");
    within_estimate(&plain, WITHIN);
    within_estimate(&ckpt, WITHIN);
}

/// `free_cache = "step"` hands cached blocks back after every step: reserved-after-step falls
/// below `never`'s while the peak in use stays within 5% (the `empty_cache` lesson).
#[test]
fn free_cache_lowers_reserved_memory_not_the_peak_on_wgpu() {
    let steps = ["--max-steps", "3", "--set", "train.batch_size=32"];
    let (never, never_dir) = wgpu("wgpu-cache-never", "configs/amp.toml", &steps);
    let with = [&steps[..], &["--set", "memory.free_cache=step"]].concat();
    let (step, step_dir) = wgpu("wgpu-cache-step", "configs/amp.toml", &with);
    let after = |s: &serde_json::Value| bytes(s, "reserved_after_step_bytes");
    assert!(
        after(&step) < after(&never),
        "reserved after step: step {} vs never {}",
        after(&step),
        after(&never)
    );
    let ratio = bytes(&step, "peak_bytes") / bytes(&never, "peak_bytes");
    assert!(
        (0.95..1.05).contains(&ratio),
        "peak in use step / never = {ratio}"
    );
    // steps.csv has both figures after every step: the pool never holds less than is in use,
    // and after each step `step` holds less than `never` does.
    let per_step = |dir: &Path| -> Vec<(u64, u64)> {
        step_memory(dir)
            .into_iter()
            .map(|(u, r)| (u.expect("bytes in use"), r.expect("bytes reserved")))
            .collect()
    };
    let (n, s) = (per_step(&never_dir), per_step(&step_dir));
    assert_eq!((n.len(), s.len()), (3, 3));
    for ((n_use, n_res), (s_use, s_res)) in n.iter().zip(&s) {
        assert!(n_res >= n_use && s_res >= s_use, "{n:?} {s:?}");
        assert!(
            s_res < n_res,
            "reserved after a step: step {s:?} vs never {n:?}"
        );
    }
}

/// `backend.autotune` and `autotune_cache = "fresh"` reach CubeCL: the summary names them, and
/// the run's own cache folder is gone when it ends.
#[test]
fn autotune_settings_reach_cubecl_and_a_fresh_cache_is_removed() {
    let leftovers = || -> Vec<String> {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("oomlab-autotune-"))
            .collect()
    };
    let before = leftovers();
    let extra = [
        "--max-steps",
        "1",
        "--set",
        "train.batch_size=16",
        "--set",
        "backend.autotune=minimal",
        "--set",
        "backend.autotune_cache=fresh",
    ];
    let (s, _) = wgpu("wgpu-autotune", "configs/f32.toml", &extra);
    assert_eq!(s["autotune"], "minimal, cache fresh (this run only)");
    assert_eq!(
        leftovers(),
        before,
        "the fresh cache folder outlived its run"
    );
}

/// Two epochs straight, or one and a resume: the same numbers, bit for bit, on wgpu.
#[test]
fn a_resume_on_wgpu_continues_bit_identically() {
    let base = [
        "--set",
        "data.train_size=64",
        "--set",
        "train.batch_size=32",
    ];
    let two = [&base[..], &["--set", "train.epochs=2"]].concat();
    let (straight, _) = wgpu("wgpu-resume-straight", "configs/f32.toml", &two);
    let one = [&base[..], &["--set", "train.epochs=1"]].concat();
    let (_, dir) = wgpu("wgpu-resume-split", "configs/f32.toml", &one);
    let checkpoint = arg(&dir.join("checkpoint"));
    let resumed = [&two[..], &["--resume", &checkpoint]].concat();
    let (resumed, _) = wgpu("wgpu-resume-split-2", "configs/f32.toml", &resumed);
    assert_eq!(resumed["steps"], 4);
    assert_eq!(resumed["eval_loss"], straight["eval_loss"]);
    assert_eq!(resumed["final_train_loss"], straight["final_train_loss"]);
}

/// No Vulkan driver: one line naming what is missing and the package, exit 2, nothing written.
#[test]
fn wgpu_without_a_vulkan_driver_is_one_line_and_exit_2() {
    let dir = temp("wgpu-no-driver");
    let out_dir = format!("train.output_dir={}", arg(&dir.join("run")));
    let args = ["--backend", "wgpu", "--max-steps", "1", "--set", &out_dir];
    let out = run_env(&args, &[("VK_ICD_FILENAMES", "/nonexistent.json")]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "error: backend.kind = \"wgpu\": the Vulkan loader found no adapter: install a Vulkan \
         driver: mesa-vulkan-drivers (llvmpipe, runs on any CPU) or your GPU vendor's (use \
         --backend cpu or auto)\n"
    );
    assert!(!dir.join("run").exists(), "a run folder was made");
}

/// A half type the adapter cannot do is refused before anything is written.
#[test]
fn bf16_on_an_adapter_without_it_is_refused_before_training() {
    let dir = temp("wgpu-bf16");
    let out_dir = format!("train.output_dir={}", arg(&dir.join("run")));
    let args = [
        "--config",
        "configs/bf16.toml",
        "--backend",
        "wgpu",
        "--set",
        &out_dir,
    ];
    let out = run_env(&args, &ENV);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with("config error: precision.mode = \"bf16-mixed\": the wgpu: ")
            && err.contains("backend does not support bf16 arithmetic on this device"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!dir.join("run").exists(), "a run folder was made");
}

/// `auto` lists the adapters but never takes a CPU one: with only llvmpipe it lands on Flex.
#[test]
fn auto_skips_a_cpu_adapter_and_trains_on_flex() {
    let dir = temp("wgpu-auto");
    let out_dir = format!("train.output_dir={}", arg(&dir));
    let args = [
        "--backend",
        "auto",
        "--max-steps",
        "1",
        "--set",
        "data.train_size=8",
    ];
    let sets = [
        "--set",
        "data.eval_size=4",
        "--set",
        "train.batch_size=4",
        "--set",
        &out_dir,
    ];
    let out = run_env(&[&args[..], &sets[..]].concat(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(
            "backend auto: no CUDA device (disabled by OOMLAB_NO_CUDA), no wgpu GPU (only CPU \
             adapters (llvmpipe"
        ) && first.ends_with("which auto skips; --backend wgpu takes them); using the CPU (Flex)"),
        "{first}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(table_value(&stdout, "backend").as_deref(), Some("cpu"));
}

/// `memory.fuse = "blocks"` on a CubeCL pool: SimpleModel's fused block (u8 window positions,
/// generic tensor ops) runs on wgpu, saves the same kind of in-use bytes as on the CPU (4.9
/// against 13.4 MiB at batch 32, 2026-12-04), and trains the same losses to f16 rounding.
#[test]
fn fused_blocks_run_on_wgpu_with_the_same_saving() {
    let steps = ["--max-steps", "3", "--set", "train.batch_size=32"];
    let data = ["--set", "data.train_size=128"];
    let args = |fuse: &'static str| [&steps[..], &data[..], &["--set", fuse]].concat();
    let (plain, plain_dir) = wgpu(
        "wgpu-fuse-none",
        "configs/amp.toml",
        &args("memory.fuse=none"),
    );
    let (fused, fused_dir) = wgpu(
        "wgpu-fuse-blocks",
        "configs/amp.toml",
        &args("memory.fuse=blocks"),
    );
    assert_eq!(fused["fuse"], "blocks", "{fused}");
    let ratio = bytes(&fused, "peak_bytes") / bytes(&plain, "peak_bytes");
    assert!(ratio < 0.6, "fused / composed peak in use = {ratio}");
    let (a, b) = (losses(&fused_dir), losses(&plain_dir));
    let gap = curve_gap(&a, &b);
    assert!(gap < 1e-3, "losses {a:?} vs {b:?}: {gap}");
    let rows = timeline(&fused_dir);
    assert!(
        rows.iter()
            .any(|r| r.0 == "backward" && r.1 == "conv+relu+pool"),
        "the fused block is one boundary"
    );
}
