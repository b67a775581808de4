//! A GPT-2-style language model: GPT-2's architecture exactly (without dropout), at any size.
//!
//! ```text
//! tokens [B,T] → token embedding + position embedding → n_layer × block → LayerNorm
//!              → logits = x · token_embeddingᵀ (the head is tied to the embedding) [B,T,V]
//! block: x + attn(LN₁(x)), then x + MLP(LN₂(x))
//!        attn: Linear d→3d → q, k, v per head → causal attention → Linear d→d
//!        MLP:  Linear d→4d → GELU (tanh approximation) → Linear 4d→d
//! ```
//!
//! Precision, as autocast applies it: the linear layers, the attention's matmuls and the GELU
//! in the policy's compute dtype; the residual stream and the LayerNorms in its normalisation
//! dtype ([`Precision::batch_norm`](oomlab_engine::Precision), f32 under mixed precision); the
//! scores and the softmax in f32 (both attentions, see [`oomlab_engine::attention`]); the logits
//! in the output dtype. Weights are drawn as GPT-2 draws them: N(0, 0.02), the projections into
//! the residual stream N(0, 0.02/√(2·n_layer)), biases 0, LayerNorm 1 and 0.

use burn::module::{ModuleVisitor, Param};
use burn::nn::{
    Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::activation::gelu_approximate;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::TensorPrimitive;

use std::sync::OnceLock;

use oomlab_engine::{attention, cast, mark, Boundary, Layer, ModelBackend, Plan, RunContext};

use crate::layers::linear;

/// Which attention the blocks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    /// Composed from tensor ops; keeps the `batch × heads × seq × seq` probabilities.
    Naive,
    /// The engine's memory-efficient op: keeps the output and one log-sum-exp per row.
    MemoryEfficient,
}

/// Largest `n_layer`.
pub const MAX_LAYERS: usize = 96;
/// Largest `n_head`.
pub const MAX_HEADS: usize = 128;
/// Largest `d_model`.
pub const MAX_D_MODEL: usize = 16_384;
/// Largest `seq_len`.
pub const MAX_SEQ_LEN: usize = 65_536;
/// Largest `vocab_size`.
pub const MAX_VOCAB: usize = 1 << 20;

/// A GPT config `init` refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GptError {
    /// `n_layer` outside 1..=[`MAX_LAYERS`].
    #[error("n_layer must be in 1..={MAX_LAYERS}, got {0}")]
    Layers(usize),
    /// `n_head` outside 1..=[`MAX_HEADS`].
    #[error("n_head must be in 1..={MAX_HEADS}, got {0}")]
    Heads(usize),
    /// `d_model` outside 1..=[`MAX_D_MODEL`].
    #[error("d_model must be in 1..={MAX_D_MODEL}, got {0}")]
    DModel(usize),
    /// `d_model` not a multiple of `n_head`.
    #[error("d_model ({d_model}) must be divisible by n_head ({n_head})")]
    Indivisible {
        /// The model width.
        d_model: usize,
        /// The heads.
        n_head: usize,
    },
    /// `seq_len` outside 1..=[`MAX_SEQ_LEN`].
    #[error("seq_len must be in 1..={MAX_SEQ_LEN}, got {0}")]
    SeqLen(usize),
    /// `vocab_size` outside 1..=[`MAX_VOCAB`].
    #[error("vocab_size must be in 1..={MAX_VOCAB}, got {0}")]
    Vocab(usize),
}

/// Configuration of [`Gpt`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block.
    pub n_head: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Longest sequence (the position embedding's rows).
    pub seq_len: usize,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The attention the blocks run.
    pub attention: Attention,
    /// Whole-block checkpointing: each block keeps only its input and is recomputed in
    /// backward ([`Gpt::recomputed_grads`]; [`Gpt::forward`] is the same either way).
    pub checkpoint_blocks: bool,
}

impl GptConfig {
    /// GPT-2 small: 12 layers, 12 heads, 768 wide, 1024 positions, 50,257 tokens.
    pub const GPT2_SMALL: Self = Self {
        n_layer: 12,
        n_head: 12,
        d_model: 768,
        seq_len: 1024,
        vocab_size: 50_257,
        attention: Attention::Naive,
        checkpoint_blocks: false,
    };

