//! Layer calls under a run's [`RunContext`]: its precision policy decides every dtype.
//!
//! Burn's nn modules use their f32 weights directly, and there is no implicit dtype promotion,
//! so a policy-aware layer casts the input *and* `weight.val()` and calls a functional op: the
//! engine's ([`ModelBackend`]: conv, ReLU, pooling, batch norm, the fused blocks) or Burn's
//! (`burn::tensor::module`: linear, average pooling). The modules themselves stay plain
//! `burn::nn` types, so records and optimizers see ordinary f32 parameters.

use burn::module::{Module, RunningState};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, PaddingConfig2d};
use burn::tensor::module;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{backend::Backend, Tensor, TensorMetadata, TensorPrimitive};

use oomlab_engine::{
    cast, BatchNormOutput, Boundary, Layer, ModelBackend, Plan, PoolWindow, RunContext,
};

/// A 2D convolution computed in the policy's compute dtype, as the engine's composed conv op
/// ([`conv2d`](oomlab_engine::conv2d)): what Burn's conv keeps, the backend's fast kernels.
///
/// # Shapes
/// `[batch, c_in, h, w]` → `[batch, c_out, h_out, w_out]`
pub fn conv2d<B: ModelBackend>(
    cx: &RunContext,
    layer: &Conv2d<B>,
    x: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let p = &cx.precision;
    let prim = |t: Tensor<B, 4>| t.into_primitive().tensor();
    let out = B::conv2d_layer(
        prim(p.compute(x)),
        prim(p.compute(layer.weight.val())),
        layer
            .bias
            .as_ref()
            .map(|b| p.compute(b.val()).into_primitive().tensor()),
        conv_options(layer),
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The functional options of a conv module.
fn conv_options<B: Backend>(layer: &Conv2d<B>) -> ConvOptions<2> {
    let padding = match layer.padding {
        PaddingConfig2d::Explicit(top, left, bottom, right) if top == bottom && left == right => {
            [top, left]
        }
        PaddingConfig2d::Valid => [0, 0],
        // Our models only build symmetric explicit padding.
        ref other => unreachable!("unsupported conv padding {other:?}"),
    };
    ConvOptions::new(layer.stride, padding, layer.dilation, layer.groups)
}

/// Conv → ReLU → `k`×`k` max-pool as one op ([`conv_relu_pool`](oomlab_engine::conv_relu_pool)):
/// autodiff keeps the input, the pooled output and one byte per output instead of two
/// full-resolution tensors and the argmax. Computed in the policy's compute dtype; a conv
/// without bias, or an output not divisible into windows, takes the composed ops.
///
/// # Shapes
/// `[batch, c_in, h, w]` → `[batch, c_out, h_out / k, w_out / k]`
pub fn conv_relu_pool<B: ModelBackend>(
    cx: &RunContext,
    layer: &Conv2d<B>,
    x: Tensor<B, 4>,
    k: usize,
) -> Tensor<B, 4> {
    let p = &cx.precision;
    let options = conv_options(layer);
    let [_, _, h, w] = x.dims();
    // The conv's output side along axis `i`, if the kernel fits at all.
    let side = |size: usize, i: usize| {
        let span = options.dilation[i] * (layer.kernel_size[i] - 1) + 1;
        (size + 2 * options.padding[i])
            .checked_sub(span)
            .map(|s| s / options.stride[i] + 1)
    };
    // Whole windows only, and k² positions that fit in the byte that records the winner.
    let windows = matches!((side(h, 0), side(w, 1)),
        (Some(a), Some(b)) if (1..=16).contains(&k) && a % k == 0 && b % k == 0);
    match (&layer.bias, windows) {
        (Some(bias), true) => {
            let prim = |t: Tensor<B, 4>| t.into_primitive().tensor();
            // The f32 weights go in as they are: the op casts them, keeping no half copy.
            let out = B::conv_relu_pool(
                prim(p.compute(x)),
                prim(layer.weight.val()),
                bias.val().into_primitive().tensor(),
                options,
                k,
                cx,
            );
            Tensor::from_primitive(TensorPrimitive::Float(out))
        }
        _ => max_pool2d(cx, relu(conv2d(cx, layer, x)), k, Boundary("pool (inside)")),
    }
}

/// A linear layer computed in the policy's compute dtype.
pub fn linear<B: Backend>(cx: &RunContext, layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let p = &cx.precision;
    module::linear(
        p.compute(x),
        p.compute(layer.weight.val()),
        layer.bias.as_ref().map(|b| p.compute(b.val())),
    )
}

/// A linear layer computed in the policy's compute dtype as one op
/// ([`sliced_linear`](oomlab_engine::sliced_linear)): the f32 weight is cast inside it, so no half
/// copy is kept, and backward makes the input gradient a slice of rows at a time. Same
/// function as [`linear`]; a layer without bias takes [`linear`].
///
/// # Shapes
/// `[batch, in]` → `[batch, out]`
pub fn linear_fused<B: ModelBackend>(
    cx: &RunContext,
    layer: &Linear<B>,
    x: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let p = &cx.precision;
    let Some(bias) = &layer.bias else {
        return linear(cx, layer, x);
    };
    let out = B::sliced_linear(
        p.compute(x).into_primitive().tensor(),
        layer.weight.val().into_primitive().tensor(),
        bias.val().into_primitive().tensor(),
        cx,
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// A model's classifier: [`linear_fused`] with `fuse`, else [`linear`].
///
/// # Shapes
/// `[batch, in]` → `[batch, out]`
pub fn classifier<B: ModelBackend>(
    cx: &RunContext,
    layer: &Linear<B>,
    x: Tensor<B, 2>,
    fuse: bool,
) -> Tensor<B, 2> {
    match fuse {
        true => linear_fused(cx, layer, x),
        false => linear(cx, layer, x),
    }
}

/// Batch norm computed in the policy's batch-norm dtype; the result returns in the dtype it
/// came in, so the next layer sees what it expects.
///
/// Under autodiff (training) it normalises with the batch statistics through
/// [`ModelBackend::batch_norm_train`], which saves only its input and per-channel vectors,
/// and updates the running averages as PyTorch's `BatchNorm2d` does: momentum, and the
/// *unbiased* batch variance (× n/(n−1), n = batch × height × width) for the running variance,
/// while the batch itself is normalised with the biased one. (Burn's own `BatchNorm` keeps the
/// biased variance; a model trained here evaluates as it would in PyTorch.)
/// Without autodiff (evaluation) it normalises with the running averages.
pub fn batch_norm<B: ModelBackend>(
    cx: &RunContext,
    layer: &BatchNorm<B>,
    x: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let p = &cx.precision;
    let work = p.batch_norm;
    if !B::ad_enabled(&x.device()) {
        let prim = |t: Tensor<B, 1>| t.into_primitive().tensor();
        let params = [
            prim(layer.gamma.val()),
            prim(layer.beta.val()),
            prim(layer.running_mean.value()),
            prim(layer.running_var.value()),
        ];
        let y = B::batch_norm_eval(x.into_primitive().tensor(), params, work, layer.epsilon);
        return Tensor::from_primitive(TensorPrimitive::Float(y));
    }
    let [n, _, h, w] = x.dims();
    let out = B::batch_norm_train(
        x.into_primitive().tensor(),
        layer.gamma.val().into_primitive().tensor(),
        layer.beta.val().into_primitive().tensor(),
        work,
        layer.epsilon,
        cx,
    );
    update_running(layer, out, n * h * w)
}

/// Conv (no bias) → batch norm → ReLU. Under autodiff, one op
/// ([`conv_bn_relu`](oomlab_engine::conv_bn_relu)) that keeps the conv input, the batch-norm input
/// and per-channel statistics instead of three tensors; running averages as in
/// [`batch_norm`]. Without autodiff, or for a conv with a bias, the composed layers.
pub fn conv_bn_relu<B: ModelBackend>(
    cx: &RunContext,
    conv: &Conv2d<B>,
    bn: &BatchNorm<B>,
    x: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let p = &cx.precision;
    if !B::ad_enabled(&x.device()) || conv.bias.is_some() {
        return relu(batch_norm(cx, bn, conv2d(cx, conv, x)));
    }
    let prim = |t: Tensor<B, 4>| t.into_primitive().tensor();
    let out = B::conv_bn_relu_train(
        prim(p.compute(x)),
        prim(conv.weight.val()), // cast inside the op, no half copy kept
        bn.gamma.val().into_primitive().tensor(),
        bn.beta.val().into_primitive().tensor(),
        conv_options(conv),
        p.batch_norm,
        bn.epsilon,
        cx,
    );
    let [n, _, h, w] = out.output.shape().dims();
    update_running(bn, out, n * h * w)
}

/// Conv (no bias) → batch norm, with the ReLU after ([`forward`](Self::forward)) or without
/// ([`forward_no_relu`](Self::forward_no_relu), for a branch that a residual addition reads).
/// The batch norm's shift makes a conv bias redundant.
#[derive(Module, Debug)]
pub struct ConvBn<B: Backend> {
    conv: Conv2d<B>,
    bn: BatchNorm<B>,
    fuse: bool,
}

impl<B: Backend> ConvBn<B> {
    /// A `kernel`×`kernel` conv padded by `kernel / 2`, composed (see [`fused`](Self::fused)).
    pub fn new(
        c_in: usize,
        c_out: usize,
        kernel: usize,
        stride: usize,
        groups: usize,
        device: &B::Device,
    ) -> Self {
        let pad = kernel / 2;
        Self {
            conv: Conv2dConfig::new([c_in, c_out], [kernel, kernel])
                .with_stride([stride, stride])
                .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
                .with_groups(groups)
                .with_bias(false)
                .init(device),
            bn: BatchNormConfig::new(c_out).init(device),
            fuse: false,
        }
    }

    /// With `fuse`, conv → BN → ReLU runs as one op ([`conv_bn_relu`]).
    pub fn fused(self, fuse: bool) -> Self {
        Self { fuse, ..self }
    }

    /// Elements of the batch norm's running mean and variance: state, not parameters.
    pub fn buffers(&self) -> usize {
        2 * self.bn.running_mean.value().dims()[0]
    }
}

impl<B: ModelBackend> ConvBn<B> {
    /// Conv → BN → ReLU: one op when fused.
    ///
    /// # Shapes
    /// `[batch, c_in, h, w]` → `[batch, c_out, h / stride, w / stride]`
    pub fn forward(&self, x: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 4> {
        if self.fuse {
            return conv_bn_relu(cx, &self.conv, &self.bn, x);
        }
        relu(self.forward_no_relu(x, cx))
    }

    /// Conv → BN: the engine's batch norm op, fused or not (no ReLU follows to fuse).
    ///
    /// # Shapes
    /// `[batch, c_in, h, w]` → `[batch, c_out, h / stride, w / stride]`
    pub fn forward_no_relu(&self, x: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 4> {
        let x = conv2d(cx, &self.conv, x);
        batch_norm(cx, &self.bn, x)
    }
}

/// Folds a training batch's statistics into `layer`'s running averages, as PyTorch's
/// `BatchNorm2d` does: momentum, and the *unbiased* batch variance (× n/(n−1), n = batch ×
/// height × width, the `count`), while the batch itself was normalised with the biased one.
/// Returns the output.
fn update_running<B: Backend>(
    layer: &BatchNorm<B>,
    out: BatchNormOutput<B>,
    count: usize,
) -> Tensor<B, 4> {
    let count = count as f64;
    let float = |t| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t));
    let m = layer.momentum;
    // One value per channel has no spread to correct (PyTorch refuses it in training).
    let unbiased = if count > 1.0 {
        count / (count - 1.0)
    } else {
        1.0
    };
    let update = |running: &RunningState<Tensor<B, 1>>, batch: Tensor<B, 1>| {
        let old = running.value_sync();
        let batch = cast(batch.detach(), old.dtype());
        running.update((old.mul_scalar(1.0 - m) + batch.mul_scalar(m)).detach());
    };
    update(&layer.running_mean, float(out.mean));
    update(&layer.running_var, float(out.var).mul_scalar(unbiased));
    Tensor::from_primitive(TensorPrimitive::Float(out.output))
}

/// ReLU in whatever dtype its input has, as the engine's ReLU op ([`relu`](oomlab_engine::relu)):
/// what Burn's ReLU keeps, the backend's fast kernels.
pub fn relu<B: ModelBackend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let out = B::relu_layer(x.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Non-overlapping max pooling with a square window. `at` names the moment inside its
/// backward when the input's and the output's gradients both exist (the op's peak), for the
/// run's memory probe ([`PoolWindow`]'s op).
pub fn max_pool2d<B: ModelBackend>(
    cx: &RunContext,
    x: Tensor<B, 4>,
    size: usize,
    at: Boundary,
) -> Tensor<B, 4> {
    max_pool2d_padded(cx, x, size, size, 0, at)
}

/// Max pooling with a square `size` window moved by `stride` over an input padded by
/// `padding` on every side; the padding never wins a window (torchvision's ImageNet stem:
/// 3, 2, 1). `at` as for [`max_pool2d`].
///
/// # Shapes
/// `[batch, c, h, w]` → `[batch, c, (h + 2·padding − size) / stride + 1, …]`
pub fn max_pool2d_padded<B: ModelBackend>(
    cx: &RunContext,
    x: Tensor<B, 4>,
    size: usize,
    stride: usize,
    padding: usize,
    at: Boundary,
) -> Tensor<B, 4> {
    let window = PoolWindow {
        size: [size; 2],
        stride: [stride; 2],
        padding: [padding; 2],
    };
    let out = B::max_pool(x.into_primitive().tensor(), window, at, cx);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Global average pooling to `[batch, channels]`.
pub fn global_avg_pool<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 2> {
    let [batch, channels, _, _] = x.dims();
    module::adaptive_avg_pool2d(x, [1, 1]).reshape([batch, channels])
}

/// Conv (no bias) → BN, then a ReLU when `relu`, into `plan` as [`ConvBn`] runs them: one
/// fused op for conv → BN → ReLU when `fuse`, else the composed ops. `[input, output, weight,
/// channels]` in values per image and elements.
pub fn plan_conv_bn(plan: &mut Plan, group: &str, sizes: [u64; 4], fuse: bool, relu: bool) {
    let [input, output, weight, channels] = sizes;
    if fuse && relu {
        let layer = Layer::ConvBnRelu {
            input,
            output,
            weight,
            channels,
        };
        plan.push(group, layer);
        return;
    }
    let conv = Layer::Conv {
        input,
        output,
        weight,
        bias: 0,
    };
    plan.push(group, conv);
    let bn = Layer::BatchNorm {
        elements: output,
        channels,
    };
    plan.push(group, bn);
    if relu {
        plan.push(group, Layer::Relu { elements: output });
    }
}
