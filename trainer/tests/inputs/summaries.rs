//! summary.json read back, as compare reads each child run's: every spelling a summary has
//! held parses into the report's enums and is written again byte for byte.

use trainer::backend::BackendUsed;
use trainer::config::{
    BackendKind, Checkpointing, FreeCache, Fuse, LossScaleKind, Mistakes, PrecisionMode,
};
use trainer::memory::ProbeKind;
use trainer::report::summary::Summary;

/// A summary as `trainer --summary-json` wrote it (a CPU run of `configs/amp-free-cache.toml`).
const WRITTEN: &str = r#"{
  "config": "configs/amp-free-cache.toml",
  "model": "simple",
  "parameters": 165642,
  "backend": "cpu",
  "precision": "f16-mixed",
  "batch_norm": null,
  "loss_scale": "dynamic, 65536",
  "skipped_steps": 0,
  "updates_lost": null,
  "optimizer": "sgd",
  "batch_size": 32,
  "accum_steps": 1,
  "effective_batch": 32,
  "lr_schedule": "constant",
  "final_lr": 0.001,
  "steps": 2,
  "epochs": 0,
  "images_per_sec": 167.65852489450626,
  "warmup": {
    "seconds": 0.229189416,
    "steps": 1,
    "excluded": true
  },
  "final_train_loss": 2.2884483337402344,
  "eval_loss": 2.2636018991470337,
  "eval_accuracy": 0.1875,
  "wall_seconds": 0.642134207,
  "checkpoint": "runs/amp-free-cache/checkpoint",
  "free_cache": "step",
  "checkpointing": "balanced",
  "fuse": "none",
  "autotune": "n/a (CPU)",
  "mistakes": "none",
  "predicted_peak_bytes": 26956196,
  "predicted_training_peak_bytes": 19681380,
  "floor_bytes": 4145744,
  "prediction_error": 0.0020109291385179695,
  "memory_probe": "heap",
  "peak_bytes": 27010403,
  "peak_method": "exact (counting allocator)",
  "reserved_peak_bytes": null,
  "reserved_after_step_bytes": null,
  "device_used_peak_bytes": null,
  "resident_bytes": 7304374,
  "training_peak_bytes": 19706029,
  "live_after_forward_bytes": 18626531,
  "live_after_backward_bytes": 9306811,
  "live_after_step_bytes": 8646119,
  "eval_peak_bytes": 18082415,
  "eval_added_bytes": 9438344
}
"#;

/// [`WRITTEN`] with `"key": <old>` replaced by `"key": <new>` (both JSON text).
fn with(key: &str, old: &str, new: &str) -> String {
    let (from, to) = (format!("\"{key}\": {old}"), format!("\"{key}\": {new}"));
    assert!(WRITTEN.contains(&from), "{from}");
    WRITTEN.replacen(&from, &to, 1)
}

