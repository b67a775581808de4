//! `memory.fuse = "blocks"` through the binary on the CPU: the fused blocks keep less for
//! backward (heap peaks measured by the counting allocator), train the same losses, and the
//! estimate follows them. Memory and losses are asserted, not time.

use std::path::Path;

use super::common::{curve_gap, losses, out_dir, train};

/// What a run measured: heap peak, predicted heap peak, training peak (bytes) and step losses.
struct Run {
    peak: f64,
    predicted: f64,
    training: f64,
    losses: Vec<f64>,
}

/// A CPU run of `config` with `memory.fuse = fuse`. Its training peak is never below the
/// analytic floor, and is at most `floor_ratio` times it.
fn run(name: &str, config: &str, steps: &str, fuse: &str, sets: &[&str], floor_ratio: f64) -> Run {
    let fuse = format!("memory.fuse={fuse}");
    let mut args = vec![
        "--config",
        config,
        "--backend",
        "cpu",
        "--max-steps",
        steps,
        "--set",
        &fuse,
    ];
    for set in ["data.eval_size=16"].iter().chain(sets) {
        args.extend(["--set", set]);
    }
    let (_, s) = train(name, &args);
    assert_eq!(s["memory_probe"], "heap", "{s}");
    assert_eq!(s["fuse"], fuse.trim_start_matches("memory.fuse="), "{s}");
    let (peak, predicted) = (
        s["peak_bytes"].as_f64().unwrap(),
        s["predicted_peak_bytes"].as_f64().unwrap(),
    );
    let (training, floor) = (
        s["training_peak_bytes"].as_f64().unwrap(),
        s["floor_bytes"].as_f64().unwrap(),
    );
    println!(
        "{name}: peak {:.1} MiB, predicted {:.1} MiB, training peak {:.2}× the floor",
        peak / (1 << 20) as f64,
        predicted / (1 << 20) as f64,
        training / floor
    );
    assert!(
        floor <= training && training <= floor_ratio * floor,
        "{name}: training peak {training}, floor {floor}"
    );
    // The target for fused runs: the estimate within 10% of the training peak.
    let predicted_training = s["predicted_training_peak_bytes"].as_f64().unwrap();
    if fuse.ends_with("blocks") {
        assert!(
            (predicted_training / training - 1.0).abs() < 0.10,
            "{name}: predicted {predicted_training} vs training peak {training}"
        );
    }
    Run {
        peak,
        predicted,
        training,
        losses: losses(&out_dir(name)),
    }
}

/// SimpleModel, f32, batch 128: the fused block keeps no full-resolution tensor, so the peak
/// falls below 0.6× (measured 0.19× in training peaks on 2026-12-04); 20 losses agree to
/// 1e-3 relative (the weight gradients are summed over slices of the batch in another order).
#[test]
fn fused_simple_model_keeps_under_60_percent_and_learns_the_same() {
    let sets = ["data.train_size=1280"];
    let plain = run(
        "fuse-simple-none",
        "configs/f32.toml",
        "20",
        "none",
        &sets,
        f64::INFINITY,
    );
    // The target: within 1.15× the floor (measured 1.08× on 2026-12-04, with the
    // classifier sliced and the batch's tensors filled in place).
    let fused = run(
        "fuse-simple-blocks",
        "configs/f32.toml",
        "20",
        "blocks",
        &sets,
        1.15,
    );
    let (a, b) = (fused.peak, plain.peak);
    assert!(a <= 0.6 * b, "fused {a} vs composed {b}");
    let (a, b) = (fused.training, plain.training);
    assert!(a <= 0.6 * b, "training peaks: fused {a} vs composed {b}");
    assert_eq!(plain.losses.len(), 20);
    let gap = curve_gap(&fused.losses, &plain.losses);
    assert!(gap < 1e-3, "loss curves differ by {gap} (relative)");
    assert!(
        (fused.predicted / fused.peak - 1.0).abs() < 0.25,
        "estimate {} vs measured {}",
        fused.predicted,
        fused.peak
    );
}

