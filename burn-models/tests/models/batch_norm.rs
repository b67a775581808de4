//! The batch-norm op against Burn's composed `BatchNorm`, on the CPU backend under autodiff.

use burn::backend::{Autodiff, Flex};
use burn::nn::{BatchNorm, BatchNormConfig};
use burn::tensor::{DType, Distribution, Tensor};
use burn_models::layers;
use burn_models::{Precision, RunContext};

use crate::cx;

type B = Autodiff<Flex>;

fn max_rel_err<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>) -> f32 {
    let a = a.cast(DType::F32);
    let b = b.cast(DType::F32);
    let scale = b.clone().abs().max().into_scalar().max(1e-12);
    (a - b).abs().max().into_scalar() / scale
}

/// A batch norm whose γ and β are not 1 and 0, so their gradients are exercised.
fn layer() -> BatchNorm<B> {
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, 7);
    let mut bn = BatchNormConfig::new(6).init::<B>(&device);
    let gamma = Tensor::<B, 1>::random([6], Distribution::Uniform(0.5, 1.5), &device);
    let beta = Tensor::<B, 1>::random([6], Distribution::Uniform(-0.5, 0.5), &device);
    bn.gamma = bn.gamma.map(|_| gamma.require_grad());
    bn.beta = bn.beta.map(|_| beta.require_grad());
    bn
}

fn input() -> Tensor<B, 4> {
    let x = Tensor::<B, 4>::random(
        [4, 6, 5, 5],
        Distribution::Normal(2.0, 3.0),
        &Default::default(),
    );
    x.require_grad()
}

/// In f32, the op's output, input gradient, γ/β gradients and running statistics equal those
/// of `burn::nn::BatchNorm` (its composed ops are the reference).
#[test]
fn f32_op_matches_burns_batch_norm() {
    let (bn, x) = (layer(), input());
    // A weighting of the output so that dy is not constant per channel.
    let w = Tensor::<B, 4>::random([4, 6, 5, 5], Distribution::Default, &Default::default());

    let x_ref = x.clone().detach().require_grad();
    let reference = bn.forward(x_ref.clone());
    let g_ref = (reference.clone() * w.clone()).sum().backward();

    let x_op = x.detach().require_grad();
    let ours = layers::batch_norm(&RunContext::default(), &bn, x_op.clone());
    let g_ours = (ours.clone() * w).sum().backward();

    assert!(max_rel_err(ours.inner(), reference.inner()) < 1e-5);
    let (dx_ours, dx_ref) = (x_op.grad(&g_ours).unwrap(), x_ref.grad(&g_ref).unwrap());
    assert!(max_rel_err(dx_ours, dx_ref) < 1e-4);
    for param in [&bn.gamma, &bn.beta] {
        let a = param.val().grad(&g_ours).unwrap();
        let b = param.val().grad(&g_ref).unwrap();
        // Sums over 100 elements in a different order: a few f32 ulps apart.
        let err = max_rel_err(a, b);
        assert!(err < 1e-4, "parameter gradient relative error {err}");
    }
}

/// Each training forward moves the running averages as PyTorch's `BatchNorm2d` does:
/// `running = (1 − momentum)·running + momentum·batch`, with the batch variance unbiased
/// (× n/(n−1)) for the running variance. The expected values are computed from the input here;
/// the layer's values are read synced (`value_sync`), not as queued.
#[test]
fn running_statistics_follow_pytorch() {
    let (bn, x) = (layer(), input());
    let _ = layers::batch_norm(&RunContext::default(), &bn, x.clone());
    let [n, c, h, w] = x.dims();
    let count = (n * h * w) as f32;
    let per_channel = x.clone().inner().swap_dims(0, 1).reshape([c, n * h * w]);
    let mean = per_channel.clone().mean_dim(1).reshape([c]);
    let centred = per_channel - mean.clone().reshape([c, 1]);
    let biased = centred.square().mean_dim(1).reshape([c]);
    let m = bn.momentum as f32;
    let expected_mean = mean.mul_scalar(m);
    let expected_var = biased
        .mul_scalar(m * count / (count - 1.0))
        .add_scalar(1.0 - m);
    let running_mean = bn.running_mean.value_sync().inner();
    let running_var = bn.running_var.value_sync().inner();
    assert!(max_rel_err(running_mean, expected_mean) < 1e-5);
    assert!(max_rel_err(running_var.clone(), expected_var.clone()) < 1e-5);
    // Burn's own layer keeps the biased variance: the two differ by the correction.
    let biased_var = biased_var_of(&x);
    assert!(
        max_rel_err(running_var, biased_var) > 1e-4,
        "the correction is visible"
    );
}

