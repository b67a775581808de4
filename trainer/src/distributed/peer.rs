//! One replica of a data-parallel run, as the training loop sees it: which samples of a window
//! are its own, and the window's gradients summed over every replica.
//!
//! A run on one device is a run of one peer: it takes the whole window and its sums are its
//! own gradients, so the loop has no second path.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::{AutodiffBackend, BackendTypes};
use burn::tensor::TensorPrimitive;

use super::fault::Fault;
use super::link::{DistributedError, Link};
use super::shard::{gather_state, share as share_weights, trainable_ids, Owners};
use crate::config::Shard;
use crate::training::grads;
use crate::training::optim::Optim;

/// A window's gradients and loss, summed over the peers, and whether they agreed to stop.
pub struct Reduced {
    /// The summed gradients this peer steps with: every trainable parameter's, or with
    /// sharding the ones it owns.
    pub grads: GradientsParams,
    /// With `shard = "optimizer"`, the sums of the parameters other peers own: kept until the
    /// window ends, as DDP keeps every `.grad` until `zero_grad` (ZeRO-1 shards the optimizer
    /// state only). Empty otherwise.
    pub others: GradientsParams,
    /// The window's mean loss (each peer's part is already weighted by its share).
    pub loss: f64,
    /// The signal that stops the run after this window, if a peer received one.
    pub stop: Option<i32>,
}

/// This process's part of a run: one peer, alone or linked to the others.
pub struct Peer<B: Backend> {
    link: Option<Link<B>>,
    fault: Option<Fault>,
    windows: usize,
    /// What it keeps of the optimizer state and gradients.
    shard: Shard,
    /// Who owns each trainable parameter, once the model is known (sharded runs only).
    owners: Option<Owners>,
}

impl<B: Backend> Peer<B> {
    /// The only peer of a one-device run.
    pub fn solo() -> Self {
        Self {
            link: None,
            fault: None,
            windows: 0,
            shard: Shard::None,
            owners: None,
        }
    }

    /// A peer of a data-parallel run, connected by `link`, keeping what `shard` says.
    pub fn linked(link: Link<B>, shard: Shard) -> Self {
        Self {
            fault: Fault::from_env(Link::rank(&link)),
            link: Some(link),
            windows: 0,
            shard,
            owners: None,
        }
    }

    /// This peer's rank: 0 writes the run's outputs.
    pub fn rank(&self) -> usize {
        self.link.as_ref().map_or(0, |link| link.rank())
    }

    /// Peers in the run.
    pub fn peers(&self) -> usize {
        self.link.as_ref().map_or(1, |link| link.peers())
    }

    /// Seconds spent in collective calls per window reduced so far (`None` on one device).
    pub fn collective_seconds_per_window(&self) -> Option<f64> {
        let windows = self.windows.max(1) as f64;
        (self.link.as_ref()).map(|link| link.busy().as_secs_f64() / windows)
    }

    /// Ends this peer's part of a run that ended well on every peer.
    pub fn finish(self) -> Result<(), DistributedError> {
        self.link.map_or(Ok(()), Link::finish)
    }

    /// Whether this peer writes the run's checkpoints, log and summary, and evaluates.
    pub fn is_leader(&self) -> bool {
        self.rank() == 0
    }

    /// This peer's samples of `window`: cut into pieces of `batch_size`, peer r takes pieces
    /// r, r + N, r + 2N, … So the i-th micro-batches of all peers together are the i-th
    /// micro-batch of one device with N × `batch_size`, and every sample is used once.
    pub fn shard(&self, window: &[usize], batch_size: usize) -> Vec<usize> {
        shard(window, batch_size, self.rank(), self.peers())
    }

