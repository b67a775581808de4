//! Config loading and validation: every bad input gives one exact line.

use std::path::Path;

use clap::CommandFactory;
use trainer::cli::Cli;
use trainer::config::{load_str, LossScaleSpec, ModelSpec, PrecisionMode};

pub(crate) fn error(text: &str, overrides: &[&str]) -> String {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    load_str(text, Path::new("test.toml"), &overrides)
        .unwrap_err()
        .to_string()
}

#[test]
fn verify_cli() {
    Cli::command().debug_assert();
}

#[test]
fn empty_file_gives_the_documented_defaults() {
    let s = load_str("", Path::new("configs/x.toml"), &[]).unwrap();
    assert!(matches!(s.model, ModelSpec::Simple(_)));
    assert_eq!(s.train.batch_size, 128);
    assert_eq!(s.train.lr, 1e-3);
    assert_eq!(s.train.epochs, 1);
    assert_eq!(s.train.output_dir, Path::new("runs/x"));
}

#[test]
fn overrides_take_toml_values_and_create_sections() {
    let s = load_str(
        "[train]\nbatch_size = 64\n",
        Path::new("t.toml"),
        &[
            "train.batch_size=32".into(),
            "model.name=mobilenet".into(),
            "model.width_multiplier=0.25".into(),
        ],
    )
    .unwrap();
    assert_eq!(s.train.batch_size, 32);
    match s.model {
        ModelSpec::MobileNet(c) => {
            assert_eq!(c.width_multiplier, 0.25);
            assert_eq!(c.stem_stride, 1, "32×32 input defaults to stem stride 1");
        }
        other => panic!("expected mobilenet, got {other:?}"),
    }
}

#[test]
fn unknown_keys_name_the_key_and_the_allowed_ones() {
    assert_eq!(
        error("[train]\nbatchsize = 3\n", &[]),
        "train.batchsize: unknown field `batchsize`, expected one of `batch_size`, `epochs`, \
         `max_steps`, `optimizer`, `lr`, `momentum`, `weight_decay`, `seed`, `output_dir`, \
         `accum_steps`, `lr_schedule`, `warmup_steps`, `min_lr`, `grad_clip_norm`, \
         `checkpoint_every`"
    );
    assert_eq!(
        error("[optimiser]\n", &[]),
        "optimiser: unknown field `optimiser`, expected one of `model`, `data`, `train`, `precision`, \
         `backend`, `memory`, `distributed`, `mistakes`"
    );
    assert_eq!(
        error("", &["mistakes.leak=true"]),
        "mistakes.leak: unknown field `leak`, expected `eval_with_autograd` or `keep_losses`"
    );
    assert_eq!(
        error("", &["backend.autotune=max"]),
        "backend.autotune: unknown variant `max`, expected one of `minimal`, `balanced`, \
         `extensive`, `full`"
    );
    assert_eq!(
        error("", &["backend.autotune_cache=tmp"]),
        "backend.autotune_cache: unknown variant `tmp`, expected `shared` or `fresh`"
    );
    assert_eq!(
        error("", &["mistakes.keep_losses=3"]),
        "mistakes.keep_losses: invalid type: integer `3`, expected a boolean"
    );
}

#[test]
fn wrong_types_name_the_key() {
    assert_eq!(
        error("", &["train.batch_size=abc"]),
        "train.batch_size: invalid type: string \"abc\", expected usize"
    );
    assert_eq!(
        error("[train]\nbatch_size = -4\n", &[]),
        "train.batch_size: invalid value: integer `-4`, expected usize"
    );
    assert_eq!(
        error("[model]\nname = \"vgg\"\n", &[]),
        "model.name: unknown variant `vgg`, expected one of `simple`, `mobilenet`, `resnet`, `gpt`"
    );
    assert_eq!(
        error("[backend]\nkind = \"tpu\"\n", &[]),
        "backend.kind: unknown variant `tpu`, expected one of `auto`, `cuda`, `wgpu`, `cpu`"
    );
}

#[test]
fn out_of_range_values_say_what_is_allowed() {
    let cases = [
        (
            "train.batch_size=0",
            "train.batch_size = 0: must be at least 1",
        ),
        ("train.epochs=0", "train.epochs = 0: must be at least 1"),
        (
            "train.max_steps=0",
            "train.max_steps = 0: must be at least 1 (or left out)",
        ),
        ("train.lr=0", "train.lr = 0: must be a finite number > 0"),
        (
            "train.lr=-1e-3",
            "train.lr = -0.001: must be a finite number > 0",
        ),
        ("train.momentum=1", "train.momentum = 1: must be in [0, 1)"),
        (
            "train.weight_decay=-1",
            "train.weight_decay = -1: must be a finite number >= 0",
        ),
        (
            "model.input_size=64",
            "model.input_size = 64: SimpleModel takes 32×32 images: must be 32",
        ),
        (
            "model.num_classes=5",
            "model.num_classes = 5: the data sets have 10 classes: must be 10",
        ),
        (
            "data.train_size=0",
            "data.train_size = 0: must be at least 1",
        ),
    ];
    for (set, expected) in cases {
        assert_eq!(error("", &[set]), expected, "--set {set}");
    }
    let mobilenet = "[model]\nname = \"mobilenet\"\n";
    assert_eq!(
        error(mobilenet, &["model.width_multiplier=0"]),
        "model.width_multiplier = 0: must be in (0, 4], e.g. 1.0, 0.75, 0.5, 0.25"
    );
    assert_eq!(
        error(mobilenet, &["model.stem_stride=3"]),
        "model.stem_stride = 3: must be 1 or 2"
    );
    // MobileNetConfig::validate owns the bounds; the config names the key.
    assert_eq!(
        error(mobilenet, &["model.input_size=7"]),
        "model.input_size = 7: must be at least 8"
    );
    assert!(settings(mobilenet, &["model.input_size=8"])
        .model
        .name()
        .starts_with("mobilenet"));
}