/// MobileNet α 0.5, batch 64, f32 and f16-mixed (BN in f32): fusing conv → BN → ReLU drops
/// one of three kept tensors per stage, measured 0.71× in f32 and 0.73× in f16-mixed on
/// 2026-12-04. On the CPU the fused blocks' convs (the stem too), and their batch norm
/// statistics (runs merged in f64; Flex: a mean of means in f32), sum in another order than
/// Flex's: in f32 the first loss (forward only) agrees to 1e-5 relative (measured 1e-7), and
/// the curve to 1e-2: Adam's first update is ±lr per parameter whatever the gradient's size,
/// so a rounding that flips a near-zero gradient's sign moves that parameter by 2·lr
/// (measured 4e-4 at step 1, 1.8e-3 at step 2 on 2026-12-05; 5.3e-3 that evening, once the
/// stem's weight gradient and the statistics summed in another order again; the gradients
/// themselves agree to 2e-4, burn-models' `fused_models_equal_the_composed_ones`). In f16-mixed, Adam's first steps
/// (about the sign of each gradient) turn rounding into different updates, so both f16 curves
/// stray from the f32 one (1–2% at step 2, 2026-12-04): the fused curve strays no further than
/// the composed one. The initial loss scale is one that does not overflow, so neither run skips
/// a step (a skipped step is a different curve, not a rounding).
#[test]
fn fused_mobilenet_keeps_less_and_learns_the_same() {
    let sets = ["data.train_size=256", "precision.init_scale=1024"];
    let mut runs = Vec::new();
    let mut f32_losses = Vec::new();
    for config in ["configs/mobilenet.toml", "configs/mobilenet-amp.toml"] {
        let stem = Path::new(config).file_stem().unwrap().to_string_lossy();
        let name = |fuse: &str| format!("fuse-{stem}-{fuse}");
        let plain = run(&name("none"), config, "3", "none", &sets, 2.0);
        // The target: within 1.15× the floor (measured 1.03× and 1.07×).
        let fused = run(&name("blocks"), config, "3", "blocks", &sets, 1.15);
        assert!(
            fused.peak <= 0.8 * plain.peak,
            "{config}: fused {} vs {}",
            fused.peak,
            plain.peak
        );
        assert_eq!(fused.losses.len(), plain.losses.len(), "{config}");
        if f32_losses.is_empty() {
            let first = curve_gap(&fused.losses[..1], &plain.losses[..1]);
            assert!(first < 1e-5, "{config}: first losses differ by {first}");
            let gap = curve_gap(&fused.losses, &plain.losses);
            assert!(
                gap < 1e-2,
                "{config}: loss curves differ by {gap} (relative)"
            );
            f32_losses = plain.losses.clone();
        } else {
            let (fused_gap, plain_gap) = (
                curve_gap(&fused.losses, &f32_losses),
                curve_gap(&plain.losses, &f32_losses),
            );
            assert!(
                fused_gap <= 2.0 * plain_gap + 1e-3,
                "{config}: fused {fused_gap} from the f32 curve, composed {plain_gap}"
            );
        }
        assert!(
            (fused.predicted / fused.peak - 1.0).abs() < 0.25,
            "{config}: estimate {} vs measured {}",
            fused.predicted,
            fused.peak
        );
        runs.push((plain, fused));
    }
    let [(f32_plain, f32_fused), (amp_plain, amp_fused)] = &runs[..] else {
        unreachable!("two configs ran")
    };
    // Both fixes together, against f32 with neither, in heap peaks.
    let (a, b) = (amp_fused.peak, f32_plain.peak);
    assert!(a <= 0.45 * b, "{a} vs {b}");
    // The targets, in training peaks: f16-mixed about 0.55× f32 at the same fusion
    // (measured 0.5497× fused and 0.542× composed on 2026-12-04; fused 0.5553× on 2026-12-05,
    // when the fused f32 batch norm stopped making whole-tensor intermediates and f32's peak
    // fell while f16-mixed's did not: the f32 master weights and Adam state, the same in
    // both, are a larger share of a leaner f32 run), and 0.40× f32 unfused with both fixes.
    for (amp, f32, what) in [
        (amp_fused, f32_fused, "fused"),
        (amp_plain, f32_plain, "composed"),
    ] {
        let ratio = amp.training / f32.training;
        assert!(ratio <= 0.56, "f16-mixed / f32 {what}: {ratio}");
    }
    let ratio = amp_fused.training / f32_plain.training;
    assert!(ratio <= 0.40, "f16-mixed fused / f32 composed: {ratio}");
}

/// The targets for every shipped config with `fuse = "blocks"`, two steps each: the
/// training peak at most 1.15× the analytic floor (measured 1.03–1.13× on 2026-12-04, the
/// widest `amp-accum`) and the estimate within 10% of it (`run` asserts both). The GPT has no
/// conv blocks to fuse (its configs refuse `fuse = "blocks"`, tested in inputs).
#[test]
fn every_shipped_config_fused_is_within_15_percent_of_its_floor() {
    let cnns = super::common::shipped_configs().into_iter().filter(|c| {
        !Path::new(c)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .starts_with("gpt")
    });
    for config in cnns {
        let stem = Path::new(&config)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let sets = ["data.train_size=512"];
        run(
            &format!("floor-{stem}"),
            &config,
            "2",
            "blocks",
            &sets,
            1.15,
        );
    }
}