/// The running variance Burn's `BatchNorm` would keep after one step (biased).
fn biased_var_of(x: &Tensor<B, 4>) -> Tensor<Flex, 1> {
    let reference = layer();
    let _ = reference.forward(x.clone());
    reference.running_var.value_sync().inner()
}

/// Under f16-mixed with BN in f32 the output comes back in f16 and γ's gradient in f32, and
/// both agree with the all-f32 computation to f16 precision.
#[test]
fn f16_input_keeps_dtypes_and_matches_f32() {
    let (bn, x) = (layer(), input());
    let policy = Precision::mixed(DType::F16, true);

    let x16 = Tensor::<B, 4>::from_inner(x.clone().inner().cast(DType::F16)).require_grad();
    let y16 = layers::batch_norm(&cx(&policy), &bn, x16.clone());
    assert_eq!(y16.dtype(), DType::F16);
    let w = Tensor::<B, 4>::random([4, 6, 5, 5], Distribution::Default, &Default::default());
    let g16 = (y16.clone().cast(DType::F32) * w.clone()).sum().backward();

    let y32 = layers::batch_norm(&RunContext::default(), &bn, x.clone());
    let g32 = (y32.clone() * w).sum().backward();

    assert!(max_rel_err(y16.inner(), y32.inner()) < 2e-3);
    let dgamma16 = bn.gamma.val().grad(&g16).unwrap();
    assert_eq!(dgamma16.dtype(), DType::F32);
    assert_eq!(x16.grad(&g16).unwrap().dtype(), DType::F16);
    let dbeta16 = bn.beta.val().grad(&g16).unwrap();
    let dbeta32 = bn.beta.val().grad(&g32).unwrap();
    let dgamma32 = bn.gamma.val().grad(&g32).unwrap();
    let (dx16, dx32) = (x16.grad(&g16).unwrap(), x.grad(&g32).unwrap());
    // dy arrives in f16 (2⁻¹¹ relative rounding), and x was rounded to f16 on the way in.
    for (what, err) in [
        ("dβ", max_rel_err(dbeta16, dbeta32)),
        ("dγ", max_rel_err(dgamma16, dgamma32)),
        ("dx", max_rel_err(dx16, dx32)),
    ] {
        println!("{what}: {err:.2e}");
        assert!(err < 5e-3, "{what}: relative error {err}");
    }
}

/// With `batch_norm_f32 = false` batch norm computes in the half type: its statistics come
/// back in f16 (with it true, in f32).
#[test]
fn batch_norm_computes_in_the_policys_dtype() {
    use burn_models::ModelBackend;
    let (bn, x) = (layer(), input());
    for (work, expected) in [(DType::F16, DType::F16), (DType::F32, DType::F32)] {
        let x16 = x.clone().cast(DType::F16);
        let out = B::batch_norm_train(
            x16.into_primitive().tensor(),
            bn.gamma.val().into_primitive().tensor(),
            bn.beta.val().into_primitive().tensor(),
            work,
            bn.epsilon,
            &RunContext::default(),
        );
        let mean = Tensor::<B, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(out.mean));
        let var = Tensor::<B, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(out.var));
        assert_eq!(
            (mean.dtype(), var.dtype()),
            (expected, expected),
            "work {work:?}"
        );
    }
    let policy = Precision::mixed(DType::F16, false);
    assert_eq!(policy.batch_norm, DType::F16);
}

/// Evaluation (no autodiff): the layer normalises with the running statistics as Burn's
/// `BatchNorm` does in inference, channels first and channels last, f32 and f16 activations
/// (batch norm in f32), after a training step has moved the running statistics.
#[test]
fn evaluation_matches_burns_batch_norm() {
    use burn::module::AutodiffModule;
    let bn = layer();
    // One training forward: running statistics away from 0 and 1.
    let _ = layers::batch_norm(&RunContext::default(), &bn, input());
    let bn = bn.valid();
    let x = input().inner();
    let reference = bn.forward(x.clone());
    let x_last =
        Tensor::<Flex, 4>::from_data(x.clone().permute([0, 2, 3, 1]).into_data(), &x.device())
            .permute([0, 3, 1, 2]);
    for (layout, x) in [("channels first", x), ("channels last", x_last)] {
        for (p, tolerance) in [
            (Precision::F32, 1e-6),
            (Precision::mixed(DType::F16, true), 2e-3),
        ] {
            let ours = layers::batch_norm(&cx(&p), &bn, p.compute(x.clone()));
            assert_eq!(ours.dtype(), p.compute, "{layout}");
            let err = max_rel_err(ours, reference.clone());
            assert!(
                err < tolerance,
                "{layout} {:?}: relative error {err}",
                p.compute
            );
        }
    }
}
