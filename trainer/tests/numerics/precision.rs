//! f16-mixed and bf16-mixed against f32 on the same weights and batch; pure f16's lost updates.

use burn::tensor::DType;
use oomlab_engine::RunContext;
use trainer::config::PrecisionMode;
use trainer::model::cast_params;
use trainer::training::step::Outcome;

use crate::common::*;

/// Relative tolerance of mixed-precision gradients against f32, per parameter tensor
/// (‖g_mixed − g_f32‖ / ‖g_f32‖): f16 keeps 11 significant bits, and the error of the
/// activations compounds through the layers.
const F16_TOLERANCE: f64 = 2e-2;
const BF16_TOLERANCE: f64 = 8e-2;

#[test]
fn simple_model_mixed_gradients_match_f32_per_tensor() {
    let window: Vec<usize> = (0..16).collect();
    let model = model("simple");
    let reference = grads(&model, &window, 16, &PrecisionMode::F32.policy(true), 1.0);
    for (mode, tolerance, scale) in [
        (PrecisionMode::F16Mixed, F16_TOLERANCE, 1024.0),
        (PrecisionMode::Bf16Mixed, BF16_TOLERANCE, 1.0),
    ] {
        let mixed = grads(&model, &window, 16, &mode.policy(true), scale);
        let err = max_grad_err(&model, &mixed, &reference);
        println!(
            "simple {}: max relative gradient error {err:.2e}",
            mode.name()
        );
        assert!(
            err < tolerance,
            "simple {}: {err} ≥ {tolerance}",
            mode.name()
        );
        for (_, dtype) in grad_list(&model, &mixed) {
            assert_eq!(dtype, DType::F32, "gradients of master weights are f32");
        }
    }
    for (_, _, dtype) in params(&model) {
        assert_eq!(dtype, DType::F32, "master weights stay f32");
    }
}

/// An untrained MobileNet (27 batch norms deep) amplifies any perturbation of its input:
/// rounding only the input images to f16, everything else in f32, already moves the whole
/// gradient by ≈ 30 % (‖Δg‖/‖g‖). So its mixed-precision gradient is held to that noise floor,
/// at most 3× what rounding the input alone to the same half type does, and its loss to
/// 0.5 % (f16, 11 significant bits) or 3 % (bf16, 8 bits) of the f32 loss.
#[test]
fn mobilenet_mixed_gradients_stay_within_the_networks_own_noise_floor() {
    let window: Vec<usize> = (0..16).collect();
    let model = model("mobilenet");
    let f32_policy = PrecisionMode::F32.policy(true);
    let (reference, loss_ref) = grads_and_loss(&model, &window, &f32_policy, 1.0, None);
    for (mode, scale, loss_tolerance) in [
        (PrecisionMode::F16Mixed, 1024.0, 5e-3),
        (PrecisionMode::Bf16Mixed, 1.0, 3e-2),
    ] {
        let half = mode.half();
        let (rounded, _) = grads_and_loss(&model, &window, &f32_policy, 1.0, half);
        let floor = global_grad_err(&model, &rounded, &reference);
        let (mixed, loss) = grads_and_loss(&model, &window, &mode.policy(true), scale, None);
        let err = global_grad_err(&model, &mixed, &reference);
        let loss_err = (loss - loss_ref).abs() / loss_ref;
        println!(
            "mobilenet {}: gradient error {err:.3} (input-rounding floor {floor:.3}), \
             loss error {loss_err:.2e}",
            mode.name()
        );
        assert!(
            loss_err < loss_tolerance,
            "{}: loss differs by {loss_err}",
            mode.name()
        );
        assert!(err < 3.0 * floor, "{}: {err} vs floor {floor}", mode.name());
        for (_, dtype) in grad_list(&model, &mixed) {
            assert_eq!(dtype, DType::F32);
        }
    }
}

/// What the layers hand on (and autodiff saves for backward) is half precision.
#[test]
fn activations_are_half_precision() {
    let (set, batcher) = data();
    let (images, labels) = batcher.batch::<B>(&set, &[0, 1, 2, 3], &Default::default());
    for name in ["simple", "mobilenet"] {
        let model = model(name);
        for (mode, dtype) in [
            (PrecisionMode::F32, DType::F32),
            (PrecisionMode::F16Mixed, DType::F16),
            (PrecisionMode::Bf16Mixed, DType::BF16),
        ] {
            for bn_f32 in [true, false] {
                let policy = mode.policy(bn_f32);
                let cx = RunContext::new(policy);
                let features = model.features(images.clone(), &cx).unwrap();
                assert_eq!(features.dtype(), dtype, "{name} {}", mode.name());
                let batch = (images.clone(), labels.clone()).into();
                let (logits, _) = model.predict(batch, &cx);
                assert_eq!(logits.dtype(), DType::F32, "the loss runs in f32");
            }
        }
    }
}

/// Pure f16 has no master weights: with SGD at learning rate 1e-5, `w − lr·g` rounds back
/// to `w` for most weights (f16 has 11 significant bits, so a change below w/2048 is lost).
/// The same step with f32 master weights moves nearly all of them.
#[test]
fn pure_f16_loses_small_updates_that_master_weights_keep() {
    let window: Vec<usize> = (0..32).collect();
    let mut changed = Vec::new();
    for mode in [PrecisionMode::F16Mixed, PrecisionMode::F16] {
        let s = settings(&[
            &format!("precision.mode={}", mode.name()),
            "train.optimizer=sgd",
            "train.momentum=0",
            "train.lr=1e-5",
        ]);
        let mut model = cast_params(model("simple"), mode.parameter_dtype());
        let before = params(&model);
        let mut stepper = stepper(&s, 1);
        let g = scaled_grads(
            &model,
            &window,
            32,
            &s.precision.policy(),
            stepper.scaler.scale(),
        );
        let outcome;
        (model, outcome) = stepper.apply(model, g);
        assert!(matches!(outcome, Outcome::Stepped { .. }));
        let (mut moved, mut total) = (0usize, 0usize);
        for ((_, a, dtype), (_, b, _)) in before.iter().zip(&params(&model)) {
            assert_eq!(*dtype, mode.parameter_dtype());
            let same = a.clone().equal(b.clone()).int().sum().into_scalar() as usize;
            total += a.dims()[0];
            moved += a.dims()[0] - same;
        }
        let fraction = moved as f64 / total as f64;
        println!(
            "{}: {:.1}% of weights changed",
            mode.name(),
            100.0 * fraction
        );
        changed.push(fraction);
    }
    assert!(
        changed[0] > 0.9,
        "f32 master weights take the update: {}",
        changed[0]
    );
    assert!(
        changed[1] < 0.2,
        "f16 weights lose most of it: {}",
        changed[1]
    );
}
