//! How many weights an optimizer step actually changed. Without master weights (pure f16),
//! `w − lr·u` rounds back to `w` whenever the update is below half an f16 ulp of `w` (about
//! |w|/2048): the update is lost. This measures that loss, for the pure-f16 teaching mode.

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

/// Every trainable parameter of `model`, flattened, by id.
fn trainable<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
) -> Vec<(ParamId, Tensor<B::InnerBackend, 1>)> {
    struct Collect<B: AutodiffBackend>(Vec<(ParamId, Tensor<B::InnerBackend, 1>)>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            if t.is_require_grad() {
                self.0.push((param.id, t.inner().flatten(0, D - 1)));
            }
        }
    }
    let mut c = Collect::<B>(Vec::new());
    model.visit(&mut c);
    c.0
}

/// Snapshot of the weights before a step (tensors are immutable, so this is cheap until the
/// step replaces them: then it holds one extra copy of the parameters).
pub struct Before<B: AutodiffBackend>(Vec<(ParamId, Tensor<B::InnerBackend, 1>)>);

impl<B: AutodiffBackend> Before<B> {
    /// Takes the snapshot.
    pub fn of<M: AutodiffModule<B>>(model: &M) -> Self {
        Self(trainable(model))
    }

    /// Fraction of weight elements that `after` left exactly as they were.
    pub fn unchanged_fraction<M: AutodiffModule<B>>(&self, after: &M) -> f64 {
        let after = trainable(after);
        let (mut same, mut total) = (Vec::new(), 0usize);
        for ((id_a, a), (id_b, b)) in self.0.iter().zip(&after) {
            debug_assert_eq!(id_a, id_b);
            total += a.dims()[0];
            same.push(a.clone().equal(b.clone()).int().sum());
        }
        if total == 0 {
            return 0.0;
        }
        let same: i64 = Tensor::cat(same, 0).sum().into_scalar().elem();
        same as f64 / total as f64
    }
}