    /// Sums `grads` (this peer's gradients of `model`), this peer's part of the window's `loss`
    /// and its `stop` request over all peers. A sharded peer keeps the sums of the parameters
    /// it owns only; with `optimizer+gradients` the others' sums are never made on it (across
    /// nodes they are, and dropped: see [`Link::reduce`]).
    pub fn reduce<AB, M>(
        &mut self,
        model: &M,
        grads: GradientsParams,
        loss: f64,
        stop: Option<i32>,
    ) -> Result<Reduced, DistributedError>
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        self.windows += 1;
        self.find_owners::<AB, M>(model);
        let Some(link) = &mut self.link else {
            return Ok(Reduced {
                grads,
                others: GradientsParams::new(),
                loss,
                stop,
            });
        };
        let mut collect = Collect::<AB> {
            grads,
            tensors: Vec::new(),
            device: None,
        };
        model.visit(&mut collect);
        let Collect {
            mut tensors,
            device,
            grads: rest,
        } = collect;
        let Some(device) = device else {
            return Ok(Reduced {
                grads: rest,
                others: GradientsParams::new(),
                loss,
                stop,
            });
        };
        if let Some(fault) = self.fault {
            fault.before_reduce::<B>(self.windows, &mut tensors)?;
        }
        let owners = self.owners.as_ref();
        let to_owner = |i: usize| {
            let stage2 = self.shard == Shard::OptimizerGradients;
            owners.filter(|_| stage2).map(|o| o.owner(i))
        };
        let mut request: Vec<_> = (tensors.into_iter().enumerate())
            .map(|(i, t)| (t, to_owner(i)))
            .collect();
        // The loss part and the stop request ride along as one small tensor: the loss, then
        // one slot per peer for the signal it received, so that the sum keeps each one.
        let mut flags = vec![0.0; 1 + link.peers()];
        flags[0] = loss as f32;
        flags[1 + link.rank()] = stop.unwrap_or(0) as f32;
        let flags = Tensor::<B, 1>::from_floats(flags.as_slice(), &device);
        request.push((flags.into_primitive().tensor(), None));
        let mut sums = link.reduce(request)?;
        let flags = sums.pop().flatten().map_or_else(Vec::new, to_vec::<B>);
        let loss = flags.first().map_or(f64::NAN, |l| f64::from(*l));
        // The lowest rank's signal, when several peers received one.
        let stop = flags.iter().skip(1).find(|s| **s != 0.0).map(|s| *s as i32);
        // A sharded peer steps with the sums of the parameters it owns; the others' (ZeRO-1
        // only: stage 2 never made them here) wait beside them for the window's end.
        let rank = link.rank();
        let (mine, others): (Vec<_>, Vec<_>) = (sums.into_iter().enumerate())
            .map(|(i, sum)| match owners.is_none_or(|o| o.owner(i) == rank) {
                true => (sum, None),
                false => (None, sum),
            })
            .unzip();
        let mut restore = Restore::<AB> {
            sums: mine.into_iter(),
            grads: rest,
        };
        model.visit(&mut restore);
        let mut kept = Restore::<AB> {
            sums: others.into_iter(),
            grads: GradientsParams::new(),
        };
        model.visit(&mut kept);
        Ok(Reduced {
            grads: restore.grads,
            others: kept.grads,
            loss,
            stop,
        })
    }

    /// The L2 norm of the window's summed gradients, over all peers: with
    /// `optimizer+gradients` each peer holds its own parameters' sums only, so the peers add
    /// up their sums of squares.
    pub fn norm<AB, M>(&mut self, model: &M, sums: &Reduced) -> Result<f64, DistributedError>
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        let (mine, device) = grads::sum_squares::<AB, M>(model, &sums.grads);
        let (others, _) = grads::sum_squares::<AB, M>(model, &sums.others);
        let squares = mine + others;
        let (Some(link), Shard::OptimizerGradients) = (&mut self.link, self.shard) else {
            return Ok(squares.sqrt());
        };
        // A peer that owns no parameter (more peers than parameters) still takes part.
        let device = device
            .or_else(|| inner_device::<AB, M>(model))
            .unwrap_or_default();
        let mine = Tensor::<B, 1>::from_floats([squares as f32], &device);
        let sums = link.all_reduce(vec![mine.into_primitive().tensor()])?;
        let total = sums.into_iter().next().map_or_else(Vec::new, to_vec::<B>);
        Ok(total.first().map_or(f64::NAN, |t| f64::from(*t).sqrt()))
    }

    /// After a step that `stepped`: a sharded peer updated the parameters it owns only, so
    /// every owner sends its new weights to the others (nothing to do unsharded).
    pub fn share<AB, M>(&mut self, model: M, stepped: bool) -> Result<M, DistributedError>
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        match (&mut self.link, &self.owners) {
            (Some(link), Some(owners)) if stepped => {
                let rank = link.rank();
                share_weights::<AB, M>(model, owners, rank, link)
            }
            _ => Ok(model),
        }
    }

    /// `optim` with the state of the parameters this peer owns only (all of them unless
    /// sharded): a checkpoint holds every parameter's.
    pub fn own<AB, M>(&mut self, model: &M, optim: Optim<M, AB>) -> Optim<M, AB>
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        self.find_owners::<AB, M>(model);
        let Some(owners) = &self.owners else {
            return optim;
        };
        let rank = self.rank();
        let ids = trainable_ids::<AB, M>(model);
        let owned: std::collections::HashSet<_> = (ids.into_iter().enumerate())
            .filter(|(i, _)| owners.owner(*i) == rank)
            .map(|(_, id)| id)
            .collect();
        optim.rekeyed(|id| owned.contains(&id).then_some(id))
    }

    /// The optimizer state of every parameter, for rank 0's checkpoint, when the peers hold a
    /// shard each (every peer takes part; rank 0 gets it, the others `None`). `None` unsharded:
    /// `optim` is already whole.
    pub fn whole_state<AB, M>(
        &mut self,
        model: &M,
        optim: &Optim<M, AB>,
        device: &AB::Device,
    ) -> Result<Option<Optim<M, AB>>, DistributedError>
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        match (&mut self.link, &self.owners) {
            (Some(link), Some(_)) => gather_state(optim, model, device, link),
            _ => Ok(None),
        }
    }

    fn find_owners<AB, M>(&mut self, model: &M)
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        if self.owners.is_none() && self.link.is_some() && self.shard.optimizer() {
            self.owners = Some(Owners::of::<AB, M>(model, self.peers()));
        }
    }

    /// Checks that every peer passes the same `values` (a hash of its config), on `device`.
    pub fn agree(&mut self, values: &[f32], device: &B::Device) -> Result<(), DistributedError> {
        let Some(link) = &mut self.link else {
            return Ok(());
        };
        let mine = Tensor::<B, 1>::from_floats(values, device);
        let sums = link.all_reduce(vec![mine.into_primitive().tensor()])?;
        let sums = sums.into_iter().next().map_or_else(Vec::new, to_vec::<B>);
        let world = link.peers() as f32;
        let same =
            sums.len() == values.len() && sums.iter().zip(values).all(|(s, v)| *s == v * world);
        same.then_some(()).ok_or(DistributedError::ConfigMismatch)
    }
}

