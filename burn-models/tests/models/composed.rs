//! The engine's composed layers against Burn's. The conv: the same output and the same input,
//! weight and bias gradients, for every geometry the models build (dense with and without
//! bias, strided and padded, a strided 1×1 shortcut, pointwise, depthwise), in f32 and f16,
//! on channels-first and channels-last inputs, under autodiff and without it (evaluation).
//! The ReLU: the same bits forward and backward, on the values where a bit trick could go
//! wrong (±0, NaN, ±∞, subnormals), in f32, f16 and bf16, in both layouts, with its input
//! shared (never written) or not, and under activation checkpointing.

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{module, DType, Distribution, Tensor, TensorPrimitive};
use burn_models::ModelBackend;

use crate::rel_err;

/// `(c_in, c_out, kernel, stride, padding, groups, bias)` of the convs tried.
const CONVS: [(usize, usize, usize, usize, usize, usize, bool); 7] = [
    (3, 8, 3, 1, 1, 1, true),   // SimpleModel's
    (6, 10, 3, 2, 1, 1, false), // a strided ResNet conv
    (6, 10, 3, 1, 1, 1, false), // ResNet's body
    (6, 12, 1, 2, 0, 1, false), // a ResNet shortcut (1×1, stride 2: dense)
    (6, 12, 1, 1, 0, 1, false), // MobileNet's pointwise
    (6, 6, 3, 2, 1, 6, false),  // MobileNet's strided depthwise
    (5, 5, 3, 1, 1, 5, true),   // a depthwise with a bias
];

/// `(output, dx, dw, db)` as f32, of `conv(x, w, b)` for the loss Σ (output · r).
fn run<B: AutodiffBackend>(
    [x, w]: [Tensor<B, 4>; 2],
    b: Option<Tensor<B, 1>>,
    r: Tensor<B, 4>,
    conv: impl Fn(Tensor<B, 4>, Tensor<B, 4>, Option<Tensor<B, 1>>) -> Tensor<B, 4>,
) -> [Vec<f32>; 4] {
    let (x, w) = (x.require_grad(), w.require_grad());
    let b = b.map(|b| b.require_grad());
    let y = conv(x.clone(), w.clone(), b.clone());
    let grads = (y.clone() * r).sum().backward();
    let f32s = |t: Tensor<B::InnerBackend, 4>| t.cast(DType::F32).into_data().to_vec().unwrap();
    let db = match b {
        Some(b) => b
            .grad(&grads)
            .unwrap()
            .cast(DType::F32)
            .into_data()
            .to_vec()
            .unwrap(),
        None => Vec::new(),
    };
    [
        f32s(y.inner()),
        f32s(x.grad(&grads).unwrap()),
        f32s(w.grad(&grads).unwrap()),
        db,
    ]
}

fn against_burn<B>(dtype: DType, tolerance: f32)
where
    B: AutodiffBackend + ModelBackend,
    B::InnerBackend: ModelBackend,
{
    let device = Default::default();
    let normal = Distribution::Normal(0.0, 1.0);
    for (ci, co, k, s, p, g, bias) in CONVS {
        let options = ConvOptions::new([s, s], [p, p], [1, 1], g);
        let x = Tensor::<B, 4>::random([3, ci, 9, 7], normal, &device).cast(dtype);
        // The same values laid out channels last, as the direct kernels hand them on.
        let x_last = x.clone().permute([0, 2, 3, 1]);
        let x_last = Tensor::<B, 4>::from_data(x_last.into_data(), &device)
            .cast(dtype)
            .permute([0, 3, 1, 2]);
        let w = Tensor::<B, 4>::random([co, ci / g, k, k], normal, &device).cast(dtype);
        let b = bias.then(|| Tensor::<B, 1>::random([co], normal, &device).cast(dtype));
        let out = module::conv2d(x.clone(), w.clone(), b.clone(), options.clone()).dims();
        let r = Tensor::<B, 4>::random(out, normal, &device).cast(dtype);
        let burn_conv = |x, w, b| module::conv2d(x, w, b, options.clone());
        let burn = run([x.clone(), w.clone()], b.clone(), r.clone(), burn_conv);
        // The same operands in f32: what both should approach.
        let wide = |t: Tensor<B, 4>| t.cast(DType::F32);
        let exact = run(
            [wide(x.clone()), wide(w.clone())],
            b.clone().map(|b| b.cast(DType::F32)),
            wide(r.clone()),
            burn_conv,
        );
        for (layout, x) in [("channels first", x.clone()), ("channels last", x_last)] {
            let ours = run([x, w.clone()], b.clone(), r.clone(), |x, w, b| {
                let prim = |t: Tensor<B, 4>| t.into_primitive().tensor();
                let b = b.map(|b| b.into_primitive().tensor());
                let y = B::conv2d_layer(prim(x), prim(w), b, options.clone());
                Tensor::from_primitive(TensorPrimitive::Float(y))
            });
            for (i, name) in ["output", "dx", "dw", "db"].iter().enumerate() {
                let what =
                    format!("{dtype:?} {layout} conv {ci}->{co} k{k} s{s} p{p} g{g}: {name}");
                let err = rel_err(&ours[i], &burn[i]);
                assert!(err <= tolerance, "{what} off by {err}");
                // Half precision: ours sums in f32 and rounds once, Flex's half ops round
                // as they go; ours is no further from the f32 result.
                let (ours, theirs) = (rel_err(&ours[i], &exact[i]), rel_err(&burn[i], &exact[i]));
                assert!(
                    ours <= theirs * 1.05 + 1e-6,
                    "{what}: {ours} from f32, Burn's {theirs}"
                );
            }
        }
        // Without autodiff (evaluation), the plain backend's op.
        let inner = |t: Tensor<B, 4>| t.inner();
        let ours = <B::InnerBackend as ModelBackend>::conv2d_layer(
            inner(x.clone()).into_primitive().tensor(),
            inner(w.clone()).into_primitive().tensor(),
            b.clone().map(|b| b.inner().into_primitive().tensor()),
            options.clone(),
        );
        let ours = Tensor::<B::InnerBackend, 4>::from_primitive(TensorPrimitive::Float(ours));
        let f32s = |t: Tensor<B::InnerBackend, 4>| t.cast(DType::F32).into_data().to_vec::<f32>();
        let err = rel_err(&f32s(ours).unwrap(), &burn[0]);
        assert!(
            err <= tolerance,
            "{dtype:?} plain conv {ci}->{co} k{k} s{s}: off by {err}"
        );
    }
}

