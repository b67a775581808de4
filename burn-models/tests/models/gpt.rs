//! The GPT-2-style model: GPT-2 small's parameter count, shapes, bad configs, causality, the
//! two attentions giving the same logits and gradients, mixed precision against f32, and a
//! tiny model learning a sequence.

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use burn_models::{Attention, Gpt, GptConfig, GptError, ModelBackend, Precision};

use crate::{cx, rel_err};

type B = Autodiff<Flex>;

/// A model small enough for a test: 2 layers, 2 heads, 32 wide, 80 positions (past one key
/// block of the memory-efficient attention), 16 tokens.
const TINY: GptConfig = GptConfig {
    n_layer: 2,
    n_head: 2,
    d_model: 32,
    seq_len: 80,
    vocab_size: 16,
    attention: Attention::Naive,
    checkpoint_blocks: false,
};

fn tokens<Bk: burn::tensor::backend::Backend>(
    rows: &[Vec<i64>],
    device: &Bk::Device,
) -> Tensor<Bk, 2, Int> {
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), rows[0].len()]), device)
}

/// Deterministic pseudo-random tokens, `batch` rows of `seq`.
fn some_tokens(batch: usize, seq: usize, vocab: usize) -> Vec<Vec<i64>> {
    (0..batch)
        .map(|b| {
            (0..seq)
                .map(|t| ((b * 7919 + t * 104_729 + t * t * 31) % vocab) as i64)
                .collect()
        })
        .collect()
}

#[test]
fn gpt2_small_has_gpt2s_parameter_count() {
    // 124,439,808: GPT-2 small as published (Hugging Face's `gpt2`, the LM head tied).
    assert_eq!(GptConfig::GPT2_SMALL.params(), 124_439_808);
    let model = GptConfig::GPT2_SMALL
        .init::<Flex>(&Default::default())
        .unwrap();
    assert_eq!(model.trainable_params(), 124_439_808);
    assert_eq!(
        TINY.init::<Flex>(&Default::default())
            .unwrap()
            .trainable_params() as u64,
        TINY.params()
    );
}

#[test]
fn gpt_logits_have_one_row_per_position() {
    let device = Default::default();
    let model = TINY.init::<Flex>(&device).unwrap();
    let logits = model.forward(
        tokens(&some_tokens(3, 20, 16), &device),
        &cx(&Precision::F32),
    );
    assert_eq!(logits.dims(), [3, 20, 16]);
    assert_eq!(logits.dtype(), DType::F32);
}

#[test]
fn bad_gpt_configs_are_refused_with_one_line() {
    let with = |f: fn(&mut GptConfig)| {
        let mut c = TINY;
        f(&mut c);
        c.validate().unwrap_err()
    };
    let cases: [(GptError, &str); 7] = [
        (with(|c| c.n_layer = 0), "n_layer must be in 1..=96, got 0"),
        (with(|c| c.n_head = 0), "n_head must be in 1..=128, got 0"),
        (
            with(|c| c.d_model = 0),
            "d_model must be in 1..=16384, got 0",
        ),
        (
            with(|c| c.d_model = 33),
            "d_model (33) must be divisible by n_head (2)",
        ),
        (
            with(|c| c.seq_len = 0),
            "seq_len must be in 1..=65536, got 0",
        ),
        (
            with(|c| c.vocab_size = 1 << 21),
            "vocab_size must be in 1..=1048576, got 2097152",
        ),
        (
            with(|c| c.n_head = 129),
            "n_head must be in 1..=128, got 129",
        ),
    ];
    for (error, line) in cases {
        assert_eq!(error.to_string(), line);
    }
    assert!(TINY.validate().is_ok());
}

#[test]
fn a_later_token_does_not_change_an_earlier_logit() {
    let device = Default::default();
    for attention in [Attention::Naive, Attention::MemoryEfficient] {
        let model = TINY
            .init::<Flex>(&device)
            .unwrap()
            .with_attention(attention);
        let mut rows = some_tokens(2, 75, 16);
        let run = |rows: &[Vec<i64>]| {
            model
                .forward(tokens(rows, &device), &cx(&Precision::F32))
                .slice([0..2, 0..70])
                .into_data()
                .to_vec::<f32>()
                .unwrap()
        };
        let before = run(&rows);
        for row in &mut rows {
            for t in &mut row[70..] {
                *t = (*t + 5) % 16;
            }
        }
        assert_eq!(before, run(&rows), "{attention:?}");
    }
}

