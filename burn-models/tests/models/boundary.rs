//! Layer boundaries: the identity in value and gradient, heard in forward order then in
//! reverse during backward, with and without activation checkpointing.

use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Distribution, Tensor};
use burn_models::{MobileNetConfig, ModelBackend, Precision, ResNetConfig, SimpleModelConfig};
use oomlab_engine::{Boundary, Pass, RunContext};

/// The crossings a listener heard, in order.
type Log = Arc<Mutex<Vec<(&'static str, Pass)>>>;

/// A context computing under `p` whose listener keeps every crossing it hears.
fn listened(p: Precision) -> (RunContext, Log) {
    let cx = RunContext::new(p);
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&log);
    cx.listen(Some(Arc::new(move |at: Boundary, pass| {
        sink.lock().unwrap().push((at.0, pass));
    })));
    (cx, log)
}

/// Runs `f` with a listening context under `p`: what `f` returns, and what was heard.
fn heard<T>(p: Precision, f: impl FnOnce(&RunContext) -> T) -> (T, Vec<(&'static str, Pass)>) {
    let (cx, log) = listened(p);
    let out = f(&cx);
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
    let silent = pass(|x| model.forward(x, &RunContext::new(p)), x.clone());
    let (listened, log) = heard(p, |cx| pass(|x| model.forward(x, cx), x));
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
            ("pool (inside)", B_),
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
    let silent = pass(|x| model.forward(x, &RunContext::default()), x.clone());
    let (listened, log) = heard(Precision::F32, |cx| pass(|x| model.forward(x, cx), x));
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

/// ResNet's boundaries carry torchvision's module names; each block's output is read twice
/// (the next block's branch and its identity) and still heard once each way.
#[test]
fn resnet_boundaries_are_torchvisions_names_in_order() {
    type B = Autodiff<Flex>;
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, 7);
    let model = ResNetConfig::cifar()
        .with_width_multiplier(0.125)
        .with_input_size(16)
        .with_fuse(true)
        .init::<B>(&device)
        .unwrap();
    let x = Tensor::<B, 4>::random([2, 3, 16, 16], Distribution::Normal(0.0, 1.0), &device);
    let p = Precision::mixed(DType::F16, true);
    let silent = pass(|x| model.forward(x, &RunContext::new(p)), x.clone());
    let (listened, log) = heard(p, |cx| pass(|x| model.forward(x, cx), x));
    assert_eq!(listened, silent, "a boundary changed a value or a gradient");
    let names = [
        "stem", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1", "layer4.0",
        "layer4.1", "pool", "fc",
    ];
    let forward = names.iter().map(|&n| (n, Pass::Forward));
    let backward = names.iter().rev().map(|&n| (n, Pass::Backward));
    assert_eq!(log, forward.chain(backward).collect::<Vec<_>>());
}

/// Two runs in one process, at the same time: each context hears its own model's crossings
/// and nothing of the other's, and each pass gives what it gives alone.
#[test]
fn two_runs_at_once_each_hear_only_their_own_boundaries() {
    type B = Autodiff<Flex>;
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, 7);
    let simple = SimpleModelConfig::new().init::<B>(&device);
    let mobile = MobileNetConfig::new()
        .with_width_multiplier(0.25)
        .with_input_size(32)
        .init::<B>(&device)
        .unwrap();
    let x = Tensor::<B, 4>::random([2, 3, 32, 32], Distribution::Normal(0.0, 1.0), &device);
    let alone_simple = heard(Precision::F32, |cx| {
        pass(|x| simple.forward(x, cx), x.clone())
    });
    let alone_mobile = heard(Precision::F32, |cx| {
        pass(|x| mobile.forward(x, cx), x.clone())
    });
    // Both start together and run each pass three times, so their crossings interleave.
    let start = Barrier::new(2);
    let (together_simple, together_mobile) = thread::scope(|s| {
        // Each thread its own input leaf: one leaf in two graphs at once is not what runs do.
        let own = || Tensor::<B, 4>::from_data(x.to_data(), &device);
        let (xa, xb) = (own(), own());
        let (simple, mobile, start) = (&simple, &mobile, &start);
        let a = s.spawn(move || {
            start.wait();
            heard(Precision::F32, |cx| {
                (0..3)
                    .map(|_| pass(|x| simple.forward(x, cx), xa.clone()))
                    .collect::<Vec<_>>()
            })
        });
        let b = s.spawn(move || {
            start.wait();
            heard(Precision::F32, |cx| {
                (0..3)
                    .map(|_| pass(|x| mobile.forward(x, cx), xb.clone()))
                    .collect::<Vec<_>>()
            })
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    for (alone, (together, log)) in [
        (alone_simple, together_simple),
        (alone_mobile, together_mobile),
    ] {
        assert!(together.iter().all(|t| *t == alone.0), "a pass changed");
        assert_eq!(log, alone.1.repeat(3), "a run heard crossings not its own");
    }
}