    /// The config, if every key is in bounds.
    pub fn validate(&self) -> Result<(), GptError> {
        let within = |v: usize, max: usize| (1..=max).contains(&v);
        if !within(self.n_layer, MAX_LAYERS) {
            return Err(GptError::Layers(self.n_layer));
        }
        if !within(self.n_head, MAX_HEADS) {
            return Err(GptError::Heads(self.n_head));
        }
        if !within(self.d_model, MAX_D_MODEL) {
            return Err(GptError::DModel(self.d_model));
        }
        if !self.d_model.is_multiple_of(self.n_head) {
            return Err(GptError::Indivisible {
                d_model: self.d_model,
                n_head: self.n_head,
            });
        }
        if !within(self.seq_len, MAX_SEQ_LEN) {
            return Err(GptError::SeqLen(self.seq_len));
        }
        if !within(self.vocab_size, MAX_VOCAB) {
            return Err(GptError::Vocab(self.vocab_size));
        }
        Ok(())
    }

    /// Trainable parameters, from the sizes alone (the head shares the token embedding).
    pub fn params(&self) -> u64 {
        let (d, l) = (self.d_model as u64, self.n_layer as u64);
        let layer_norm = 2 * d;
        let linear = |i: u64, o: u64| i * o + o;
        let block =
            2 * layer_norm + linear(d, 3 * d) + linear(d, d) + linear(d, 4 * d) + linear(4 * d, d);
        (self.vocab_size as u64 + self.seq_len as u64) * d + l * block + layer_norm
    }

    /// The forward pass as the memory estimate reads it: one sample is one sequence of
    /// `seq_len` tokens. Each block's ops are counted in lines shared by all blocks.
    pub fn plan(&self) -> Plan {
        let (t, d, v) = (
            self.seq_len as u64,
            self.d_model as u64,
            self.vocab_size as u64,
        );
        let linear = |i: u64, o: u64| Layer::Linear {
            input: t * i,
            output: t * o,
            weight: i * o,
            bias: o,
        };
        let layer_norm = Layer::LayerNorm { rows: t, width: d };
        let mut plan = Plan::default();
        let embeddings = "embeddings (keep the token ids)";
        plan.push(
            embeddings,
            Layer::Embedding {
                tokens: t,
                width: d,
                rows: v,
            },
        );
        plan.push(
            embeddings,
            Layer::Embedding {
                tokens: 0,
                width: d,
                rows: t,
            },
        );
        plan.push(embeddings, Layer::Residual { elements: t * d });
        let norms = "LayerNorms (3 tensors each, in the normalisation dtype)";
        let inputs = "linear layers (keep their inputs)";
        let attention = match self.attention {
            Attention::Naive => "attention, naive (q, k, v and the seq × seq probabilities)",
            Attention::MemoryEfficient => {
                "attention, memory-efficient (q, k, v, the output, a log-sum-exp per row)"
            }
        };
        let gelu = "GELU, tanh approximation (3 tensors of 4·d per token)";
        let residual = "residual adds (keep nothing)";
        let block = [
            (norms, layer_norm.clone()),
            (inputs, linear(d, 3 * d)),
            (
                attention,
                Layer::Attention {
                    seq: t,
                    width: d,
                    heads: self.n_head as u64,
                    memory_efficient: self.attention == Attention::MemoryEfficient,
                },
            ),
            (inputs, linear(d, d)),
            (residual, Layer::Residual { elements: t * d }),
            (norms, layer_norm.clone()),
            (inputs, linear(d, 4 * d)),
            (
                gelu,
                Layer::Gelu {
                    elements: t * 4 * d,
                },
            ),
            (inputs, linear(4 * d, d)),
            (residual, Layer::Residual { elements: t * d }),
        ];
        for _ in 0..self.n_layer {
            if self.checkpoint_blocks {
                plan.push(
                    "blocks, checkpointed (each keeps its input; recomputed in backward)",
                    Layer::Recomputed {
                        layers: block.iter().map(|(_, l)| l.clone()).collect(),
                        input: t * d,
                    },
                );
            } else {
                for (group, layer) in &block {
                    plan.push(*group, layer.clone());
                }
            }
        }
        plan.push(norms, layer_norm);
        plan.push(
            "head, tied to the token embedding (keeps its input)",
            Layer::TiedHead {
                input: t * d,
                output: t * v,
                weight: v * d,
            },
        );
        plan
    }

