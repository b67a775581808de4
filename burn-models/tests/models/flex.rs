use burn::backend::Flex;
use burn::tensor::{DType, Distribution, Tensor, TensorData};
use burn_models::ModelBackend;

fn bits(t: Tensor<Flex, 2>) -> TensorData {
    t.into_data()
}

/// The direct conversion rounds exactly as Flex's own cast (through f64) does, both ways and
/// between the half types, on values that include subnormals, overflow and rounding ties.
#[test]
fn convert_rounds_as_flexs_cast() {
    let device = Default::default();
    let mut values: Vec<f32> = vec![
        0.0, -0.0, 1.0, 65504.0, 65520.0, 1e9, -1e9, 6e-8, 3e-8, 1e-40,
    ];
    values.extend((0..246).map(|i| (i as f32 - 123.0) * 0.731 + 1.0 / (i as f32 + 0.5)));
    let x = Tensor::<Flex, 1>::from_floats(values.as_slice(), &device).reshape([16, 16]);
    for (from, to) in [
        (DType::F32, DType::F16),
        (DType::F32, DType::BF16),
        (DType::F16, DType::F32),
        (DType::BF16, DType::F32),
        (DType::F16, DType::BF16),
        (DType::BF16, DType::F16),
    ] {
        let src = x.clone().cast(from);
        let ours = Tensor::<Flex, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(
            <Flex as ModelBackend>::float_convert(src.clone().into_primitive().tensor(), to),
        ));
        assert_eq!(ours.dtype(), to, "{from:?} -> {to:?}");
        assert_eq!(bits(ours), bits(src.cast(to)), "{from:?} -> {to:?}");
    }
}

/// gemm's in-place `sum + lhs · rhs` equals the matmul and add it replaces: f32 operands (a
/// transposed view among them) and f16 operands widened to f32.
#[test]
fn add_matmul_equals_matmul_then_add() {
    let device = Default::default();
    let prim = |t: Tensor<Flex, 2>| t.into_primitive().tensor();
    let float = |p| Tensor::<Flex, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(p));
    let a = Tensor::<Flex, 2>::random([7, 300], Distribution::Normal(0.0, 1.0), &device);
    let b = Tensor::<Flex, 2>::random([7, 5], Distribution::Normal(0.0, 1.0), &device);
    let c = Tensor::<Flex, 2>::random([7, 5], Distribution::Normal(0.0, 1.0), &device);
    for dtype in [DType::F32, DType::F16] {
        let (a, b, c) = (
            a.clone().cast(dtype),
            b.clone().cast(dtype),
            c.clone().cast(dtype),
        );
        let at = a.clone().transpose();
        let sum = <Flex as ModelBackend>::float_add_matmul(None, prim(at.clone()), prim(b.clone()));
        let sum =
            <Flex as ModelBackend>::float_add_matmul(Some(sum), prim(at.clone()), prim(c.clone()));
        let sum = float(sum);
        assert_eq!(sum.dtype(), DType::F32);
        let wide = |t: Tensor<Flex, 2>| t.cast(DType::F32);
        let want = wide(at.clone()).matmul(wide(b)) + wide(at).matmul(wide(c));
        let err = (sum - want.clone()).abs().max().into_scalar() / want.abs().max().into_scalar();
        assert!(err < 1e-6, "{dtype:?}: relative error {err}");
    }
}
