//! The CPU backend's (Flex's) kernel hooks: flex-kernels' kernels where they take the
//! operands, the composed defaults where they do not.

use burn::backend::Flex;
use burn::tensor::ops::{ConvOptions, FloatTensor, IntTensor, MaxPool2dWithIndices, ModuleOps};
use burn::tensor::{DType, TensorMetadata};

use crate::batch_norm;
use crate::cast::{float, prim};
use crate::conv_relu_pool;
use crate::kernels::{conv2d_x_backward_cast, Kernels};
use crate::max_pool::PoolWindow;
use crate::sliced_linear;
use crate::slices::SLICE_VALUES;

impl Kernels for Flex {
    fn slice_values() -> Option<usize> {
        Some(SLICE_VALUES)
    }

    /// Copied (`batch × channels` values): Flex's SIMD kernels broadcast a per-row scalar over
    /// `[batch, channels, h, w]` only when the scalars are laid out row by row; a
    /// `[1, channels, 1, 1]` operand (stride 0 on the batch) falls back to a scalar strided
    /// loop that made batch norm most of MobileNet's step time.
    fn per_channel_rows(v: FloatTensor<Self>, batch: usize) -> FloatTensor<Self> {
        prim(float::<Self, 4>(v).repeat_dim(0, batch))
    }

    fn float_write_rows(
        whole: FloatTensor<Self>,
        start: usize,
        part: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        flex_kernels::write_rows(whole, start, part)
    }