/// The logits and every parameter's gradient, as f32, for the loss Σ logits · r.
fn logits_and_grads(model: &Gpt<B>, r: Tensor<B, 3>) -> (Vec<f32>, Vec<Vec<f32>>) {
    logits_and_grads_in(model, r, Precision::F32)
}

/// [`logits_and_grads`] under `precision`.
fn logits_and_grads_in(
    model: &Gpt<B>,
    r: Tensor<B, 3>,
    precision: Precision,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let device = Default::default();
    let logits = model.forward(tokens(&some_tokens(2, 75, 16), &device), &cx(&precision));
    let grads = (logits.clone() * r).sum().backward();
    let grads = GradientsParams::from_grads(grads, model);
    let logits = logits.inner().into_data().to_vec::<f32>().unwrap();
    (logits, flat(model, &grads))
}

#[test]
fn both_attentions_give_the_same_logits_and_gradients() {
    let naive = TINY.init::<B>(&Default::default()).unwrap();
    let r = Tensor::<B, 3>::random(
        [2, 75, 16],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &Default::default(),
    );
    let (la, ga) = logits_and_grads(&naive, r.clone());
    // Cloned after its first forward has drawn the weights (a clone of a lazy parameter would
    // draw its own).
    let lean = naive.with_attention(Attention::MemoryEfficient);
    let (lb, gb) = logits_and_grads(&lean, r);
    assert!(rel_err(&lb, &la) < 1e-5, "logits {}", rel_err(&lb, &la));
    assert_eq!(ga.len(), gb.len());
    for (i, (a, b)) in ga.iter().zip(&gb).enumerate() {
        let err = rel_err(b, a);
        assert!(err < 1e-4, "parameter {i}: {err}");
    }
}

/// Every parameter's gradient in `grads`, as f32, in visiting order.
fn flat(model: &Gpt<B>, grads: &GradientsParams) -> Vec<Vec<f32>> {
    let mut all = Vec::new();
    struct Collect<'a>(&'a GradientsParams, &'a mut Vec<Vec<f32>>);
    impl<Bk: AutodiffBackend> burn::module::ModuleVisitor<Bk> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<Bk, D>>) {
            let g = self.0.get::<Bk::InnerBackend, D>(param.id).unwrap();
            self.1
                .push(g.cast(DType::F32).into_data().to_vec::<f32>().unwrap());
        }
    }
    model.visit(&mut Collect(grads, &mut all));
    all
}

/// Whole-block checkpointing runs each block again in backward: the same loss and the same
/// gradients as the plain run (the same ops on the same values), both attentions, f32 and
/// f16-mixed, with the loss scaled.
#[test]
fn block_checkpointing_gives_the_same_gradients() {
    let device = Default::default();
    let r = Tensor::<B, 3>::random(
        [2, 75, 16],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &device,
    );
    let input = || tokens::<B>(&some_tokens(2, 75, 16), &device);
    let model = TINY.init::<B>(&device).unwrap();
    for attention in [Attention::Naive, Attention::MemoryEfficient] {
        let model = model.clone().with_attention(attention);
        for p in [Precision::F32, Precision::mixed(DType::F16, true)] {
            let cx = cx(&p);
            let plain_loss = (model.forward(input(), &cx) * r.clone()).sum();
            let plain =
                GradientsParams::from_grads(plain_loss.clone().mul_scalar(8.0).backward(), &model);
            let mut forwards = 0;
            let (loss, recomputed) = model.recomputed_grads(
                input(),
                &cx,
                8.0,
                |logits| (logits * r.clone()).sum(),
                || forwards += 1,
            );
            assert_eq!(forwards, 1);
            assert_eq!(
                loss.into_scalar(),
                plain_loss.into_scalar(),
                "{attention:?} {p:?}: loss"
            );
            let (a, b) = (flat(&model, &plain), flat(&model, &recomputed));
            assert_eq!(a.len(), b.len());
            for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                let err = rel_err(b, a);
                assert!(err < 1e-5, "{attention:?} {p:?}: parameter {i}: {err}");
            }
        }
    }
}

