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

/// Batch norm in a half working dtype (`batch_norm_f32 = false`) as the CPU kernel computes it
/// (`flex-kernels/src/bn_half.rs`) against the composed tensor ops it replaces, both on Flex:
/// the training forward (output and statistics), the backward (dx, dγ, dβ) and evaluation, in
/// f16 and bf16, on channels-first and channels-last inputs, with a channel whose variance is
/// below ε (subnormal in f16) and one far from zero. Both round every element-wise result to
/// the working dtype and sum each mean's axes in f32 one at a time; the sums may add in
/// another order, so a half value may differ by one unit in its last place, and what is
/// computed from it by as much again.
#[test]
fn half_batch_norm_kernel_equals_the_composed_ops() {
    use burn::tensor::TensorPrimitive;
    use oomlab_engine::batch_norm;
    use oomlab_engine::Kernels;

    type P = Flex;
    let device = Default::default();
    let (n, c, h, w) = (5, 7, 6, 9);
    let prim = |t: Tensor<P, 4>| t.into_primitive().tensor();
    let vec_prim = |t: Tensor<P, 1>| t.into_primitive().tensor();
    let f32s = |p| -> Vec<f32> {
        let t = Tensor::<P, 1>::from_primitive(TensorPrimitive::Float(p));
        t.cast(DType::F32).into_data().to_vec().unwrap()
    };
    let f32s4 = |p| -> Vec<f32> {
        let t = Tensor::<P, 4>::from_primitive(TensorPrimitive::Float(p));
        t.cast(DType::F32).into_data().to_vec().unwrap()
    };
    // Channel 0 varies by 1e-3 (variance 1e-6 < ε), channel 1 sits 300 from zero.
    let spread = Tensor::<P, 1>::from_floats([1e-3, 1.0, 1.0, 2.0, 0.5, 1.0, 3.0], &device);
    let offset = Tensor::<P, 1>::from_floats([0.0, 300.0, -2.0, 1.0, 0.0, 5.0, -1.0], &device);
    let x = Tensor::<P, 4>::random([n, c, h, w], Distribution::Normal(0.0, 1.0), &device)
        * spread.reshape([1, c, 1, 1])
        + offset.reshape([1, c, 1, 1]);
    let dout = Tensor::<P, 4>::random([n, c, h, w], Distribution::Normal(0.0, 1.0), &device);
    let gamma = Tensor::<P, 1>::random([c], Distribution::Uniform(0.5, 1.5), &device);
    let beta = Tensor::<P, 1>::random([c], Distribution::Uniform(-0.5, 0.5), &device);
    let running = [
        Tensor::<P, 1>::random([c], Distribution::Uniform(-1.0, 1.0), &device),
        Tensor::<P, 1>::random([c], Distribution::Uniform(1e-6, 2.0), &device),
    ];
    for work in [DType::F16, DType::BF16] {
        // A value apart by at most `units` of the working dtype's last place at its size.
        let ulp = |v: f32| {
            let bits = if work == DType::F16 { 10 } else { 7 };
            let floor = if work == DType::F16 { -24.0 } else { -133.0 };
            (v.abs().max(f32::MIN_POSITIVE).log2().floor() - bits as f32)
                .max(floor)
                .exp2()
        };
        let close = |what: &str, ours: &[f32], theirs: &[f32], units: f32| {
            assert_eq!(ours.len(), theirs.len(), "{what}");
            for (k, (a, b)) in ours.iter().zip(theirs).enumerate() {
                assert!(
                    (a - b).abs() <= units * ulp(*b),
                    "{work:?} {what}[{k}]: {a} vs {b}"
                );
            }
        };
        let xw = x.clone().cast(work);
        let dw = dout.clone().cast(work);
        let last = |t: Tensor<P, 4>| {
            Tensor::<P, 4>::from_data(t.permute([0, 2, 3, 1]).into_data(), &device)
                .permute([0, 3, 1, 2])
        };
        let composed = batch_norm::forward::<P>(
            prim(xw.clone()),
            vec_prim(gamma.clone()),
            vec_prim(beta.clone()),
            work,
            1e-5,
        );
        let (y, mean, var, rstd) = (
            f32s4(composed.output),
            f32s(composed.mean.clone()),
            f32s(composed.var),
            f32s(composed.rstd.clone()),
        );
        let stats = batch_norm::SavedStats {
            mean: composed.mean,
            rstd: composed.rstd,
            work,
        };
        let [dx, dgamma, dbeta] = batch_norm::backward::<P>(
            prim(xw.clone()),
            vec_prim(gamma.clone()),
            &stats,
            prim(dw.clone()),
        );
        let (dx, dgamma, dbeta) = (f32s4(dx), f32s(dgamma), f32s(dbeta));
        let params = || {
            [
                vec_prim(gamma.clone()),
                vec_prim(beta.clone()),
                vec_prim(running[0].clone()),
                vec_prim(running[1].clone()),
            ]
        };
        let eval = f32s4(batch_norm::inference_composed::<P>(
            prim(xw.clone()),
            params(),
            work,
            1e-5,
        ));
        for (layout, xs, ds) in [
            ("channels first", xw.clone(), dw.clone()),
            ("channels last", last(xw.clone()), last(dw.clone())),
        ] {
            let [oy, omean, ovar, orstd] = <P as Kernels>::batch_norm_forward(
                prim(xs.clone()),
                vec_prim(gamma.clone()),
                vec_prim(beta.clone()),
                work,
                1e-5,
            );
            close(&format!("{layout} mean"), &f32s(omean.clone()), &mean, 1.0);
            close(&format!("{layout} var"), &f32s(ovar), &var, 1.0);
            close(&format!("{layout} rstd"), &f32s(orstd.clone()), &rstd, 2.0);
            close(&format!("{layout} output"), &f32s4(oy), &y, 2.0);
            let [odx, odgamma, odbeta] = <P as Kernels>::batch_norm_backward(
                prim(xs.clone()),
                vec_prim(gamma.clone()),
                [omean, orstd],
                work,
                prim(ds),
            );
            let odx = f32s4(odx);
            close(&format!("{layout} dx"), &odx, &dx, 2.0);
            // The same arithmetic: only where a mean's sum order moved a rounding may a value
            // differ at all.
            let moved = odx.iter().zip(&dx).filter(|(a, b)| a != b).count();
            assert!(
                moved * 50 <= dx.len(),
                "{work:?} {layout}: {moved} of {} dx values differ",
                dx.len()
            );
            // Made in f32 from the half means: a unit of the half type, times the count.
            let count = (n * h * w) as f32;
            close(&format!("{layout} dγ"), &f32s(odgamma), &dgamma, count);
            close(&format!("{layout} dβ"), &f32s(odbeta), &dbeta, count);
            let oeval = <P as Kernels>::batch_norm_inference(prim(xs), params(), work, 1e-5);
            close(&format!("{layout} evaluation"), &f32s4(oeval), &eval, 0.0);
        }
    }
}