    fn float_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let direct = flex_kernels::pointwise_conv(&x, &weight, &options)
            .or_else(|| flex_kernels::depthwise_conv(&x, &weight, &options))
            .or_else(|| flex_kernels::dense_conv(&x, &weight, &options));
        // Flex's conv for the rest (dilated or grouped), its output made channels last like
        // the direct convs' (the layout the fused blocks hand on, and that backward saves).
        direct.unwrap_or_else(|| {
            flex_kernels::channels_last(&flex_kernels::in_f32(
                [flex_kernels::channels_first(x), weight],
                |[x, w]| <Self as ModuleOps<Self>>::conv2d(x, w, None, options),
            ))
        })
    }

    fn float_conv2d_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dz: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let direct = flex_kernels::pointwise_x_backward(x, &weight, &dz, &options)
            .or_else(|x| flex_kernels::depthwise_x_backward(x, &weight, &dz, &options))
            .or_else(|x| flex_kernels::dense_x_backward(x, &weight, &dz, &options));
        match direct {
            Ok(dx) => dx,
            // Flex's ops copy strided tensors value by value: channels-last ones are
            // transposed here.
            Err(x) => {
                let (x, dz) = (
                    flex_kernels::channels_first(x),
                    flex_kernels::channels_first(dz),
                );
                flex_kernels::in_f32([x, weight, dz], |[x, weight, dz]| {
                    conv2d_x_backward_cast::<Self>(x, weight, dz, options)
                })
            }
        }
    }

    fn float_conv2d_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dz: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let direct = flex_kernels::pointwise_weight_backward(&x, &weight, &dz, &options)
            .or_else(|| flex_kernels::depthwise_weight_backward(&x, &weight, &dz, &options))
            .or_else(|| flex_kernels::dense_weight_backward(&x, &weight, &dz, &options));
        match direct {
            Some(dw) => dw,
            None => {
                let master = weight.dtype();
                let (x, dz) = (
                    flex_kernels::channels_first(x),
                    flex_kernels::channels_first(dz),
                );
                let dw = flex_kernels::in_f32([x, weight, dz], |[x, weight, dz]| {
                    <Self as ModuleOps<Self>>::conv2d_weight_backward(x, weight, dz, options)
                });
                flex_kernels::convert(dw, master)
            }
        }
    }

    fn float_conv2d_layer(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        // Pointwise and depthwise convs run their channels-last kernels (below). A dense
        // one with a bias at stride 1 (SimpleModel's) runs the fused block's conv, so that
        // the composed and fused models compute the same bits; other dense ones write their
        // output channels first.
        let direct = flex_kernels::pointwise_conv(&x, &weight, &options)
            .or_else(|| flex_kernels::depthwise_conv(&x, &weight, &options));
        if direct.is_none() {
            let same_as_block = bias
                .as_ref()
                .and_then(|b| flex_kernels::conv_bias_first(&x, &weight, b, &options));
            let dense = same_as_block
                .or_else(|| flex_kernels::dense_conv_first(&x, &weight, bias.as_ref(), &options));
            if let Some(z) = dense {
                return z;
            }
        }
        // A half-precision direct conv rounds its sum before the bias is added and rounded
        // (as Flex's f16 conv does; its bf16 conv rounds once): no model has a pointwise or
        // depthwise conv with a bias.
        let z = direct.unwrap_or_else(|| Self::float_conv2d(x, weight, options));
        match bias {
            Some(bias) => flex_kernels::add_bias(z, &bias).unwrap_or_else(|z| {
                let channels = bias.shape().dims::<1>()[0];
                let z = float::<Self, 4>(flex_kernels::channels_first(z));
                prim(z + float::<Self, 1>(bias).reshape([1, channels, 1, 1]))
            }),
            None => z,
        }
    }

    fn float_max_pool_with_indices(
        x: FloatTensor<Self>,
        window: PoolWindow,
    ) -> MaxPool2dWithIndices<Self> {
        let w = window;
        match flex_kernels::max_pool_first(&x, w.size, w.stride, w.padding) {
            Some((output, indices)) => MaxPool2dWithIndices::new(output, indices),
            None => {
                let x = flex_kernels::channels_first(x);
                Self::max_pool2d_with_indices(x, w.size, w.stride, w.padding, [1, 1], false)
            }
        }
    }

    fn float_max_pool_backward(
        x: FloatTensor<Self>,
        window: PoolWindow,
        dout: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let w = window;
        let overlapping = (0..2).any(|i| w.stride[i] < w.size[i]);
        let x_dims = x.shape().dims::<4>();
        match flex_kernels::max_pool_backward_first(x_dims, &dout, &indices, overlapping) {
            Some(dx) => dx,
            None => {
                let (x, dout) = (
                    flex_kernels::channels_first(x),
                    flex_kernels::channels_first(dout),
                );
                <Self as ModuleOps<Self>>::max_pool2d_with_indices_backward(
                    x,
                    w.size,
                    w.stride,
                    w.padding,
                    [1, 1],
                    false,
                    dout,
                    indices,
                )
                .x_grad
            }
        }
    }

    fn float_max_pool(x: FloatTensor<Self>, window: PoolWindow) -> FloatTensor<Self> {
        Self::float_max_pool_with_indices(x, window).output
    }

    fn float_relu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        flex_kernels::relu(x).unwrap_or_else(|x| {
            <Self as burn::tensor::ops::ActivationOps<Self>>::relu(flex_kernels::channels_first(x))
        })
    }

    fn float_relu_backward(x: FloatTensor<Self>, dout: FloatTensor<Self>) -> FloatTensor<Self> {
        flex_kernels::relu_backward(x, dout).unwrap_or_else(|pair| {
            let [x, dout] = *pair;
            let (x, dout) = (
                flex_kernels::channels_first(x),
                flex_kernels::channels_first(dout),
            );
            <Self as burn::tensor::ops::ActivationOps<Self>>::relu_backward(x, dout)
        })
    }

    fn float_bias_grad(dz: FloatTensor<Self>, dtype: DType) -> FloatTensor<Self> {
        match flex_kernels::bias_grad(&dz, dtype) {
            Some(db) => db,
            None => {
                let channels = dz.shape().dims::<4>()[1];
                let dz = float::<Self, 4>(flex_kernels::channels_first(dz));
                let sum = dz.sum_dim(0).sum_dim(2).sum_dim(3).reshape([channels]);
                crate::cast::cast_prim::<Self>(prim(sum), dtype)
            }
        }
    }

    fn batch_norm_inference(
        x: FloatTensor<Self>,
        params: [FloatTensor<Self>; 4],
        work: DType,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let direct = match work {
            DType::F32 => {
                let [g, b, m, v] = &params;
                flex_kernels::batch_norm_inference(&x, [g, b, m, v], epsilon)
            }
            DType::F16 | DType::BF16 => {
                let [g, b, m, v] = &params;
                flex_kernels::batch_norm_inference_half(&x, [g, b, m, v], work, epsilon)
            }
            _ => None,
        };
        direct.unwrap_or_else(|| {
            let x = flex_kernels::channels_first(x);
            batch_norm::inference_composed::<Self>(x, params, work, epsilon)
        })
    }

    fn batch_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
    ) -> [FloatTensor<Self>; 4] {
        let direct = match work {
            DType::F32 => flex_kernels::batch_norm_forward(&x, &gamma, &beta, epsilon, false),
            DType::F16 | DType::BF16 => {
                flex_kernels::batch_norm_forward_half(&x, &gamma, &beta, work, epsilon)
            }
            _ => None,
        };
        // Flex's ops walk a channels-last tensor value by value: channels first for them.
        direct.unwrap_or_else(|| {
            let x = flex_kernels::channels_first(x);
            let f = batch_norm::forward::<Self>(x, gamma, beta, work, epsilon);
            [f.output, f.mean, f.var, f.rstd]
        })
    }

    fn batch_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        [mean, rstd]: [FloatTensor<Self>; 2],
        work: DType,
        dout: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        // The kernel reads β only for the ReLU's mask, which this op has not got.
        let direct = match work {
            DType::F32 => {
                flex_kernels::batch_norm_backward(&x, &dout, [&gamma, &gamma, &mean, &rstd], false)
            }
            DType::F16 | DType::BF16 => {
                flex_kernels::batch_norm_backward_half(&x, &dout, &gamma, [&mean, &rstd], work)
            }
            _ => None,
        };
        direct.unwrap_or_else(|| {
            let (x, dout) = (
                flex_kernels::channels_first(x),
                flex_kernels::channels_first(dout),
            );
            let stats = batch_norm::SavedStats { mean, rstd, work };
            batch_norm::backward::<Self>(x, gamma, &stats, dout)
        })
    }

    fn bn_relu_forward(
        z: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
    ) -> [FloatTensor<Self>; 4] {
        let direct = match work {
            DType::F32 => flex_kernels::bn_relu_forward(&z, &gamma, &beta, epsilon),
            // Batch norm in a half dtype, then the ReLU: what the composed layers compute.
            DType::F16 | DType::BF16 => {
                flex_kernels::batch_norm_forward_half(&z, &gamma, &beta, work, epsilon)
                    .map(|[y, mean, var, rstd]| [Self::float_relu(y), mean, var, rstd])
            }
            _ => None,
        };
        direct.unwrap_or_else(|| batch_norm::forward_relu::<Self>(z, gamma, beta, work, epsilon))
    }

    fn bn_relu_backward(
        z: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        work: DType,
        dout: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        let direct = match work {
            DType::F32 => flex_kernels::bn_relu_backward(&z, &dout, [&gamma, &beta, &mean, &rstd]),
            DType::F16 | DType::BF16 => {
                let stats = [&mean, &rstd];
                flex_kernels::batch_norm_recompute_half(&z, &gamma, &beta, stats, work).and_then(
                    |y| {
                        let dy = Self::float_relu_backward(y, flex_kernels::channels_last(&dout));
                        flex_kernels::batch_norm_backward_half(&z, &dy, &gamma, stats, work)
                    },
                )
            }
            _ => None,
        };
        direct.unwrap_or_else(|| {
            batch_norm::relu_backward::<Self>(z, gamma, beta, [mean, rstd], work, dout)
        })
    }

    fn float_convert(t: FloatTensor<Self>, dtype: DType) -> FloatTensor<Self> {
        flex_kernels::convert(t, dtype)
    }

    fn float_add_matmul(
        sum: Option<FloatTensor<Self>>,
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        flex_kernels::add_matmul(sum, lhs, rhs)
    }

    fn int_write_rows(
        whole: IntTensor<Self>,
        start: usize,
        part: IntTensor<Self>,
    ) -> IntTensor<Self> {
        flex_kernels::write_rows(whole, start, part)
    }

    fn linear_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        match flex_kernels::linear_forward_half(&x, &weight, &bias) {
            Some(out) => out,
            None => sliced_linear::linear_plain::<Self>(x, weight, bias),
        }
    }

    fn linear_input_grad(
        dy: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        features: usize,
    ) -> FloatTensor<Self> {
        match flex_kernels::linear_input_grad_half(&dy, &weight) {
            Some(dx) => dx,
            None => sliced_linear::input_grad_sliced::<Self>(dy, weight, features),
        }
    }

    fn conv_relu_pool_forward(
        x: &FloatTensor<Self>,
        weight: &FloatTensor<Self>,
        bias: &FloatTensor<Self>,
        options: &ConvOptions<2>,
        k: usize,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        flex_kernels::conv_relu_pool_forward(x, weight, bias, options, k)
            .unwrap_or_else(|| conv_relu_pool::forward_sliced::<Self>(x, weight, bias, options, k))
    }

    fn conv_relu_pool_backward(
        x: &FloatTensor<Self>,
        weight: &FloatTensor<Self>,
        bias: &FloatTensor<Self>,
        out: &FloatTensor<Self>,
        dout: &FloatTensor<Self>,
        positions: &IntTensor<Self>,
        options: &ConvOptions<2>,
        k: usize,
        wanted: [bool; 3],
    ) -> [Option<FloatTensor<Self>>; 3] {
        // The first layer (no input gradient): read off the pooled gradient.
        let kernel = weight.shape().dims();
        let direct = (!wanted[0])
            .then(|| {
                flex_kernels::conv_relu_pool_param_grads(
                    x, out, dout, positions, kernel, options, k,
                )
            })
            .flatten();
        match direct {
            Some([dw, db]) => [None, wanted[1].then_some(dw), wanted[2].then_some(db)],
            None => conv_relu_pool::backward_sliced::<Self>(
                x, weight, bias, out, dout, positions, options, k, wanted,
            ),
        }
    }

    fn relu_max_pool(z: FloatTensor<Self>, k: usize) -> (FloatTensor<Self>, IntTensor<Self>) {
        match flex_kernels::relu_max_pool(&z, k) {
            Some(pooled) => pooled,
            None => conv_relu_pool::relu_max_pool_plain::<Self>(z, k),
        }
    }
}