    /// The model on `device`, weights drawn as GPT-2 draws them.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Gpt<B>, GptError> {
        self.validate()?;
        let d = self.d_model;
        let normal = |std: f64| Initializer::Normal { mean: 0.0, std };
        let residual = 0.02 / (2.0 * self.n_layer as f64).sqrt();
        let linear = |i: usize, o: usize, std: f64| {
            let mut layer = LinearConfig::new(i, o)
                .with_initializer(normal(std))
                .init(device);
            layer.bias = Some(Initializer::Zeros.init([o], device));
            layer
        };
        let embedding = |n: usize| {
            EmbeddingConfig::new(n, d)
                .with_initializer(normal(0.02))
                .init(device)
        };
        let layer_norm = || LayerNormConfig::new(d).init(device);
        let blocks = (0..self.n_layer)
            .map(|_| Block {
                ln_1: layer_norm(),
                qkv: linear(d, 3 * d, 0.02),
                attn_proj: linear(d, d, residual),
                ln_2: layer_norm(),
                fc: linear(d, 4 * d, 0.02),
                mlp_proj: linear(4 * d, d, residual),
            })
            .collect();
        Ok(Gpt {
            token_embedding: embedding(self.vocab_size),
            position_embedding: embedding(self.seq_len),
            blocks,
            ln_f: layer_norm(),
            n_head: self.n_head,
            memory_efficient: self.attention == Attention::MemoryEfficient,
            checkpoint_blocks: self.checkpoint_blocks,
        })
    }
}

/// One pre-LayerNorm transformer block.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    ln_1: LayerNorm<B>,
    qkv: Linear<B>,
    attn_proj: Linear<B>,
    ln_2: LayerNorm<B>,
    fc: Linear<B>,
    mlp_proj: Linear<B>,
}

/// GPT-2's architecture; see the module's text.
#[derive(Module, Debug)]
pub struct Gpt<B: Backend> {
    token_embedding: Embedding<B>,
    position_embedding: Embedding<B>,
    blocks: Vec<Block<B>>,
    ln_f: LayerNorm<B>,
    n_head: usize,
    memory_efficient: bool,
    checkpoint_blocks: bool,
}

impl<B: Backend> Gpt<B> {
    /// Trainable parameters (the model has no buffers).
    pub fn trainable_params(&self) -> usize {
        self.num_params()
    }

    /// The same weights, running `attention`.
    pub fn with_attention(self, attention: Attention) -> Self {
        Self {
            memory_efficient: attention == Attention::MemoryEfficient,
            ..self
        }
    }

    /// The same weights, with whole-block checkpointing on or off.
    pub fn with_checkpoint_blocks(self, on: bool) -> Self {
        Self {
            checkpoint_blocks: on,
            ..self
        }
    }

    /// Whether training recomputes each block in backward ([`Gpt::recomputed_grads`]).
    pub fn checkpoints_blocks(&self) -> bool {
        self.checkpoint_blocks
    }
}

