//! A conv's bias on the CPU, forward (added to each channel) and backward (each channel's sum),
//! on channels-last or channels-first activations, in f32 over any float dtype.
//!
//! The composed conv layer runs its conv through the direct kernels, which return channels
//! last: Flex's broadcast add of a `[1, c, 1, 1]` bias, and its sum over three axes for the
//! gradient, walk such a tensor value by value. Here each is one pass over the buffer.

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use rayon::prelude::*;

use super::channels_last::{dims4, is_channels_first, is_channels_last, relabel};
use super::values::{build, stored, supported, task_rows, values, values_in};

/// Values summed in f32 before the sum joins the f64 total (a fixed span: the bits depend on
/// the shape alone, not on the thread count).
const SPAN: usize = 4096;

/// How a `[n, c, h, w]` buffer holds its channels.
#[derive(Clone, Copy)]
enum Order {
    /// `[n·h·w, c]` rows.
    Last,
    /// `[n·c, h·w]` planes.
    First,
}

/// `[n, c, h, w]` dims and the buffer's order, for a tensor that holds exactly its values.
fn geometry(t: &FlexTensor) -> Option<([usize; 4], Order)> {
    let dims = dims4(t)?;
    let order = match (is_channels_last(t), is_channels_first(t)) {
        (true, _) => Order::Last,
        (_, true) => Order::First,
        _ => return None,
    };
    (supported(t) && dims.iter().all(|&d| d > 0)).then_some((dims, order))
}

/// `z + bias` per channel, in `z`'s dtype and layout (channels last or first); `bias` is
/// `[c]` in any float dtype the kernels read. `Err(z)` for anything else.
pub fn add_bias(z: FlexTensor, bias: &FlexTensor) -> Result<FlexTensor, FlexTensor> {
    let Some((dims @ [_, c, h, w], order)) = geometry(&z) else {
        return Err(z);
    };
    let fits =
        supported(bias) && bias.layout().is_contiguous() && bias.layout().shape().to_vec() == [c];
    if !fits {
        return Err(z);
    }
    let b = values(bias, 0, c).into_owned();
    let plane = h * w;
    let per = match order {
        Order::Last => task_rows(c) * c,
        Order::First => plane,
    };
    let out = build(dims.to_vec(), per, z.dtype(), Vec::new, |wide, i, out| {
        let input = values_in(&z, i * per, out.len(), wide);
        match order {
            Order::Last => {
                for (o, x) in out.chunks_exact_mut(c).zip(input.chunks_exact(c)) {
                    o.iter_mut()
                        .zip(x.iter().zip(&b))
                        .for_each(|(o, (x, b))| *o = x + b);
                }
            }
            Order::First => {
                let b = b[i % c];
                out.iter_mut().zip(input).for_each(|(o, x)| *o = x + b);
            }
        }
    });
    Ok(match order {
        Order::Last => relabel(out, dims),
        Order::First => out,
    })
}

/// Each channel's sum of `dz` (`[n, c, h, w]`, channels last or first), as `[c]` in `dtype`:
/// summed in f32 over fixed spans, the spans in f64 in order. `None` for anything else.
pub fn bias_grad(dz: &FlexTensor, dtype: DType) -> Option<FlexTensor> {
    let ([n, c, h, w], order) = geometry(dz)?;
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return None;
    }
    let sums: Vec<f64> = match order {
        Order::First => {
            let plane = h * w;
            (0..c)
                .into_par_iter()
                .map_init(Vec::new, |wide, ch| {
                    let mut total = 0f64;
                    for image in 0..n {
                        let start = (image * c + ch) * plane;
                        for s in (0..plane).step_by(SPAN) {
                            let len = SPAN.min(plane - s);
                            let v = values_in(dz, start + s, len, wide);
                            total += v.iter().sum::<f32>() as f64;
                        }
                    }
                    total
                })
                .collect()
        }
        Order::Last => {
            let rows = n * h * w;
            let per = (SPAN / c).max(1);
            let spans: Vec<Vec<f32>> = (0..rows.div_ceil(per))
                .into_par_iter()
                .map_init(Vec::new, |wide, t| {
                    let len = per.min(rows - t * per);
                    let v = values_in(dz, t * per * c, len * c, wide);
                    let mut acc = vec![0f32; c];
                    for row in v.chunks_exact(c) {
                        acc.iter_mut().zip(row).for_each(|(a, x)| *a += x);
                    }
                    acc
                })
                .collect();
            let mut total = vec![0f64; c];
            for span in &spans {
                total
                    .iter_mut()
                    .zip(span)
                    .for_each(|(t, &s)| *t += s as f64);
            }
            total
        }
    };
    Some(stored(
        sums.into_iter().map(|s| s as f32).collect(),
        vec![c],
        dtype,
    ))
}
