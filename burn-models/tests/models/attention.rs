//! The engine's memory-efficient attention against naive attention: the same output and the
//! same `q`, `k` and `v` gradients, in f32 and f16, with a sequence that ends inside a key
//! block, under autodiff (with and without activation checkpointing) and without it. Naive
//! attention itself against a softmax written out by hand; the memory-efficient one causal,
//! forward and backward. What each keeps for backward, counted by the allocator: quadratic in
//! the sequence for naive attention, the output and one f32 per row for the memory-efficient.

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Distribution, Tensor, TensorData, TensorPrimitive};
use burn_models::ModelBackend;
use oomlab_engine::attention::{naive, KEY_BLOCK};

use crate::{counting, rel_err};

/// Two full key blocks and a partial one.
const SHAPE: [usize; 4] = [2, 3, 2 * KEY_BLOCK + 22, 16];

fn memory_efficient<B: ModelBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let prim = |t: Tensor<B, 4>| t.into_primitive().tensor();
    Tensor::from_primitive(TensorPrimitive::Float(B::memory_efficient_attention(
        prim(q),
        prim(k),
        prim(v),
    )))
}

/// Random `q`, `k`, `v` (scaled so the softmax is far from uniform) and a loss weight, in f32.
fn inputs<B: AutodiffBackend>() -> [Tensor<B, 4>; 4] {
    let device = Default::default();
    let normal = |s: f64| Tensor::<B, 4>::random(SHAPE, Distribution::Normal(0.0, s), &device);
    [normal(2.0), normal(2.0), normal(1.0), normal(1.0)]
}

/// `(output, dq, dk, dv)` as f32, of `attention(q, k, v)` in `dtype` for the loss Σ (output · r).
fn run<B: AutodiffBackend>(
    [q, k, v, r]: [Tensor<B, 4>; 4],
    dtype: DType,
    attention: impl Fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) -> Tensor<B, 4>,
) -> [Vec<f32>; 4] {
    let [q, k, v] = [q, k, v].map(|t| t.cast(dtype).detach().require_grad());
    let y = attention(q.clone(), k.clone(), v.clone());
    assert_eq!(y.dtype(), dtype);
    let grads = (y.clone().cast(DType::F32) * r).sum().backward();
    let f32s = |t: Tensor<B::InnerBackend, 4>| t.cast(DType::F32).into_data().to_vec().unwrap();
    [
        f32s(y.inner()),
        f32s(q.grad(&grads).unwrap()),
        f32s(k.grad(&grads).unwrap()),
        f32s(v.grad(&grads).unwrap()),
    ]
}

fn agree<B: AutodiffBackend + ModelBackend>(dtype: DType, tolerance: f32) {
    let inputs = inputs::<B>();
    // `q`, `k`, `v` made by memory-bound ops, as a model's are: under checkpointing the op's
    // backward reads them recomputed.
    let made = |q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>| (q * 2.0, k.neg(), v.exp());
    let reference = run(inputs.clone(), dtype, |q, k, v| {
        let (q, k, v) = made(q, k, v);
        naive(q, k, v)
    });
    let lean = run(inputs, dtype, |q, k, v| {
        let (q, k, v) = made(q, k, v);
        memory_efficient(q, k, v)
    });
    for (name, (a, b)) in ["output", "dq", "dk", "dv"]
        .iter()
        .zip(lean.iter().zip(&reference))
    {
        let err = rel_err(a, b);
        assert!(err < tolerance, "{dtype:?} {name}: {err}");
    }
}

#[test]
fn memory_efficient_attention_equals_naive_in_f32() {
    agree::<Autodiff<Flex>>(DType::F32, 1e-5);
}

#[test]
fn memory_efficient_attention_equals_naive_in_f16() {
    // Both round the matmuls' operands and results to f16 (11 significant bits), at different
    // points: the blocks' partial products against the whole row's.
    agree::<Autodiff<Flex>>(DType::F16, 4e-3);
}

#[test]
fn memory_efficient_attention_equals_naive_under_checkpointing() {
    agree::<Autodiff<Flex, BalancedCheckpointing>>(DType::F32, 1e-5);
}

#[test]
fn memory_efficient_attention_without_autodiff_equals_naive() {
    let [q, k, v, _] = inputs::<Autodiff<Flex>>().map(|t| t.inner());
    let a = memory_efficient(q.clone(), k.clone(), v.clone());
    let b = naive(q, k, v);
    let err = rel_err(
        &a.into_data().to_vec::<f32>().unwrap(),
        &b.into_data().to_vec::<f32>().unwrap(),
    );
    assert!(err < 1e-5, "{err}");
}