impl<B: ModelBackend> Gpt<B> {
    /// Next-token logits, `[batch, seq, vocab]` in the policy's output dtype, of `tokens`
    /// (`[batch, seq]`).
    ///
    /// # Panics
    /// When `seq` is over the config's `seq_len` (the trainer's config check refuses that).
    pub fn forward(&self, tokens: Tensor<B, 2, Int>, cx: &RunContext) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let positions_held = self.position_embedding.weight.dims()[0];
        assert!(
            seq <= positions_held,
            "{seq} tokens, {positions_held} positions"
        );
        let x = mark(self.embed(tokens, cx), Boundary("embed"), cx);
        let (dims, memory_efficient) = ([batch, seq, self.n_head], self.memory_efficient);
        let x = self.blocks.iter().enumerate().fold(x, |x, (i, block)| {
            let x = block.forward(x, dims, memory_efficient, cx);
            mark(x, Boundary(block_name(i)), cx)
        });
        self.head(x, [batch, seq], cx)
    }

    /// The residual stream entering the first block, `[batch · seq, d_model]` in the policy's
    /// normalisation dtype: token plus position embeddings.
    fn embed(&self, tokens: Tensor<B, 2, Int>, cx: &RunContext) -> Tensor<B, 2> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device).reshape([1, seq]);
        let x = self.token_embedding.forward(tokens) + self.position_embedding.forward(positions);
        cx.precision
            .batch_norm(x)
            .reshape([batch * seq, self.d_model()])
    }

    /// The logits, `[batch, seq, vocab]`, of the last block's output `x`: the final LayerNorm
    /// and the head tied to the token embedding.
    fn head(&self, x: Tensor<B, 2>, [batch, seq]: [usize; 2], cx: &RunContext) -> Tensor<B, 3> {
        let p = &cx.precision;
        let x = layer_norm(cx, &self.ln_f, x);
        let head = p.compute(self.token_embedding.weight.val()).transpose();
        let vocab = head.dims()[1];
        let logits = p.compute(x).matmul(head);
        mark(
            p.output(logits).reshape([batch, seq, vocab]),
            Boundary("head"),
            cx,
        )
    }

    fn d_model(&self) -> usize {
        self.ln_f.gamma.dims()[0]
    }
}

impl<B> Gpt<B>
where
    B: AutodiffBackend + ModelBackend,
    B::InnerBackend: ModelBackend,
{
    /// Whole-block checkpointing (`torch.utils.checkpoint` on every block): `loss` of the
    /// logits of `tokens`, and the gradients of `scale · loss`, keeping only each block's
    /// input between the forward and the backward of that block.
    ///
    /// Burn's autodiff cannot run a backward inside another (a nested backward waits on the
    /// outer graph's lock), so the stages run one after another, each its own graph: the blocks
    /// forward without autodiff (their inputs kept); the head, tracked, with `loss` and its
    /// backward, which gives the last block's output gradient; then each block from the last,
    /// run again tracked from its kept input, and backpropagated with its output's gradient
    /// (`Σ out · grad`), which gives its parameters' gradients and its input's; last the
    /// embeddings. The same ops on the same values as the plain run: the same gradients (the
    /// shared token embedding's two parts are added in another order). `after_forward` runs when
    /// the loss exists, before any backward.
    pub fn recomputed_grads(
        &self,
        tokens: Tensor<B, 2, Int>,
        cx: &RunContext,
        scale: f64,
        loss: impl FnOnce(Tensor<B, 3>) -> Tensor<B, 1>,
        after_forward: impl FnOnce(),
    ) -> (Tensor<B, 1>, GradientsParams) {
        let [batch, seq] = tokens.dims();
        let (dims, memory_efficient) = ([batch, seq, self.n_head], self.memory_efficient);
        let x0 = mark(self.embed(tokens, cx), Boundary("embed"), cx);
        let mut inputs = Vec::with_capacity(self.blocks.len());
        // Untracked (detached parameters and input): nothing is kept for a backward, and the
        // ops are the tracked run's, value for value. The boundaries report the crossings (an
        // untracked boundary is not in any graph).
        let mut x = x0.clone().detach();
        for (i, block) in self.blocks.iter().enumerate() {
            inputs.push(x.clone().inner());
            x = block
                .clone()
                .no_grad()
                .forward(x, dims, memory_efficient, cx);
            x = mark(x, Boundary(block_name(i)), cx);
        }
        let top = x.require_grad();
        let value = loss(self.head(top.clone(), [batch, seq], cx));
        after_forward();
        let stage = value.clone().mul_scalar(scale).backward();
        let mut grad = input_grad(&top, &stage);
        let mut grads = GradientsParams::from_grads(stage, self);
        for (i, (block, input)) in self.blocks.iter().zip(inputs).enumerate().rev() {
            let x = Tensor::<B, 2>::from_inner(input).require_grad();
            // The recompute crosses the block's end forward again, then its backward does.
            let out = block.forward(x.clone(), dims, memory_efficient, cx);
            let out = mark(out, Boundary(block_name(i)), cx);
            let stage = (out * Tensor::from_inner(grad)).sum().backward();
            grad = input_grad(&x, &stage);
            add_into(&mut grads, GradientsParams::from_grads(stage, block), block);
        }
        let stage = (x0 * Tensor::from_inner(grad)).sum().backward();
        add_into(&mut grads, GradientsParams::from_grads(stage, self), self);
        (value, grads)
    }
}