/// A float primitive's values.
fn to_vec<B: Backend>(t: B::FloatTensorPrimitive) -> Vec<f32> {
    let t = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t));
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .unwrap_or_default()
}

/// The device of `model`'s first parameter, as its inner backend names it.
fn inner_device<AB: AutodiffBackend, M: AutodiffModule<AB>>(
    model: &M,
) -> Option<<AB::InnerBackend as BackendTypes>::Device> {
    struct First<AB: AutodiffBackend>(Option<<AB::InnerBackend as BackendTypes>::Device>);
    impl<AB: AutodiffBackend> ModuleVisitor<AB> for First<AB> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
            if self.0.is_none() {
                self.0 = Some(param.val().inner().device());
            }
        }
    }
    let mut first = First::<AB>(None);
    model.visit(&mut first);
    first.0
}

/// Peer `rank`'s samples of `window` among `peers`: see [`Peer::shard`].
pub fn shard(window: &[usize], batch_size: usize, rank: usize, peers: usize) -> Vec<usize> {
    let pieces = window.chunks(batch_size.max(1)).skip(rank);
    pieces.step_by(peers.max(1)).flatten().copied().collect()
}

/// Takes every trainable parameter's gradient out of `grads`, in the model's order; a
/// parameter this peer has no gradient for (no samples in the window) sends zeros.
struct Collect<AB: AutodiffBackend> {
    grads: GradientsParams,
    tensors: Vec<<AB::InnerBackend as BackendTypes>::FloatTensorPrimitive>,
    device: Option<<AB::InnerBackend as BackendTypes>::Device>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for Collect<AB> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        if !param.val().is_require_grad() {
            return;
        }
        let grad = self.grads.remove::<AB::InnerBackend, D>(param.id);
        let grad = grad.unwrap_or_else(|| param.val().inner().zeros_like());
        self.device.get_or_insert_with(|| grad.device());
        self.tensors.push(grad.into_primitive().tensor());
    }
}

/// Puts the sums back under each trainable parameter's id, in the same order.
struct Restore<AB: AutodiffBackend> {
    sums: std::vec::IntoIter<Option<<AB::InnerBackend as BackendTypes>::FloatTensorPrimitive>>,
    grads: GradientsParams,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for Restore<AB> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        if !param.val().is_require_grad() {
            return;
        }
        if let Some(Some(sum)) = self.sums.next() {
            let sum = Tensor::<AB::InnerBackend, D>::from_primitive(TensorPrimitive::Float(sum));
            self.grads.register::<AB::InnerBackend, D>(param.id, sum);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn shards_are_disjoint_and_cover_a_short_window() {
        // 2 peers, pieces of 3, a window of 10: pieces [0..3) [3..6) [6..9) [9..10).
        let window: Vec<usize> = (100..110).collect();
        let solo = Peer::<Flex>::solo();
        assert_eq!(solo.shard(&window, 3), window);
        assert_eq!(shard(&window, 3, 0, 2), [100, 101, 102, 106, 107, 108]);
        assert_eq!(shard(&window, 3, 1, 2), [103, 104, 105, 109]);
        // A peer past the window's pieces gets nothing (it still joins the all-reduce).
        assert_eq!(shard(&window, 3, 4, 5), Vec::<usize>::new());
    }
}
