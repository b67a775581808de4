//! The analytic estimate against the models Burn builds.

use trainer::config::{load_for, Purpose};
use trainer::memory::estimate::{estimate, Target};
use trainer::model::Network;

use crate::common::B;

fn settings(sets: &[&str]) -> trainer::config::Settings {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    load_for("", "t.toml".as_ref(), &sets, Purpose::Estimate).unwrap()
}

/// The estimate counts parameters from the architecture table; Burn counts the built model.
#[test]
fn parameter_counts_match_the_built_models() {
    let cases: [&[&str]; 5] = [
        &[],
        &["model.name=mobilenet", "model.width_multiplier=0.25"],
        &["model.name=mobilenet", "model.width_multiplier=1.0"],
        &[
            "model.name=mobilenet",
            "model.width_multiplier=0.5",
            "model.input_size=224",
            "model.num_classes=1000",
        ],
        &[
            "model.name=mobilenet",
            "model.width_multiplier=0.75",
            "model.input_size=96",
        ],
    ];
    for sets in cases {
        let s = settings(sets);
        let model: Network<B> = Network::init(&s.model, 0, &Default::default()).unwrap();
        let e = estimate(&s, Target::CpuHeap);
        assert_eq!(e.parameters as usize, model.trainable_params(), "{sets:?}");
    }
}

/// ZeRO's owners are balanced over the plan's tensors, as the training loop balances them over
/// the built model's: the two lists hold the same sizes.
#[test]
fn the_plan_lists_the_built_models_tensors() {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::prelude::*;
    struct Sizes(Vec<u64>);
    impl ModuleVisitor<B> for Sizes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if param.val().is_require_grad() {
                self.0.push(param.val().shape().num_elements() as u64);
            }
        }
    }
    let cases: [&[&str]; 5] = [
        &[],
        &["model.name=mobilenet", "model.width_multiplier=0.25"],
        &[
            "model.name=mobilenet",
            "model.width_multiplier=0.25",
            "memory.fuse=blocks",
        ],
        &["model.name=resnet", "model.depth=18"],
        &[
            "model.name=gpt",
            "data.source=text",
            "model.n_layer=2",
            "model.d_model=64",
            "model.n_head=2",
        ],
    ];
    for sets in cases {
        let s = settings(sets);
        let model: Network<B> = Network::init(&s.model, 0, &Default::default()).unwrap();
        let mut built = Sizes(Vec::new());
        model.visit(&mut built);
        let mut planned = s.model.plan().parameter_tensors();
        built.0.sort_unstable();
        planned.sort_unstable();
        assert_eq!(planned, built.0, "{sets:?}");
    }
}

/// The logits line is sized by the model's classes (it was fixed at 10: 100× too small at
/// 1000 classes), and the host data by the data spec.
#[test]
fn logits_follow_the_classes_and_host_data_the_data_set() {
    let logits = |classes: &str| -> u64 {
        let s = settings(&[
            "model.name=mobilenet",
            "model.width_multiplier=0.5",
            "model.input_size=224",
            classes,
            "train.batch_size=8",
        ]);
        let e = estimate(&s, Target::Device);
        let line = e
            .activations
            .iter()
            .find(|l| l.what.starts_with("loss: log-softmax"));
        line.expect("a logits line").bytes
    };
    // The loss keeps the shifted logits: one f32 value per class and image.
    assert_eq!(logits("model.num_classes=1000"), 8 * 1000 * 4);
    assert_eq!(logits("model.num_classes=10"), 8 * 10 * 4);

    let synthetic = estimate(
        &settings(&["data.train_size=100", "data.eval_size=28"]),
        Target::CpuHeap,
    );
    assert_eq!(synthetic.host_data.bytes, 128 * (3 * 32 * 32 + 1));
    let cifar = settings(&["data.source=cifar10", "data.path=/nowhere"]);
    let cifar = estimate(&cifar, Target::CpuHeap);
    assert_eq!(cifar.host_data.bytes, 60_000 * (3 * 32 * 32 + 1));
}

