//! Layer boundaries: the identity in value and gradient, heard in forward order then in
//! reverse during backward, with and without activation checkpointing.

use std::sync::{Arc, Mutex};
use std::thread;

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Distribution, Tensor};
use burn_models::boundary::{self, Pass};
use burn_models::{MobileNetConfig, ModelBackend, Precision, SimpleModelConfig};

/// The listener is one per process: the tests that install it take turns.
static LISTENER: Mutex<()> = Mutex::new(());

/// Runs `f` with a listener that keeps this thread's crossings (other tests run beside it).
fn heard<T>(f: impl FnOnce() -> T) -> (T, Vec<(&'static str, Pass)>) {
    let _turn = LISTENER.lock().unwrap_or_else(|e| e.into_inner());
    let me = thread::current().id();
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&log);
    boundary::listen(Some(Arc::new(move |at, pass| {
        if thread::current().id() == me {
            sink.lock().unwrap().push((at.0, pass));
        }
    })));
    let out = f();
    boundary::listen(None);
    let log = log.lock().unwrap().clone();
    (out, log)
}

/// Logits and the input's gradient, as f32 values.
fn pass<B: AutodiffBackend + ModelBackend>(
    forward: impl Fn(Tensor<B, 4>) -> Tensor<B, 2>,
    x: Tensor<B, 4>,
) -> (Vec<f32>, Vec<f32>) {
    let x = x.require_grad();
    let logits = forward(x.clone());
    let grads = logits.clone().powi_scalar(2).mean().backward();
    let values = |t: Tensor<B::InnerBackend, 2>| t.cast(DType::F32).into_data().to_vec().unwrap();
    let dx = x.grad(&grads).expect("input gradient");
    (values(logits.inner()), values(dx.flatten(1, 3)))
}

#[test]
fn simple_model_boundaries_are_heard_in_order_and_change_nothing() {
    type B = Autodiff<Flex>;
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, 3);
    let model = SimpleModelConfig::new().init::<B>(&device);
    let x = Tensor::<B, 4>::random([2, 3, 32, 32], Distribution::Normal(0.0, 1.0), &device);
    let p = Precision::mixed(DType::F16, true);
    let silent = pass(|x| model.forward(x, &p), x.clone());
    let (listened, log) = heard(|| pass(|x| model.forward(x, &p), x));
    assert_eq!(listened, silent, "a boundary changed a value or a gradient");
    use Pass::{Backward as B_, Forward as F};
    assert_eq!(
        log,
        [
            ("conv", F),
            ("relu", F),
            ("pool", F),
            ("fc", F),
            ("fc", B_),
            ("pool", B_),
            ("relu", B_),
            ("conv", B_)
        ]
    );
}

#[test]
fn mobilenet_boundaries_survive_activation_checkpointing() {
    type B = Autodiff<Flex, BalancedCheckpointing>;
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, 5);
    let model = MobileNetConfig::new()
        .with_width_multiplier(0.25)
        .with_input_size(32)
        .init::<B>(&device)
        .unwrap();
    let x = Tensor::<B, 4>::random([2, 3, 32, 32], Distribution::Normal(0.0, 1.0), &device);
    let silent = pass(|x| model.forward(x, &Precision::F32), x.clone());
    let (listened, log) = heard(|| pass(|x| model.forward(x, &Precision::F32), x));
    assert_eq!(listened, silent, "a boundary changed a value or a gradient");
    let names = |pass: Pass| -> Vec<&'static str> {
        log.iter()
            .filter(|(_, p)| *p == pass)
            .map(|(n, _)| *n)
            .collect()
    };
    let (forward, mut backward) = (names(Pass::Forward), names(Pass::Backward));
    // stem, 13 blocks, pool, fc: all of forward first, then each once in reverse.
    assert_eq!(forward.len(), 16, "{log:?}");
    assert!(
        log[..16].iter().all(|(_, p)| *p == Pass::Forward),
        "{log:?}"
    );
    backward.reverse();
    assert_eq!(forward, backward);
    assert_eq!(forward[..2], ["stem", "block1"]);
}
