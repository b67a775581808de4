//! The loss scaler inside a real optimizer step: skip on overflow, back off, grow, checkpoint.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use trainer::training::accumulate::Position;
use trainer::training::checkpoint::{self, LoopState};
use trainer::training::step::Outcome;

use crate::common::*;

/// f16-mixed with dynamic scaling and a warmup-cosine schedule, so the LR depends on the step.
fn amp(growth_interval: usize) -> trainer::config::Settings {
    settings(&[
        "precision.mode=f16-mixed",
        &format!("precision.growth_interval={growth_interval}"),
        "train.lr_schedule=warmup-cosine",
        "train.warmup_steps=5",
    ])
}

/// Replaces the gradient of the first parameter that has one by the same tensor times inf.
fn inject_inf(model: &impl Module<B>, grads: GradientsParams) -> GradientsParams {
    struct Poison(GradientsParams, bool);
    impl ModuleVisitor<B> for Poison {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.1 {
                return;
            }
            if let Some(g) = self.0.remove::<burn::backend::Flex, D>(param.id) {
                self.0.register(param.id, g.mul_scalar(f32::INFINITY));
                self.1 = true;
            }
        }
    }
    let mut p = Poison(grads, false);
    model.visit(&mut p);
    assert!(p.1, "no gradient to poison");
    p.0
}

#[test]
fn an_inf_gradient_skips_the_step_halves_the_scale_and_holds_the_lr() {
    let s = amp(2000);
    let window: Vec<usize> = (0..16).collect();
    let model = model("simple");
    let mut stepper = stepper(&s, 100);
    let (scale, lr) = (stepper.scaler.scale(), stepper.lr());
    assert_eq!(scale, 65536.0);

    let g = scaled_grads(&model, &window, 16, &s.precision.policy(), scale);
    let (after, outcome) = stepper.apply(model.clone(), inject_inf(&model, g));
    assert_eq!(outcome, Outcome::Skipped);
    assert!(
        bit_identical(&after, &model),
        "a skipped step must not touch the weights"
    );
    assert_eq!(stepper.scaler.scale(), 32768.0);
    assert_eq!((stepper.step, stepper.skipped), (0, 1));
    assert_eq!(
        stepper.lr(),
        lr,
        "the schedule does not advance on a skipped step"
    );

    let g = scaled_grads(
        &after,
        &window,
        16,
        &s.precision.policy(),
        stepper.scaler.scale(),
    );
    let (stepped, outcome) = stepper.apply(after.clone(), g);
    assert_eq!(outcome, Outcome::Stepped { lr });
    assert!(!bit_identical(&stepped, &after));
    assert_eq!(stepper.step, 1);
    assert!(stepper.lr() > lr, "warmup: the next step's lr is higher");
}

#[test]
fn the_scale_grows_after_growth_interval_clean_steps() {
    let mut s = amp(3);
    // Low enough that these gradients never overflow, so every step is clean.
    s.precision.loss_scale = trainer::config::LossScaleSpec::Dynamic {
        init_scale: 1024.0,
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 3,
    };
    let window: Vec<usize> = (0..8).collect();
    let mut model = model("simple");
    let mut stepper = stepper(&s, 100);
    let mut scales = Vec::new();
    for _ in 0..3 {
        let g = scaled_grads(
            &model,
            &window,
            8,
            &s.precision.policy(),
            stepper.scaler.scale(),
        );
        (model, _) = stepper.apply(model, g);
        scales.push(stepper.scaler.scale());
    }
    assert_eq!(scales, [1024.0, 1024.0, 2048.0]);
    assert_eq!(stepper.skipped, 0);
}

#[test]
fn scaler_state_round_trips_through_a_checkpoint() {
    let s = amp(2000);
    let window: Vec<usize> = (0..8).collect();
    let model = model("simple");
    let mut stepper = stepper(&s, 100);
    let g = scaled_grads(
        &model,
        &window,
        8,
        &s.precision.policy(),
        stepper.scaler.scale(),
    );
    let (model, _) = stepper.apply(model.clone(), inject_inf(&model, g));
    let g = scaled_grads(
        &model,
        &window,
        8,
        &s.precision.policy(),
        stepper.scaler.scale(),
    );
    let (model, _) = stepper.apply(model, g);

    let state = LoopState::of(
        &s,
        Position {
            epoch: 0,
            window: 2,
        },
        stepper.counters(),
    );
    let dir = std::env::temp_dir().join(format!("oomlab-scaler-{}", std::process::id()));
    checkpoint::save(&dir, &model, &stepper.optim, &state, "").unwrap();
    let saved = checkpoint::read(&dir, &s).unwrap();
    let (_, _) = checkpoint::load(
        &saved,
        crate::common::model("simple"),
        stepper_for_resume(&s),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(saved.state, state);
    let scaler = saved.state.counters.scaler.unwrap();
    assert_eq!((scaler.scale, scaler.clean_steps), (32768.0, 1));

    // Resumed into dynamic scaling the saved scale continues; the new config's fixed scale or
    // no scaling wins over it (a fixed 128 once kept 262144 and diverged).
    let counters = saved.state.counters;
    let resumed = |sets: &[&str]| {
        let s = settings(sets);
        trainer::training::step::Stepper::new(&s, 100, stepper_for_resume(&s), &counters)
            .scaler
            .scale()
    };
    assert_eq!(resumed(&["precision.mode=f16-mixed"]), 32768.0);
    assert_eq!(
        resumed(&["precision.mode=f16-mixed", "precision.loss_scale=128"]),
        128.0
    );
    assert_eq!(
        resumed(&["precision.mode=f16-mixed", "precision.loss_scale=\"off\""]),
        1.0
    );
    assert_eq!(resumed(&["precision.mode=f32"]), 1.0);
    std::fs::remove_dir_all(&dir).ok();
}

fn stepper_for_resume(
    s: &trainer::config::Settings,
) -> trainer::training::optim::Optim<trainer::model::Network<B>, B> {
    trainer::training::optim::Optim::new(&s.train)
}