/// The highest live bytes of a forward and backward of `config` at a batch of 4 (weights
/// drawn before counting), plain or with the blocks recomputed.
fn training_peak(config: GptConfig, recompute: bool) -> i64 {
    crate::counting::on_one_thread(|| {
        let device = Default::default();
        let model = config.init::<B>(&device).unwrap();
        let rows = some_tokens(4, config.seq_len, config.vocab_size);
        let cx = cx(&Precision::F32);
        drop(model.forward(tokens::<B>(&rows, &device), &cx));
        let before = crate::counting::live();
        crate::counting::reset_peak();
        let grads = match recompute {
            false => {
                let loss = model.forward(tokens::<B>(&rows, &device), &cx).sum();
                GradientsParams::from_grads(loss.backward(), &model)
            }
            true => {
                let tokens = tokens::<B>(&rows, &device);
                model
                    .recomputed_grads(tokens, &cx, 1.0, |l| l.sum(), || ())
                    .1
            }
        };
        let peak = crate::counting::peak() - before;
        drop(grads);
        peak
    })
}

/// Four blocks that keep only their inputs peak well under the plain run: the kept inputs
/// and one block's activations, against every block's activations.
#[test]
fn block_checkpointing_lowers_the_training_peak() {
    let config = GptConfig {
        n_layer: 4,
        n_head: 4,
        d_model: 64,
        seq_len: 128,
        vocab_size: 256,
        attention: Attention::Naive,
        checkpoint_blocks: false,
    };
    let (plain, recomputed) = (training_peak(config, false), training_peak(config, true));
    let ratio = recomputed as f64 / plain as f64;
    println!("training peak: plain {plain} bytes, blocks recomputed {recomputed} ({ratio:.3})");
    assert!(ratio < 0.5, "plain {plain}, recomputed {recomputed}");
}

#[test]
fn f16_mixed_logits_follow_f32() {
    let device = Default::default();
    let model = TINY.init::<Flex>(&device).unwrap();
    let input = || tokens(&some_tokens(2, 75, 16), &device);
    let f32s = |t: Tensor<Flex, 3>| t.into_data().to_vec::<f32>().unwrap();
    let reference = f32s(model.forward(input(), &cx(&Precision::F32)));
    for attention in [Attention::Naive, Attention::MemoryEfficient] {
        let model = model.clone().with_attention(attention);
        let mixed = model.forward(input(), &cx(&Precision::mixed(DType::F16, true)));
        assert_eq!(mixed.dtype(), DType::F32);
        let err = rel_err(&f32s(mixed), &reference);
        assert!(err < 1e-2, "{attention:?}: {err}");
    }
}

/// Mean next-token cross-entropy of `model` on `rows`.
fn loss<Bk: ModelBackend>(model: &Gpt<Bk>, rows: &[Vec<i64>], p: Precision) -> Tensor<Bk, 1> {
    let device = Default::default();
    let inputs: Vec<Vec<i64>> = rows.iter().map(|r| r[..r.len() - 1].to_vec()).collect();
    let targets: Vec<Vec<i64>> = rows.iter().map(|r| r[1..].to_vec()).collect();
    let logits = model.forward(tokens(&inputs, &device), &cx(&p));
    let [b, s, v] = logits.dims();
    let logp = log_softmax(logits.reshape([b * s, v]), 1);
    let targets = tokens::<Bk>(&targets, &device).reshape([b * s, 1]);
    -logp.gather(1, targets).mean()
}