#[test]
fn naive_attention_is_the_causal_softmax_written_out() {
    // One head, three positions, head_dim 1: scores q_i·k_j/1, row i sees keys 0..=i.
    let device = Default::default();
    let t = |v: [f32; 3]| {
        Tensor::<Flex, 4>::from_data(TensorData::new(v.to_vec(), [1, 1, 3, 1]), &device)
    };
    let (q, k, v) = ([0.5, -1.0, 2.0], [1.0, 3.0, -0.5], [10.0, 20.0, 40.0]);
    let out = naive(t(q), t(k), t(v)).into_data().to_vec::<f32>().unwrap();
    for i in 0..3 {
        let w: Vec<f32> = (0..=i).map(|j| (q[i] * k[j]).exp()).collect();
        let expected = w.iter().zip(&v).map(|(w, v)| w * v).sum::<f32>() / w.iter().sum::<f32>();
        assert!(
            (out[i] - expected).abs() < 1e-4,
            "row {i}: {} vs {expected}",
            out[i]
        );
    }
}

#[test]
fn later_keys_do_not_change_earlier_outputs() {
    let [q, k, v, _] = inputs::<Autodiff<Flex>>().map(|t| t.inner());
    let [b, h, s, d] = SHAPE;
    let cut = KEY_BLOCK + 5;
    let noise = Tensor::<Flex, 4>::random([b, h, s - cut, d], Distribution::Default, &q.device());
    let changed = |t: Tensor<Flex, 4>| t.slice_assign([0..b, 0..h, cut..s, 0..d], noise.clone());
    let first = |t: Tensor<Flex, 4>| {
        t.slice([0..b, 0..h, 0..cut, 0..d])
            .into_data()
            .to_vec::<f32>()
            .unwrap()
    };
    let before = first(memory_efficient(q.clone(), k.clone(), v.clone()));
    let after = first(memory_efficient(
        q.clone(),
        changed(k.clone()),
        changed(v.clone()),
    ));
    assert_eq!(before, after);
    // Backward: the earlier outputs' loss has no gradient on the later keys and values.
    type A = Autodiff<Flex>;
    let [q, k, v] = [q, k, v].map(|t| Tensor::<A, 4>::from_inner(t).require_grad());
    let out = memory_efficient(q, k.clone(), v.clone()).slice([0..b, 0..h, 0..cut, 0..d]);
    let grads = out.sum().backward();
    for g in [k.grad(&grads).unwrap(), v.grad(&grads).unwrap()] {
        let later = g
            .clone()
            .slice([0..b, 0..h, cut..s, 0..d])
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        assert!(later.iter().all(|&x| x == 0.0));
        let earlier = g
            .slice([0..b, 0..h, 0..cut, 0..d])
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        assert!(earlier.iter().any(|&x| x != 0.0));
    }
}

/// An attention on the CPU under autodiff.
type Attend = fn(
    Tensor<Autodiff<Flex>, 4>,
    Tensor<Autodiff<Flex>, 4>,
    Tensor<Autodiff<Flex>, 4>,
) -> Tensor<Autodiff<Flex>, 4>;

/// Bytes the graph keeps after `attention`'s forward at `seq` positions (2 × 4 heads × 32).
fn kept(seq: usize, attention: Attend) -> i64 {
    counting::on_one_thread(|| {
        let device = Default::default();
        let t = || {
            Tensor::<Autodiff<Flex>, 4>::random([2, 4, seq, 32], Distribution::Default, &device)
                .require_grad()
        };
        let (q, k, v) = (t(), t(), t());
        let before = counting::live();
        let out = attention(q.clone(), k.clone(), v.clone());
        let kept = counting::live() - before;
        drop(out);
        kept
    })
}

#[test]
fn naive_attention_keeps_memory_quadratic_in_the_sequence_the_memory_efficient_linear() {
    let (naive_256, naive_512) = (kept(256, naive), kept(512, naive));
    let (lean_256, lean_512) = (kept(256, memory_efficient), kept(512, memory_efficient));
    // Naive: a·seq² + b·seq bytes, so doubling the sequence multiplies what it keeps by
    // 2 + 2·(the seq² part's share at 256): over 3 when the seq × seq tensors (2 · 4 · 256² f32
    // = 2 MiB each) are most of it. Purely linear memory gives 2.
    let naive_ratio = naive_512 as f64 / naive_256 as f64;
    assert!(
        naive_ratio > 3.0,
        "naive kept {naive_256} → {naive_512} bytes"
    );
    // Memory-efficient: the output and one f32 per row, 2 · 4 · seq · (32 + 1) · 4 bytes.
    let lean_ratio = lean_512 as f64 / lean_256 as f64;
    assert!(
        (1.8..2.2).contains(&lean_ratio),
        "memory-efficient kept {lean_256} → {lean_512} bytes"
    );
    let expected = 2 * 4 * 512 * (32 + 1) * 4;
    assert!(
        (lean_512 - expected).abs() < expected / 10,
        "memory-efficient kept {lean_512} bytes at 512, expected ≈ {expected}"
    );
    assert!(naive_512 > 8 * lean_512, "{naive_512} vs {lean_512}");
}
