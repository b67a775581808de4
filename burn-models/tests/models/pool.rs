//! The engine's max-pool against Burn's: the same values and gradients, plain and padded, in
//! f32 and f16, with and without a listener and under activation checkpointing; with one, its
//! backward is heard once, between the boundaries around it.

use std::sync::{Arc, Mutex};

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{activation, module, DType, Distribution, Tensor};
use burn_models::layers;
use burn_models::{ModelBackend, Precision, RunContext};
use oomlab_engine::{mark, Boundary, Pass};

/// `(size, stride, padding)` of the windows tried: SimpleModel's and the ImageNet stem's.
const WINDOWS: [(usize, usize, usize); 2] = [(2, 2, 0), (3, 2, 1)];

/// The pooled values and the input's gradient of `relu(x)` pooled by `pool`, as f32.
fn run<B: AutodiffBackend + ModelBackend>(
    x: Tensor<B, 4>,
    pool: impl Fn(Tensor<B, 4>) -> Tensor<B, 4>,
) -> (Vec<f32>, Vec<f32>) {
    let x = x.require_grad();
    // Through a ReLU, as in the models: under checkpointing its output may be recomputed.
    let y = pool(activation::relu(x.clone()));
    let grads = y.clone().powi_scalar(2).sum().backward();
    let f32s = |t: Tensor<B::InnerBackend, 4>| t.cast(DType::F32).into_data().to_vec().unwrap();
    (f32s(y.inner()), f32s(x.grad(&grads).unwrap()))
}

fn against_burn<B: AutodiffBackend + ModelBackend>(dtype: DType) {
    let device = Default::default();
    let x =
        Tensor::<B, 4>::random([3, 5, 9, 8], Distribution::Normal(0.0, 1.0), &device).cast(dtype);
    for (size, stride, padding) in WINDOWS {
        let burn = run(x.clone(), |x| {
            let [s, t, p] = [[size; 2], [stride; 2], [padding; 2]];
            module::max_pool2d(x, s, t, p, [1, 1], false)
        });
        for listening in [false, true] {
            let cx = RunContext::new(Precision::F32);
            if listening {
                cx.listen(Some(Arc::new(|_: Boundary, _: Pass| {})));
            }
            let ours = run(x.clone(), |x| {
                layers::max_pool2d_padded(&cx, x, size, stride, padding, Boundary("in"))
            });
            assert_eq!(ours, burn, "{dtype:?} window {size}/{stride}/{padding}");
        }
    }
}

#[test]
fn max_pool_equals_burns_in_f32_and_f16() {
    against_burn::<Autodiff<Flex>>(DType::F32);
    against_burn::<Autodiff<Flex>>(DType::F16);
}

#[test]
fn max_pool_equals_burns_under_activation_checkpointing() {
    against_burn::<Autodiff<Flex, BalancedCheckpointing>>(DType::F32);
}

/// Backward reports its peak moment once, after the boundary above it and before the one
/// below; forward reports nothing of its own.
#[test]
fn max_pool_backward_is_heard_between_its_boundaries() {
    type B = Autodiff<Flex>;
    let cx = RunContext::new(Precision::F32);
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&log);
    cx.listen(Some(Arc::new(move |at: Boundary, pass: Pass| {
        sink.lock().unwrap().push((at.0, pass));
    })));
    let x = Tensor::<B, 4>::random([2, 3, 8, 8], Distribution::Default, &Default::default());
    let (_, _) = run(x, |x| {
        let x = mark(x, Boundary("below"), &cx);
        let y = layers::max_pool2d(&cx, x, 2, Boundary("inside"));
        mark(y, Boundary("above"), &cx)
    });
    use Pass::{Backward as B_, Forward as F};
    let heard = log.lock().unwrap().clone();
    assert_eq!(
        heard,
        [
            ("below", F),
            ("above", F),
            ("above", B_),
            ("inside", B_),
            ("below", B_)
        ]
    );
}