/// `block1` … `block{MAX_LAYERS}`: the boundary after block `i` (from 0), as the CNNs name
/// theirs. Made once and kept for the program's life, as a boundary's name is.
fn block_name(i: usize) -> &'static str {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| {
        (1..=MAX_LAYERS)
            .map(|n| &*Box::leak(format!("block{n}").into_boxed_str()))
            .collect()
    })[i]
}

/// The gradient a stage's backward gave its input leaf `x` (zeros if none reached it).
fn input_grad<B: AutodiffBackend>(
    x: &Tensor<B, 2>,
    grads: &B::Gradients,
) -> Tensor<B::InnerBackend, 2> {
    x.grad(grads).unwrap_or_else(|| x.zeros_like().inner())
}

/// Adds every gradient of `module`'s parameters in `more` into `into`.
fn add_into<B: AutodiffBackend, M: Module<B>>(
    into: &mut GradientsParams,
    mut more: GradientsParams,
    module: &M,
) {
    struct Add<'a>(&'a mut GradientsParams, &'a mut GradientsParams);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Add<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(more) = self.1.remove::<B::InnerBackend, D>(param.id) else {
                return;
            };
            let sum = match self.0.remove::<B::InnerBackend, D>(param.id) {
                Some(have) => have + more,
                None => more,
            };
            self.0.register::<B::InnerBackend, D>(param.id, sum);
        }
    }
    module.visit(&mut Add(into, &mut more));
}

impl<B: ModelBackend> Block<B> {
    /// `x`: the residual stream, `[batch · seq, d_model]`.
    fn forward(
        &self,
        x: Tensor<B, 2>,
        [batch, seq, heads]: [usize; 3],
        memory_efficient: bool,
        cx: &RunContext,
    ) -> Tensor<B, 2> {
        let stream = x.dtype();
        let d = x.dims()[1];
        // [batch·seq, 3d] → three [batch, heads, seq, d/heads].
        let qkv = linear(cx, &self.qkv, layer_norm(cx, &self.ln_1, x.clone()))
            .reshape([batch, seq, 3, heads, d / heads])
            .permute([2, 0, 3, 1, 4]);
        let [q, k, v] = [0, 1, 2].map(|i| {
            qkv.clone()
                .narrow(0, i, 1)
                .reshape([batch, heads, seq, d / heads])
        });
        let y = if memory_efficient {
            let prim = |t: Tensor<B, 4>| t.into_primitive().tensor();
            Tensor::from_primitive(TensorPrimitive::Float(B::memory_efficient_attention(
                prim(q),
                prim(k),
                prim(v),
            )))
        } else {
            attention::naive(q, k, v)
        };
        let y = y.swap_dims(1, 2).reshape([batch * seq, d]);
        let x = x + cast(linear(cx, &self.attn_proj, y), stream);
        let h = gelu_approximate(linear(cx, &self.fc, layer_norm(cx, &self.ln_2, x.clone())));
        x + cast(linear(cx, &self.mlp_proj, h), stream)
    }
}

/// LayerNorm over the last axis, in the policy's normalisation dtype, as Burn's (biased
/// variance, ε inside the root).
fn layer_norm<B: Backend>(cx: &RunContext, ln: &LayerNorm<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let p = &cx.precision;
    let x = p.batch_norm(x);
    let (var, mean) = x.clone().var_mean_bias(1);
    let x = (x - mean) / (var + LAYER_NORM_EPSILON).sqrt();
    let gamma = p.batch_norm(ln.gamma.val()).unsqueeze::<2>();
    let beta = ln
        .beta
        .as_ref()
        .map(|b| p.batch_norm(b.val()).unsqueeze::<2>());
    match beta {
        Some(beta) => x * gamma + beta,
        None => x * gamma,
    }
}

/// GPT-2's LayerNorm ε (and Burn's default).
const LAYER_NORM_EPSILON: f64 = 1e-5;