#[test]
fn a_tiny_gpt_learns_a_pattern_only_attention_predicts() {
    // Each row alternates two tokens, a b a b …, and every a starts two rows, one with
    // b = a + 1 and one with b = a + 5 (mod 16): neither the current token nor its position
    // tells the next one, the token before the current one does. Only the first prediction
    // of a row is a guess (between two): a floor of ln 2 / 32 = 0.02, where a model without
    // working attention stays at ln 2 = 0.69 or above.
    let rows: Vec<Vec<i64>> = (0..32)
        .map(|r| {
            let a = (r % 16) as i64;
            let b = (a + if r < 16 { 1 } else { 5 }) % 16;
            (0..33).map(|t| if t % 2 == 0 { a } else { b }).collect()
        })
        .collect();
    for p in [Precision::F32, Precision::mixed(DType::F16, true)] {
        let config = GptConfig {
            seq_len: 32,
            attention: Attention::MemoryEfficient,
            ..TINY
        };
        let mut model = config.init::<B>(&Default::default()).unwrap();
        let mut optim = AdamWConfig::new().with_weight_decay(0.0).init();
        let first = loss(&model, &rows, p).into_scalar();
        for _ in 0..150 {
            let l = loss(&model, &rows, p);
            let grads = GradientsParams::from_grads(l.backward(), &model);
            model = optim.step(1e-2, model, grads);
        }
        let last = loss(&model.valid(), &rows, p).into_scalar();
        assert!(first > 2.0, "{p:?}: untrained loss {first}");
        assert!(
            last < 0.3,
            "{p:?}: loss {first} → {last} (ln 16 = 2.77, ln 2 = 0.69)"
        );
    }
}

/// Bytes the graph keeps after a forward of `config` on a batch of 4, counted by the
/// allocator (the logits dropped: what is left is what backward will read).
fn kept_by_forward(config: GptConfig, precision: Precision) -> i64 {
    crate::counting::on_one_thread(|| {
        let device = Default::default();
        let model = config.init::<B>(&device).unwrap();
        let rows = some_tokens(4, config.seq_len, config.vocab_size);
        let cx = cx(&precision);
        // Parameters draw their values at first use: a first forward draws them all.
        drop(model.forward(tokens::<B>(&rows, &device), &cx));
        let before = crate::counting::live();
        let logits = model.forward(tokens::<B>(&rows, &device), &cx);
        let kept = crate::counting::live() - before;
        kept - (logits.dims().iter().product::<usize>() * logits.dtype().size()) as i64
    })
}

/// What the plan says one block keeps at a batch of 4 on the CPU: its ops' saved tensors and,
/// under mixed precision, the half copies of its weights (the estimate's model state).
fn planned_per_block(config: GptConfig, precision: Precision) -> i64 {
    use oomlab_engine::{Family, Sizes};
    let half_copies = precision.compute != DType::F32;
    let sizes = Sizes {
        batch: 4,
        compute: precision.compute.size() as u64,
        norm: precision.batch_norm.size() as u64,
        index: 8,
        family: Family::Cpu,
        bf16: false,
        weight_copies: if half_copies { 2 } else { 0 },
    };
    let one = GptConfig {
        n_layer: 1,
        ..config
    };
    let two = GptConfig {
        n_layer: 2,
        ..config
    };
    let saved = |c: GptConfig| -> i64 {
        let plan = c.plan();
        let copies = if half_copies {
            2 * plan.cast_weights()
        } else {
            0
        };
        let saved: u64 = plan.footprints(&sizes).iter().map(|f| f.saved).sum();
        (saved + copies) as i64
    };
    saved(two) - saved(one)
}

#[test]
fn each_block_keeps_what_the_plan_says() {
    let base = GptConfig {
        n_layer: 1,
        n_head: 4,
        d_model: 64,
        seq_len: 128,
        vocab_size: 256,
        attention: Attention::Naive,
        checkpoint_blocks: false,
    };
    for attention in [Attention::Naive, Attention::MemoryEfficient] {
        for precision in [Precision::F32, Precision::mixed(DType::F16, true)] {
            let config = GptConfig { attention, ..base };
            let one = kept_by_forward(
                GptConfig {
                    n_layer: 1,
                    ..config
                },
                precision,
            );
            let two = kept_by_forward(
                GptConfig {
                    n_layer: 2,
                    ..config
                },
                precision,
            );
            let measured = two - one;
            let planned = planned_per_block(config, precision);
            println!("{attention:?} {precision:?}: measured {measured}, planned {planned}");
            let err = (planned - measured) as f64 / measured as f64;
            assert!(
                err.abs() < 0.03,
                "{attention:?}, {precision:?}: a block keeps {measured} bytes, the plan says {planned}"
            );
        }
    }
}