fn read(json: &str) -> Summary {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// What `Summary::write_json` writes.
fn written(s: &Summary) -> String {
    serde_json::to_string_pretty(s).unwrap() + "\n"
}

/// Each value every enum field of a summary can hold, as JSON text.
const SPELLINGS: [(&str, &str, &[&str]); 10] = [
    (
        "backend",
        "\"cpu\"",
        &[
            "\"cuda:0\"",
            "\"cuda:3\"",
            "\"wgpu: llvmpipe (LLVM 15.0.6, 256 bits), Vulkan\"",
            "\"wgpu: Apple M2, Metal\"",
        ],
    ),
    (
        "precision",
        "\"f16-mixed\"",
        &["\"f32\"", "\"bf16-mixed\"", "\"f16\""],
    ),
    (
        "loss_scale",
        "\"dynamic, 65536\"",
        &["\"off\"", "\"fixed, 1024\"", "\"dynamic, 5.960e-8\""],
    ),
    ("optimizer", "\"sgd\"", &["\"adam\""]),
    ("lr_schedule", "\"constant\"", &["\"warmup-cosine\""]),
    ("free_cache", "\"step\"", &["\"never\"", "\"epoch\""]),
    ("checkpointing", "\"balanced\"", &["\"none\""]),
    ("fuse", "\"none\"", &["\"blocks\""]),
    (
        "mistakes",
        "\"none\"",
        &[
            "\"eval_with_autograd\"",
            "\"keep_losses\"",
            "\"eval_with_autograd, keep_losses\"",
        ],
    ),
    (
        "memory_probe",
        "\"heap\"",
        &["\"cuda\"", "\"wgpu\"", "\"none\""],
    ),
];

#[test]
fn every_spelling_reads_back_and_is_written_byte_for_byte() {
    assert_eq!(written(&read(WRITTEN)), WRITTEN);
    for (key, old, news) in SPELLINGS {
        for new in news {
            let json = with(key, old, new);
            assert_eq!(written(&read(&json)), json, "{key} = {new}");
        }
    }
}

#[test]
fn the_enums_hold_what_the_text_said() {
    let s = read(WRITTEN);
    assert_eq!(s.backend, BackendUsed::Cpu);
    assert_eq!(s.precision, PrecisionMode::F16Mixed);
    assert_eq!(
        (s.loss_scale.kind, s.loss_scale.scale),
        (LossScaleKind::Dynamic, 65536.0)
    );
    assert_eq!(s.free_cache, FreeCache::Step);
    assert_eq!(s.checkpointing, Checkpointing::Balanced);
    assert_eq!(s.memory.memory_probe, ProbeKind::Heap);
    let wgpu = read(&with(
        "backend",
        "\"cpu\"",
        "\"wgpu: llvmpipe (LLVM 15.0.6, 256 bits), Vulkan\"",
    ));
    assert_eq!(
        wgpu.backend,
        BackendUsed::Wgpu {
            adapter: "llvmpipe (LLVM 15.0.6, 256 bits)".into(),
            api: "Vulkan".into()
        }
    );
    assert_eq!(wgpu.backend.kind(), BackendKind::Wgpu);
    let both = read(&with(
        "mistakes",
        "\"none\"",
        "\"eval_with_autograd, keep_losses\"",
    ));
    assert_eq!(
        both.mistakes,
        Mistakes {
            eval_with_autograd: true,
            keep_losses: true
        }
    );
    assert!(!s.mistakes.any() && both.mistakes.any());
}

#[test]
fn summaries_from_before_fuse_autotune_and_mistakes_read_with_their_defaults() {
    let older: String = WRITTEN
        .lines()
        .filter(|l| {
            !["\"fuse\"", "\"autotune\"", "\"mistakes\""]
                .iter()
                .any(|k| l.trim_start().starts_with(k))
        })
        .collect::<Vec<_>>()
        .join("\n");
    let s = read(&older);
    assert_eq!((s.fuse, s.mistakes), (Fuse::None, Mistakes::default()));
    let again = written(&s);
    assert!(again.contains("\"fuse\": \"none\"") && again.contains("\"mistakes\": \"none\""));
}

/// The negative control: the parsers refuse what no summary ever held.
#[test]
fn a_spelling_no_summary_held_is_refused() {
    let bad = [
        ("backend", "\"cpu\"", "\"tpu\""),
        ("backend", "\"cpu\"", "\"cuda:x\""),
        ("backend", "\"cpu\"", "\"wgpu: no api\""),
        ("precision", "\"f16-mixed\"", "\"fp8\""),
        ("loss_scale", "\"dynamic, 65536\"", "\"dynamic\""),
        ("loss_scale", "\"dynamic, 65536\"", "\"off, 1\""),
        ("loss_scale", "\"dynamic, 65536\"", "\"dynamic, big\""),
        ("mistakes", "\"none\"", "\"keep_losses, typo\""),
        ("memory_probe", "\"heap\"", "\"disk\""),
    ];
    for (key, old, new) in bad {
        let json = with(key, old, new);
        assert!(
            serde_json::from_str::<Summary>(&json).is_err(),
            "{key} = {new} was read"
        );
    }
}
