//! The CPU backend's (Flex's) kernel hooks: flex-kernels' kernels where they take the
//! operands, the composed defaults where they do not.

use burn::backend::Flex;
use burn::tensor::ops::{ConvOptions, FloatTensor, IntTensor, ModuleOps};
use burn::tensor::{DType, TensorMetadata};

use crate::batch_norm;
use crate::cast::{float, prim};
use crate::conv_relu_pool;
use crate::kernels::{conv2d_x_backward_cast, Kernels};
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
            .or_else(|x| flex_kernels::depthwise_x_backward(x, &weight, &dz, &options));
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

    fn bn_relu_forward(
        z: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
    ) -> [FloatTensor<Self>; 4] {
        let direct = match work {
            DType::F32 => flex_kernels::bn_relu_forward(&z, &gamma, &beta, epsilon),
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