#[test]
fn composed_conv_equals_burns_in_f32() {
    against_burn::<Autodiff<Flex>>(DType::F32, 1e-5);
}

#[test]
fn composed_conv_equals_burns_in_f16() {
    // Both compute from the same f16 operands: a few roundings of f16 apart.
    against_burn::<Autodiff<Flex>>(DType::F16, 1e-2);
}

#[test]
fn composed_conv_equals_burns_under_activation_checkpointing() {
    against_burn::<Autodiff<Flex, BalancedCheckpointing>>(DType::F32, 1e-5);
}

/// Values where a ReLU on bit patterns could go wrong, then ordinary ones.
fn relu_values(len: usize) -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-40,
        -1e-40,
        6e-8,
        -6e-8,
        65504.0,
        -65504.0,
        1e38,
    ];
    v.extend((v.len()..len).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173));
    v
}

/// Bit patterns of `t` as f32 (each half value widens exactly).
fn bits_of<B: burn::tensor::backend::Backend>(t: Tensor<B, 4>) -> Vec<u32> {
    let v: Vec<f32> = t.cast(DType::F32).into_data().to_vec().unwrap();
    v.into_iter().map(f32::to_bits).collect()
}

fn relu_against_burn<B>(dtype: DType)
where
    B: AutodiffBackend + ModelBackend,
{
    let device = Default::default();
    let dims = [2, 3, 4, 5];
    let values = relu_values(120);
    let cf = Tensor::<B, 1>::from_floats(values.as_slice(), &device).reshape(dims);
    let x_first = cf.clone().cast(dtype);
    let cl = Tensor::<B, 1>::from_floats(values.as_slice(), &device).reshape([2, 4, 5, 3]);
    let x_last = cl.cast(dtype).permute([0, 3, 1, 2]);
    let g = Tensor::<B, 1>::from_floats(relu_values(120).as_slice(), &device)
        .reshape(dims)
        .mul_scalar(-1.5)
        .cast(dtype);
    for (layout, x) in [("channels first", x_first), ("channels last", x_last)] {
        let before = bits_of(x.clone().inner());
        let run = |relu: &dyn Fn(Tensor<B, 4>) -> Tensor<B, 4>| {
            let x = x.clone().require_grad();
            let y = relu(x.clone());
            let grads = (y.clone() * g.clone()).sum().backward();
            (bits_of(y.inner()), bits_of(x.grad(&grads).unwrap()))
        };
        let burn = run(&|x| burn::tensor::activation::relu(x));
        let ours = run(&|x| {
            let y = B::relu_layer(x.into_primitive().tensor());
            Tensor::from_primitive(TensorPrimitive::Float(y))
        });
        assert_eq!(ours.0, burn.0, "{dtype:?} {layout}: output");
        assert_eq!(ours.1, burn.1, "{dtype:?} {layout}: gradient");
        // The input is shared with the caller: never written in place.
        assert_eq!(
            bits_of(x.inner()),
            before,
            "{dtype:?} {layout}: input changed"
        );
    }
}

#[test]
fn relu_equals_burns_bit_for_bit() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        relu_against_burn::<Autodiff<Flex>>(dtype);
    }
}

#[test]
fn relu_equals_burns_under_activation_checkpointing() {
    relu_against_burn::<Autodiff<Flex, BalancedCheckpointing>>(DType::F32);
    relu_against_burn::<Autodiff<Flex, BalancedCheckpointing>>(DType::F16);
}

/// Without autodiff an input that is the last reference to its buffer is rectified in place:
/// the same bits as Burn's ReLU (run first on a copy), in f32, f16 and bf16, both layouts.
#[test]
fn relu_in_place_equals_burns_bit_for_bit() {
    let device = Default::default();
    let values = relu_values(120);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let fresh = |last: bool| {
            let t = Tensor::<Flex, 1>::from_floats(values.as_slice(), &device);
            match last {
                false => t.reshape([2, 3, 4, 5]).cast(dtype),
                true => t.reshape([2, 4, 5, 3]).cast(dtype).permute([0, 3, 1, 2]),
            }
        };
        for last in [false, true] {
            let burn = bits_of(burn::tensor::activation::relu(fresh(last)));
            // `fresh` returns the only reference to its buffer.
            let ours = <Flex as ModelBackend>::relu_layer(fresh(last).into_primitive().tensor());
            let ours = Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(ours));
            assert_eq!(bits_of(ours), burn, "{dtype:?}, channels last: {last}");
        }
    }
}