/// Every enum a summary or report prints uses the spelling the TOML accepts: each name read
/// back through the config gives the same value.
#[test]
fn printed_names_are_the_toml_spellings() {
    use trainer::config::{BackendKind, Checkpointing, FreeCache, OptimizerName, ScheduleName};
    for mode in PrecisionMode::ALL {
        let s = settings("", &[format!("precision.mode={}", mode.name()).as_str()]);
        assert_eq!(s.precision.mode, mode);
    }
    for o in [OptimizerName::Adam, OptimizerName::Sgd] {
        let s = settings("", &[format!("train.optimizer={}", o.name()).as_str()]);
        assert_eq!(s.train.optimizer, o);
    }
    for l in [ScheduleName::Constant, ScheduleName::WarmupCosine] {
        let s = settings("", &[format!("train.lr_schedule={}", l.name()).as_str()]);
        assert_eq!(s.train.lr_schedule, l);
    }
    for f in [FreeCache::Never, FreeCache::Step, FreeCache::Epoch] {
        let s = settings("", &[format!("memory.free_cache={}", f.name()).as_str()]);
        assert_eq!(s.memory.free_cache, f);
    }
    for c in [Checkpointing::None, Checkpointing::Balanced] {
        let s = settings("", &[format!("memory.checkpointing={}", c.name()).as_str()]);
        assert_eq!(s.memory.checkpointing, c);
    }
    for b in [BackendKind::Auto, BackendKind::Cuda, BackendKind::Cpu] {
        let s = settings("", &[format!("backend.kind={}", b.name()).as_str()]);
        assert_eq!(s.backend, b);
    }
    assert_eq!(ScheduleName::WarmupCosine.name(), "warmup-cosine");
}

#[test]
fn keys_that_do_not_apply_are_rejected() {
    assert_eq!(
        error("[model]\nwidth_multiplier = 0.5\n", &[]),
        "model.width_multiplier: applies only to model.name = \"mobilenet\" or \"resnet\""
    );
    assert_eq!(
        error("[model]\ndepth = 34\n", &[]),
        "model.depth: applies only to model.name = \"resnet\""
    );
    assert_eq!(
        error("[model]\nname = \"resnet\"\nstem_stride = 2\n", &[]),
        "model.stem_stride: applies only to model.name = \"mobilenet\" (ResNet's stem is model.stem)"
    );
    assert_eq!(
        error("[data]\nsource = \"cifar10\"\n", &[]),
        "data.path: is required when data.source = \"cifar10\" (the folder holding \
         data_batch_1.bin … test_batch.bin)"
    );
}

#[test]
fn syntax_and_set_errors() {
    assert_eq!(
        error("[train]\nlr = \n", &[]),
        "test.toml:2: not valid TOML: invalid string expected `\"`, `'`"
    );
    assert_eq!(
        error("", &["noequals"]),
        "--set noequals: expected key=value, e.g. --set train.batch_size=32"
    );
}

#[test]
fn every_shipped_config_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            trainer::config::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
    }
    assert!(seen >= 2, "found only {seen} configs in {}", dir.display());
}

pub(crate) fn settings(text: &str, overrides: &[&str]) -> trainer::config::Settings {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    load_str(text, Path::new("test.toml"), &overrides).unwrap()
}

#[test]
fn loss_scaling_defaults_follow_the_mode() {
    let dynamic = LossScaleSpec::Dynamic {
        init_scale: 65536.0,
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 2000,
    };
    for (mode, expected) in [
        ("f32", LossScaleSpec::Off),
        ("f16-mixed", dynamic),
        ("bf16-mixed", LossScaleSpec::Off),
        ("f16", dynamic),
    ] {
        let s = settings("", &[&format!("precision.mode={mode}")]);
        assert_eq!(s.precision.mode.name(), mode);
        assert_eq!(s.precision.loss_scale, expected, "{mode}");
        assert!(s.precision.batch_norm_f32, "batch norm defaults to f32");
    }
    let fixed = settings(
        "[precision]\nmode = \"f16-mixed\"\nloss_scale = 1024\n",
        &[],
    );
    assert_eq!(fixed.precision.loss_scale, LossScaleSpec::Fixed(1024.0));
    let off = settings(
        "",
        &["precision.mode=f16-mixed", "precision.loss_scale=off"],
    );
    assert_eq!(off.precision.loss_scale, LossScaleSpec::Off);
}