/// An estimate knows its target: the CPU heap also holds the data set and the CPU backend's
/// matmul slabs, a GPU does not. The slabs are made before the resident baseline, so they are
/// in the heap peak and not in the training peak (the device peak of a CPU estimate).
#[test]
fn the_prediction_counts_what_its_target_measures() {
    let s = settings(&["model.name=mobilenet", "model.width_multiplier=0.5"]);
    let (heap, device) = (estimate(&s, Target::CpuHeap), estimate(&s, Target::Device));
    assert_eq!(device.predicted_peak(), device.device_peak_bytes);
    assert!(device.cpu_runtime.is_none(), "a GPU has no gemm slabs");
    let slabs = heap
        .cpu_runtime
        .as_ref()
        .expect("the CPU estimate counts the slabs");
    assert!(slabs.what.starts_with("CPU matmul packing slabs"));
    assert!(slabs.bytes > 0);
    assert_eq!(
        heap.predicted_peak(),
        heap.device_peak_bytes + heap.host_data.bytes + slabs.bytes
    );
    assert_eq!(
        Target::of(trainer::config::BackendKind::Cpu),
        Target::CpuHeap
    );
    assert_eq!(
        Target::of(trainer::config::BackendKind::Cuda),
        Target::Device
    );
}

#[test]
fn activations_scale_with_the_micro_batch_and_halve_in_f16() {
    let saved = |sets: &[&str]| -> u64 {
        let mut all = vec!["model.name=mobilenet", "model.width_multiplier=0.5"];
        all.extend_from_slice(sets);
        estimate(&settings(&all), Target::CpuHeap)
            .activations
            .iter()
            .map(|l| l.bytes)
            .sum()
    };
    let f32 = saved(&["train.batch_size=64"]);
    assert_eq!(f32, 2 * saved(&["train.batch_size=32"]));
    let f16 = saved(&["train.batch_size=64", "precision.mode=f16-mixed"]);
    // Everything but the f32 logits halves.
    assert!(
        (f16 as f64 / f32 as f64 - 0.5).abs() < 1e-3,
        "{f16} / {f32}"
    );
}

/// Balanced checkpointing drops the ReLU outputs that the next op would keep: in MobileNet
/// every conv but the stem's reads one, so about a third of the saved bytes go.
#[test]
fn balanced_checkpointing_drops_the_relu_outputs() {
    let saved = |sets: &[&str]| -> u64 {
        estimate(&settings(sets), Target::CpuHeap)
            .activations
            .iter()
            .map(|l| l.bytes)
            .sum()
    };
    for model in [
        &["model.name=mobilenet", "model.width_multiplier=0.5"][..],
        &[][..],
    ] {
        let none = saved(model);
        let balanced = saved(&[model, &["memory.checkpointing=balanced"]].concat());
        assert!(balanced < none, "{model:?}: {balanced} vs {none}");
        if !model.is_empty() {
            let ratio = balanced as f64 / none as f64;
            assert!(
                (0.6..0.75).contains(&ratio),
                "MobileNet keeps {ratio} of its activations"
            );
        }
    }
}

