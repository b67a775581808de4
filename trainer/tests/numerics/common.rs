//! Shared set-up: a config, a model, synthetic batches, and ways to compare gradients.

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::DType;
use burn_models::Precision;
use oomlab_engine::RunContext;
use trainer::config::{load_str, Settings};
use trainer::data::{generate, Batcher, ImageSet};
use trainer::memory::NullProbe;
use trainer::model::Network;
use trainer::training::accumulate::window_gradients;
use trainer::training::mistakes::KeptLosses;
use trainer::training::optim::Optim;
use trainer::training::step::{StepCounters, Stepper};

pub type B = Autodiff<Flex>;

/// Settings from `--set` style overrides on an empty config.
pub fn settings(overrides: &[&str]) -> Settings {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    load_str("", Path::new("test.toml"), &overrides).unwrap()
}

/// A small MobileNet (α = 0.25) or SimpleModel, seeded; `-fused` with `memory.fuse = blocks`.
pub fn model(name: &str) -> Network<B> {
    let mobilenet = ["model.name=mobilenet", "model.width_multiplier=0.25"];
    let fused = "memory.fuse=blocks";
    let s = match name {
        "mobilenet" => settings(&mobilenet),
        "mobilenet-fused" => settings(&[mobilenet[0], mobilenet[1], fused]),
        "simple-fused" => settings(&[fused]),
        _ => settings(&[]),
    };
    Network::init(&s.model, 3, &Default::default()).unwrap()
}

/// 64 synthetic images and a batcher fitted on them.
pub fn data() -> (ImageSet, Batcher) {
    let set = generate(64, 32, 0, 0);
    let batcher = Batcher::fit(&set);
    (set, batcher)
}

/// The summed gradient over `window` in micro-batches of `batch`, with the loss multiplied by
/// `scale`, exactly as the training loop hands it to the stepper.
pub fn scaled_grads(
    model: &Network<B>,
    window: &[usize],
    batch: usize,
    policy: &Precision,
    scale: f64,
) -> GradientsParams {
    let (set, batcher) = data();
    window_gradients(
        model,
        window,
        window.len(),
        batch,
        &RunContext::new(*policy),
        scale,
        &mut NullProbe,
        &mut KeptLosses::new(false),
        |idx| batcher.batch::<B>(&set, idx, &Default::default()).into(),
    )
    .grads
}

/// [`scaled_grads`] divided by `scale` again (in the gradients' dtype).
pub fn grads(
    model: &Network<B>,
    window: &[usize],
    batch: usize,
    policy: &Precision,
    scale: f64,
) -> GradientsParams {
    let g = scaled_grads(model, window, batch, policy, scale);
    trainer::training::grads::scale(model, g, 1.0 / scale)
}

/// Gradients and mean loss over `window` as one batch; `round_input` rounds the images to that
/// dtype (and back) first, to measure how much a network amplifies input rounding alone.
pub fn grads_and_loss(
    model: &Network<B>,
    window: &[usize],
    policy: &Precision,
    scale: f64,
    round_input: Option<DType>,
) -> (GradientsParams, f64) {
    let (set, batcher) = data();
    let w = window_gradients(
        model,
        window,
        window.len(),
        window.len(),
        &RunContext::new(*policy),
        scale,
        &mut NullProbe,
        &mut KeptLosses::new(false),
        |idx| {
            let (x, y) = batcher.batch::<B>(&set, idx, &Default::default());
            let x = match round_input {
                Some(dtype) => x.cast(dtype).cast(DType::F32),
                None => x,
            };
            (x, y).into()
        },
    );
    (
        trainer::training::grads::scale(model, w.grads, 1.0 / scale),
        w.loss,
    )
}

/// ‖a − b‖ / ‖b‖ over all gradients of `model` taken as one vector.
pub fn global_grad_err(model: &Network<B>, a: &GradientsParams, b: &GradientsParams) -> f64 {
    let cat = |g: &GradientsParams| {
        Tensor::cat(grad_list(model, g).into_iter().map(|(t, _)| t).collect(), 0)
    };
    rel_err(&cat(a), &cat(b))
}

/// A stepper as the trainer builds it from `s`.
pub fn stepper(s: &Settings, total_steps: usize) -> Stepper<Network<B>, B> {
    Stepper::new(
        s,
        total_steps,
        Optim::new(&s.train),
        &StepCounters::default(),
    )
}

/// Every trainable parameter as `(id, flattened f32 values, dtype)`, in module order.
pub fn params(model: &Network<B>) -> Vec<(ParamId, Tensor<Flex, 1>, DType)> {
    struct Collect(Vec<(ParamId, Tensor<Flex, 1>, DType)>);
    impl ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            if t.is_require_grad() {
                let dtype = t.dtype();
                self.0.push((
                    param.id,
                    t.inner().cast(DType::F32).flatten(0, D - 1),
                    dtype,
                ));
            }
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0
}

/// The gradient of every trainable parameter, flattened, with its dtype.
pub fn grad_list(model: &Network<B>, grads: &GradientsParams) -> Vec<(Tensor<Flex, 1>, DType)> {
    struct Collect<'a>(&'a GradientsParams, Vec<(Tensor<Flex, 1>, DType)>);
    impl ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.0.get::<Flex, D>(param.id) {
                let dtype = g.dtype();
                self.1.push((g.cast(DType::F32).flatten(0, D - 1), dtype));
            }
        }
    }
    let mut c = Collect(grads, Vec::new());
    model.visit(&mut c);
    c.1
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_err(a: &Tensor<Flex, 1>, b: &Tensor<Flex, 1>) -> f64 {
    let diff: f64 = (a.clone() - b.clone())
        .square()
        .sum()
        .sqrt()
        .into_scalar()
        .elem();
    let norm: f64 = b.clone().square().sum().sqrt().into_scalar().elem();
    diff / norm.max(1e-30)
}

/// The largest per-tensor relative error between two models' gradients.
pub fn max_grad_err(model: &Network<B>, a: &GradientsParams, b: &GradientsParams) -> f64 {
    let (a, b) = (grad_list(model, a), grad_list(model, b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|((x, _), (y, _))| rel_err(x, y))
        .fold(0.0, f64::max)
}

/// The largest per-tensor relative difference between two models' parameters.
pub fn max_param_err(a: &Network<B>, b: &Network<B>) -> f64 {
    params(a)
        .iter()
        .zip(&params(b))
        .map(|((_, x, _), (_, y, _))| rel_err(x, y))
        .fold(0.0, f64::max)
}

/// Whether two models' parameters are bit-for-bit equal.
pub fn bit_identical(a: &Network<B>, b: &Network<B>) -> bool {
    let a: Vec<_> = params(a)
        .into_iter()
        .map(|(_, t, _)| t.into_data())
        .collect();
    let b: Vec<_> = params(b)
        .into_iter()
        .map(|(_, t, _)| t.into_data())
        .collect();
    a == b
}