#[test]
fn loss_scale_with_f32_is_accepted_but_off_with_a_note() {
    let s = settings("[precision]\nloss_scale = \"dynamic\"\n", &[]);
    assert_eq!(s.precision.loss_scale, LossScaleSpec::Off);
    assert_eq!(
        s.precision.note.as_deref(),
        Some(
            "precision.loss_scale = \"dynamic\" has no effect with precision.mode = \"f32\": \
             f32 gradients do not underflow, so loss scaling is off"
        )
    );
}

#[test]
fn bad_precision_and_accumulation_values_say_what_is_allowed() {
    let cases = [
        (
            "precision.mode=fp8",
            "precision.mode: unknown variant `fp8`, expected one of `f32`, `f16-mixed`, \
             `bf16-mixed`, `f16`",
        ),
        (
            "precision.loss_scale=-8",
            "precision.loss_scale = -8: must be a finite number > 0",
        ),
        (
            "precision.loss_scale=auto",
            "precision.loss_scale = \"auto\": must be \"dynamic\", \"off\" or a number > 0",
        ),
        (
            "precision.backoff_factor=2",
            "precision.backoff_factor = 2: must be in (0, 1)",
        ),
        (
            "precision.growth_factor=1",
            "precision.growth_factor = 1: must be a finite number > 1",
        ),
        (
            "precision.growth_interval=0",
            "precision.growth_interval = 0: must be at least 1",
        ),
        (
            "train.accum_steps=0",
            "train.accum_steps = 0: must be at least 1 (1 = no accumulation)",
        ),
        (
            "train.grad_clip_norm=0",
            "train.grad_clip_norm = 0: must be a finite number > 0 (or left out)",
        ),
        (
            "train.lr_schedule=linear",
            "train.lr_schedule: unknown variant `linear`, expected `constant` or `warmup-cosine`",
        ),
        (
            "train.warmup_steps=10",
            "train.warmup_steps: applies only to train.lr_schedule = \"warmup-cosine\"",
        ),
        (
            "train.min_lr=1",
            "train.min_lr = 1: must be in [0, train.lr]",
        ),
    ];
    for (set, expected) in cases {
        assert_eq!(error("", &[set]), expected, "--set {set}");
    }
}

#[test]
fn bf16_on_a_backend_without_it_names_the_backend() {
    let e = trainer::config::unsupported_dtype(PrecisionMode::Bf16Mixed, "cuda:0");
    assert_eq!(
        e.to_string(),
        "precision.mode = \"bf16-mixed\": the cuda:0 backend does not support bf16 arithmetic \
         on this device; use \"f32\" or \"f16-mixed\""
    );
}

#[test]
fn effective_batch_is_micro_batch_times_accumulation() {
    let s = settings("", &["train.batch_size=32", "train.accum_steps=4"]);
    assert_eq!(s.train.effective_batch(), 128);
}

#[test]
fn memory_switches_default_off_and_parse() {
    use trainer::config::{Checkpointing, FreeCache};
    let s = settings("", &[]);
    assert_eq!(s.memory.free_cache, FreeCache::Never);
    assert_eq!(s.memory.checkpointing, Checkpointing::None);
    assert_eq!(s.memory.budget, None);
    let s = settings(
        "[memory]\nfree_cache = \"step\"\ncheckpointing = \"balanced\"\nbudget = \"1.5GiB\"\n",
        &[],
    );
    assert_eq!(s.memory.free_cache, FreeCache::Step);
    assert_eq!(s.memory.checkpointing, Checkpointing::Balanced);
    assert_eq!(s.memory.budget, Some(3 << 29));
}

#[test]
fn sizes_parse_in_binary_and_decimal_units() {
    use trainer::config::parse_size;
    for (text, bytes) in [
        ("6GiB", Some(6 << 30)),
        ("512 MiB", Some(512 << 20)),
        ("1.5GB", Some(1_500_000_000)),
        ("4096", Some(4096)),
        ("64KiB", Some(65536)),
        ("2TB", Some(2_000_000_000_000)),
        ("0GiB", None),
        ("-1GiB", None),
        ("6 gigs", None),
        ("GiB", None),
        ("", None),
    ] {
        assert_eq!(parse_size(text), bytes, "{text:?}");
    }
}

#[test]
fn bad_memory_values_say_what_is_allowed() {
    let cases = [
        (
            "memory.free_cache=always",
            "memory.free_cache: unknown variant `always`, expected one of `never`, `step`, `epoch`",
        ),
        (
            "memory.checkpointing=full",
            "memory.checkpointing: unknown variant `full`, expected one of `none`, `balanced`, `blocks`",
        ),
        (
            "memory.budget=lots",
            "memory.budget = \"lots\": expected a positive size such as \"6GiB\", \"512MiB\", \
             \"1.5GB\" or \"800000000\" (bytes)",
        ),
    ];
    for (set, expected) in cases {
        assert_eq!(error("", &[set]), expected, "--set {set}");
    }
}