/// The diagnosis ranks the fixes by predicted saving, each lowering the peak it names.
#[test]
fn fixes_are_ranked_by_predicted_saving() {
    let s = settings(&[
        "model.name=mobilenet",
        "model.width_multiplier=1.0",
        "train.batch_size=128",
    ]);
    let now = estimate(&s, Target::CpuHeap).predicted_peak();
    let fixes = trainer::memory::diagnosis::fixes(&s, Target::CpuHeap);
    let names: Vec<&str> = fixes.iter().map(|f| f.what.as_str()).collect();
    for expected in [
        "f16 mixed precision",
        "batch 64 × accum 2",
        "batch 32 × accum 4",
        "activation checkpointing",
        "MobileNet α 0.5 (a smaller model)",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    for pair in fixes.windows(2) {
        assert!(pair[0].saves >= pair[1].saves, "{names:?} not ranked");
    }
    // Magnitudes the model implies: half-precision activations save well over a quarter of
    // this activation-dominated peak, and quartering the micro-batch saves more than halving.
    let saves = |what: &str| fixes.iter().find(|f| f.what == what).map(|f| f.saves);
    assert!(saves("f16 mixed precision").unwrap() > now / 4, "{names:?}");
    assert!(saves("batch 32 × accum 4").unwrap() > saves("batch 64 × accum 2").unwrap());
    for f in &fixes {
        assert!(f.peak < now, "{}", f.what);
        let with = settings(
            &[
                &[
                    "model.name=mobilenet",
                    "model.width_multiplier=1.0",
                    "train.batch_size=128",
                ][..],
                &f.sets.iter().map(String::as_str).collect::<Vec<_>>()[..],
            ]
            .concat(),
        );
        assert_eq!(
            estimate(&with, Target::CpuHeap).predicted_peak(),
            f.peak,
            "{}",
            f.what
        );
    }
    // Already mixed, fused and checkpointed, at a batch neither 2 nor 4 divides: none of
    // those fixes is offered again, and nothing else is left.
    let s = settings(&[
        "precision.mode=f16-mixed",
        "memory.checkpointing=balanced",
        "memory.fuse=blocks",
        "train.batch_size=3",
    ]);
    assert!(trainer::memory::diagnosis::fixes(&s, Target::CpuHeap).is_empty());
}

/// On CUDA the estimate is also checked against the device's free memory before training.
#[test]
fn a_peak_over_the_free_device_memory_is_diagnosed_before_training() {
    let s = settings(&["model.name=mobilenet", "train.batch_size=64"]);
    let e = trainer::memory::diagnosis::check_free(&s, "cuda:0", 1 << 20, 80 << 30).unwrap_err();
    assert_eq!(
        e.to_string().lines().next(),
        Some("out of memory before training: over the free memory of cuda:0 (1.0 MiB free of 80.0 GiB)")
    );
    assert!(!e.fixes.is_empty());
    assert!(trainer::memory::diagnosis::check_free(&s, "cuda:0", 80 << 30, 80 << 30).is_ok());
}

/// CubeCL's and the driver's wordings of an allocation failure are recognised; others are not.
#[test]
fn out_of_memory_panics_are_told_from_other_panics() {
    use trainer::memory::catch::is_oom;
    assert!(is_oom(
        "An out-of-memory error happened during launch\nCaused by:\n  ..."
    ));
    assert!(is_oom(
        "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"
    ));
    assert!(is_oom("OutOfMemory { reason: .. }"));
    assert!(!is_oom(
        "index out of bounds: the len is 3 but the index is 7"
    ));
}

/// The phase an out-of-memory names is its own run's: each `catch` makes a fresh cell, so a run
/// that fails before its first boundary does not inherit the phase an earlier run in the
/// process passed last, and two runs sampling at once each keep theirs.
#[test]
fn each_run_names_its_own_failing_phase() {
    use std::sync::Barrier;
    use trainer::memory::catch::{catch, LastPhase};
    use trainer::memory::diagnosis::OutOfMemory;
    use trainer::memory::{MemoryProbe, NullProbe, Phase};

    let s = settings(&[]);
    let failing = |passed: Option<Phase>| -> String {
        let error = catch::<()>(&s, Target::Device, |last| {
            if let Some(phase) = passed {
                last.track(&mut NullProbe).sample(phase);
            }
            panic!("out of memory (a test's)");
        })
        .unwrap_err();
        error.downcast::<OutOfMemory>().unwrap().phase
    };
    assert_eq!(failing(Some(Phase::AfterForward)), "in backward");
    assert_eq!(failing(None), "while setting up (model, data)");

    let both_sampled = Barrier::new(2);
    std::thread::scope(|scope| {
        for mine in [Phase::AfterForward, Phase::EvalStart] {
            let both_sampled = &both_sampled;
            scope.spawn(move || {
                let last = LastPhase::default();
                last.track(&mut NullProbe).sample(mine);
                both_sampled.wait();
                assert_eq!(last.get(), Some(mine));
            });
        }
    });
}

/// The floor of SimpleModel f32 batch 128 (Adam), counted by hand from the fused tape: the
/// worst instant is the fused block's backward, with the images, its pooled output, one
/// position byte per output and the logits saved, and the pooled output's gradient in flight.
#[test]
fn the_floor_counts_the_fused_tape_by_hand() {
    let e = estimate(&settings(&[]), Target::Device);
    let (b, params, pooled) = (
        128u64,
        3 * 64 * 9 + 64 + 64 * 16 * 16 * 10 + 10,
        64 * 16 * 16,
    );
    let f = e.floor;
    assert_eq!(
        f.model_state,
        3 * 4 * params,
        "parameters and two Adam moments"
    );
    assert_eq!(f.gradients, 4 * params);
    assert_eq!(
        f.saved,
        b * (4 * 3 * 32 * 32 + 4 * pooled + pooled) + b * 10 * 4
    );
    assert_eq!(f.gradient, b * 4 * pooled);
    assert_eq!(f.total(), f.model_state + f.saved + f.gradient);
}

/// A floor is a lower bound: no shipped config's prediction is below it, fused or not, and
/// it does not depend on whether the config fuses (a GPT has no blocks to fuse: its configs
/// are checked as they are).
#[test]
fn no_prediction_is_below_the_floor() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let load = |fuse: &str| {
            let sets = vec![format!("memory.fuse={fuse}")];
            load_for(&text, &path, &sets, Purpose::Estimate).ok()
        };
        for target in [Target::CpuHeap, Target::Device] {
            let composed = estimate(&load("none").unwrap(), target);
            let fused = match load("blocks") {
                Some(s) => estimate(&s, target),
                None => {
                    assert!(text.contains("name = \"gpt\""), "{}", path.display());
                    composed.clone()
                }
            };
            assert_eq!(composed.floor, fused.floor, "{}", path.display());
            for e in [composed, fused] {
                assert!(
                    e.device_peak_bytes >= e.floor.total(),
                    "{}: {} < floor {}",
                    path.display(),
                    e.device_peak_bytes,
                    e.floor.total()
                );
            }
        }
        seen += 1;
    }
    assert_eq!(seen, 17, "the shipped configs");
}

/// Under mixed precision the composed layers keep each weight's half copy (autodiff saves the
/// cast); the fused ops cast the f32 weights themselves and keep none, and the floor, the
/// least of the layers there are, counts none either.
#[test]
fn fused_layers_keep_no_half_weight_copies() {
    let half_copies = |e: &trainer::memory::estimate::Estimate| {
        e.model_state
            .iter()
            .find(|l| l.what.starts_with("half copies"))
            .map(|l| l.bytes)
    };
    for model in ["simple", "mobilenet"] {
        let sets = |fuse: &'static str| {
            let model = format!("model.name={model}");
            settings(&[&model, "precision.mode=f16-mixed", fuse])
        };
        let composed = estimate(&sets("memory.fuse=none"), Target::Device);
        let fused = estimate(&sets("memory.fuse=blocks"), Target::Device);
        assert!(
            half_copies(&composed).is_some_and(|b| b > 0),
            "{model}: composed keeps half copies"
        );
        assert_eq!(half_copies(&fused), None, "{model}: fused keeps none");
        let state: u64 = fused.model_state.iter().map(|l| l.bytes).sum();
        assert_eq!(fused.floor.model_state, state, "{model}");
        assert_eq!(composed.floor, fused.floor, "{model}");
    }
}
