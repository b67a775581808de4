//! Gradient accumulation against one large batch, and where batch norm breaks the equivalence.

use burn::optim::GradientsAccumulator;
use burn::tensor::DType;
use burn_models::Precision;
use trainer::training::accumulate::Windows;

use crate::common::*;

/// Relative error allowed between accumulated and one-batch results in f32: sums of the same
/// terms in a different order.
const TOLERANCE: f64 = 1e-5;

#[test]
fn four_micro_batches_of_8_equal_one_batch_of_32_then_one_adam_step() {
    let p = Precision::F32;
    let window: Vec<usize> = (0..32).collect();
    let start = model("simple");
    let accumulated = grads(&start, &window, 8, &p, 1.0);
    let whole = grads(&start, &window, 32, &p, 1.0);
    let err = max_grad_err(&start, &accumulated, &whole);
    assert!(err <= TOLERANCE, "gradients differ by {err}");

    let s = settings(&["train.batch_size=8", "train.accum_steps=4"]);
    let (mut a, mut b) = (stepper(&s, 1), stepper(&s, 1));
    let (after_a, _) = a.apply(start.clone(), accumulated);
    let (after_b, _) = b.apply(start.clone(), whole);
    let err = max_param_err(&after_a, &after_b);
    assert!(
        err <= TOLERANCE,
        "weights after one Adam step differ by {err}"
    );
    assert!(
        max_param_err(&after_a, &start) > 1e-4,
        "the step moved the weights"
    );
}

/// The training loop lends each window sum to the next backward pass, and the project's ops add
/// their fresh gradients into it there (`RunContext::lend`); what they do not take is added
/// afterwards. Either way the additions are Burn's accumulator's: the sums are the same bits,
/// composed or fused, in f32 and f16-mixed, with batch norm (MobileNet) and a short last
/// micro-batch.
#[test]
fn accumulating_inside_backward_gives_burns_accumulator_bits() {
    let half = Precision {
        compute: DType::F16,
        batch_norm: DType::F32,
        output: DType::F32,
    };
    let window: Vec<usize> = (0..20).collect();
    for name in ["simple", "simple-fused", "mobilenet-fused"] {
        let model = model(name);
        for p in [Precision::F32, half] {
            let ours = scaled_grads(&model, &window, 8, &p, 1.0);
            let mut burn = GradientsAccumulator::new();
            for micro in window.chunks(8) {
                let share = micro.len() as f64 / window.len() as f64;
                let g = scaled_grads(&model, micro, micro.len(), &p, share);
                burn.accumulate(&model, g);
            }
            let (ours, theirs) = (grad_list(&model, &ours), grad_list(&model, &burn.grads()));
            assert_eq!(ours.len(), theirs.len(), "{name}");
            assert!(!ours.is_empty(), "{name}");
            for (i, ((a, _), (b, _))) in ours.iter().zip(&theirs).enumerate() {
                let diff: f32 = (a.clone() - b.clone()).abs().max().into_scalar();
                assert_eq!(diff, 0.0, "{name} {:?}: parameter {i}", p.compute);
            }
        }
    }
}

/// A short last window (20 samples: micro-batches 8, 8, 4) is weighted by its real size. The
/// naive `loss / k` weighting (1/3 each) gives a measurably different gradient.
#[test]
fn a_partial_window_is_stepped_with_its_real_size() {
    let p = Precision::F32;
    let window: Vec<usize> = (0..20).collect();
    let model = model("simple");
    let accumulated = grads(&model, &window, 8, &p, 1.0);
    let whole = grads(&model, &window, 20, &p, 1.0);
    assert!(max_grad_err(&model, &accumulated, &whole) <= TOLERANCE);

    let mut naive = GradientsAccumulator::new();
    for micro in window.chunks(8) {
        let g = grads(&model, micro, 8, &p, 1.0);
        naive.accumulate(
            &model,
            trainer::training::grads::scale(&model, g, 1.0 / 3.0),
        );
    }
    let sum = naive.grads();
    assert!(
        max_grad_err(&model, &sum, &whole) > 1e-3,
        "loss/k over a short window should be wrong"
    );
}

#[test]
fn windows_split_an_epoch_without_crossing_it() {
    let w = Windows {
        batch_size: 8,
        accum_steps: 4,
        peers: 1,
    };
    let order: Vec<usize> = (0..100).collect();
    let sizes: Vec<usize> = w.split(&order).map(|s| s.len()).collect();
    assert_eq!(sizes, [32, 32, 32, 4]);
    assert_eq!(w.per_epoch(100), 4);
    let micro: Vec<usize> = w
        .split(&order)
        .last()
        .unwrap()
        .chunks(8)
        .map(|m| m.len())
        .collect();
    assert_eq!(micro, [4]);
}

/// With batch norm, each micro-batch is normalised by its own mean and variance, so four
/// micro-batches of 8 are not one batch of 32: the gradients differ far beyond rounding.
#[test]
fn batch_norm_makes_accumulation_differ_for_mobilenet() {
    let p = Precision::F32;
    let window: Vec<usize> = (0..32).collect();
    let model = model("mobilenet");
    let accumulated = grads(&model, &window, 8, &p, 1.0);
    let whole = grads(&model, &window, 32, &p, 1.0);
    let err = max_grad_err(&model, &accumulated, &whole);
    println!("mobilenet: 4 × 8 vs 32 max relative gradient difference {err:.3}");
    assert!(
        err > 1e-2,
        "expected BN statistics to change the gradients, got {err}"
    );
}
