//! One optimizer step checked against arithmetic done here: an SGD step exactly, gradient
//! clipping to the configured norm, and the learning-rate schedule against hand-computed values.

use burn::prelude::*;
use burn_models::Precision;
use trainer::training::schedule::LrSchedule;

use crate::common::*;

/// ‖a‖ over a list of flattened tensors.
fn norm(parts: &[Tensor<burn::backend::Flex, 1>]) -> f64 {
    let total: f64 = parts
        .iter()
        .map(|t| t.clone().square().sum().into_scalar().elem::<f64>())
        .sum();
    total.sqrt()
}

/// Plain SGD (no momentum) moves every weight by exactly −lr·g: a magnitude error in the
/// update shows here, where Adam's normalised step would hide it.
#[test]
fn an_sgd_step_is_w_minus_lr_times_g() {
    let s = settings(&["train.optimizer=sgd", "train.momentum=0", "train.lr=0.5"]);
    let window: Vec<usize> = (0..16).collect();
    let start = model("simple");
    let g = grads(&start, &window, 16, &Precision::F32, 1.0);
    let expected: Vec<_> = params(&start)
        .into_iter()
        .zip(grad_list(&start, &g))
        .map(|((_, w, _), (g, _))| w - g.mul_scalar(0.5))
        .collect();
    let (after, outcome) = stepper(&s, 10).apply(start.clone(), g);
    assert!(outcome.stepped());
    for ((_, got, _), want) in params(&after).into_iter().zip(expected) {
        assert!(rel_err(&got, &want) < 1e-7, "{}", rel_err(&got, &want));
    }
}

/// With `grad_clip_norm`, the applied update has exactly that norm (SGD, lr 1).
#[test]
fn clipping_scales_the_update_to_the_configured_norm() {
    let max = 1e-3;
    let s = settings(&[
        "train.optimizer=sgd",
        "train.momentum=0",
        "train.lr=1",
        &format!("train.grad_clip_norm={max}"),
    ]);
    let window: Vec<usize> = (0..16).collect();
    let start = model("simple");
    let g = grads(&start, &window, 16, &Precision::F32, 1.0);
    let raw: Vec<_> = grad_list(&start, &g).into_iter().map(|(t, _)| t).collect();
    assert!(
        norm(&raw) > 10.0 * max,
        "the gradient is large enough to clip"
    );
    let (after, _) = stepper(&s, 10).apply(start.clone(), g);
    let update: Vec<_> = params(&start)
        .into_iter()
        .zip(params(&after))
        .map(|((_, a, _), (_, b, _))| a - b)
        .collect();
    let got = norm(&update);
    assert!(
        (got / max - 1.0).abs() < 1e-3,
        "update norm {got}, clip {max}"
    );
}

/// Warmup-cosine against values computed by hand: lr 1, min 0.1, 2 warmup steps, 6 steps.
#[test]
fn warmup_cosine_matches_hand_computed_values() {
    let s = settings(&[
        "train.lr=1",
        "train.min_lr=0.1",
        "train.lr_schedule=warmup-cosine",
        "train.warmup_steps=2",
    ]);
    let schedule = LrSchedule::new(&s.train, 6);
    // Warmup: (step + 1) / 2; then 0.1 + 0.45·(1 + cos(π·t)), t = (step − 2) / 3.
    let expected = [0.5, 1.0, 1.0, 0.775, 0.325, 0.1];
    for (step, want) in expected.iter().enumerate() {
        let got = schedule.lr(step);
        assert!((got - want).abs() < 1e-12, "step {step}: {got} vs {want}");
    }
    assert_eq!(schedule.lr(100), 0.1, "past the end it stays at min_lr");
}
