//! ZeRO's stages 1 and 2 (`distributed.shard`): every trainable parameter has one owner among
//! the peers, which alone keeps its optimizer state (and, at stage 2, its summed gradient),
//! steps it, and sends the updated weights to the others.
//!
//! burn-collective has no all-gather and no global broadcast, so weights travel by all-reduce:
//! the owner sends its values, every other peer zeros, and a value plus zeros is that value,
//! bit for bit. Weights go in buckets of [`BUCKET_BYTES`], so a peer holds one bucket's copy
//! beside its model, never a second model.

use std::collections::HashMap;

use burn::collective::CollectiveError;
use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use burn::tensor::backend::{AutodiffBackend, BackendTypes};
use burn::tensor::TensorPrimitive;

use super::link::{DistributedError, Link};
use crate::training::optim::Optim;

/// The most bytes of weights (or of packed optimizer state) one all-reduce carries.
pub const BUCKET_BYTES: usize = 16 << 20;

/// Which peer owns each trainable parameter, in the order the model visits them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owners {
    owner: Vec<usize>,
    elements: Vec<usize>,
}

impl Owners {
    /// Parameters of `elements` values each, shared out over `peers`: the largest first, each
    /// to the peer that holds the fewest values so far (ties to the lowest rank). Every peer
    /// computes the same owners, and no peer holds more than the mean plus one parameter.
    pub fn balance(elements: &[usize], peers: usize) -> Self {
        let peers = peers.max(1);
        let mut order: Vec<usize> = (0..elements.len()).collect();
        // Stable: equal sizes keep the model's order.
        order.sort_by_key(|&i| std::cmp::Reverse(elements[i]));
        let mut held = vec![0usize; peers];
        let mut owner = vec![0; elements.len()];
        for i in order {
            let least = (0..peers).min_by_key(|&p| (held[p], p)).unwrap_or(0);
            owner[i] = least;
            held[least] += elements[i];
        }
        Self {
            owner,
            elements: elements.to_vec(),
        }
    }

    /// The owners of `model`'s trainable parameters among `peers`.
    pub fn of<AB: AutodiffBackend, M: AutodiffModule<AB>>(model: &M, peers: usize) -> Self {
        struct Sizes(Vec<usize>);
        impl<AB: AutodiffBackend> ModuleVisitor<AB> for Sizes {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
                let value = param.val();
                if value.is_require_grad() {
                    self.0.push(value.shape().num_elements());
                }
            }
        }
        let mut sizes = Sizes(Vec::new());
        model.visit(&mut sizes);
        Self::balance(&sizes.0, peers)
    }

    /// The rank that owns trainable parameter `index`.
    pub fn owner(&self, index: usize) -> usize {
        self.owner.get(index).copied().unwrap_or(0)
    }

    /// Values of the parameters `rank` owns.
    pub fn held(&self, rank: usize) -> usize {
        (self.owner.iter().zip(&self.elements))
            .filter(|(o, _)| **o == rank)
            .map(|(_, e)| e)
            .sum()
    }
}

type Primitive<AB> = <<AB as AutodiffBackend>::InnerBackend as BackendTypes>::FloatTensorPrimitive;

/// Replaces every trainable parameter of `model` with its owner's value (see the module's
/// note); `rank` is this peer's.
pub fn share<AB, M>(
    model: M,
    owners: &Owners,
    rank: usize,
    link: &mut Link<AB::InnerBackend>,
) -> Result<M, DistributedError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    // Every trainable parameter's current value (a handle, not a copy) and size.
    struct Values<AB: AutodiffBackend>(Vec<(Primitive<AB>, usize)>);
    impl<AB: AutodiffBackend> ModuleVisitor<AB> for Values<AB> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
            let value = param.val();
            if value.is_require_grad() {
                let inner = value.inner();
                let bytes = inner.shape().num_elements() * inner.dtype().size();
                self.0.push((inner.into_primitive().tensor(), bytes));
            }
        }
    }
    let mut values = Values::<AB>(Vec::new());
    model.visit(&mut values);
    let mut gather = Gather::<AB> {
        values: values.0.into_iter().map(Some).collect(),
        owners,
        rank,
        link,
        index: 0,
        sums: std::collections::VecDeque::new(),
        error: None,
    };
    let model = model.map(&mut gather);
    match gather.error {
        Some(error) => Err(error),
        None => Ok(model),
    }
}

/// Walks the trainable parameters in order; at the start of each bucket it all-reduces the
/// bucket (owned values, zeros for the rest) and then takes the sums one by one.
struct Gather<'a, AB: AutodiffBackend> {
    values: Vec<Option<(Primitive<AB>, usize)>>,
    owners: &'a Owners,
    rank: usize,
    link: &'a mut Link<AB::InnerBackend>,
    index: usize,
    sums: std::collections::VecDeque<Primitive<AB>>,
    error: Option<DistributedError>,
}

impl<AB: AutodiffBackend> Gather<'_, AB> {
    fn next_bucket(&mut self) {
        let mut bytes = 0;
        let mut sent = Vec::new();
        let mut i = self.index;
        while let Some(Some((_, size))) = self.values.get(i) {
            if !sent.is_empty() && bytes + size > BUCKET_BYTES {
                break;
            }
            bytes += size;
            let (value, _) = self.values[i].take().expect("checked above");
            let value = match self.owners.owner(i) == self.rank {
                true => value,
                false => zeros_like::<AB>(value),
            };
            sent.push(value);
            i += 1;
        }
        match self.link.all_reduce(sent) {
            Ok(sums) => self.sums.extend(sums),
            Err(error) => self.error = Some(error),
        }
    }
}

fn zeros_like<AB: AutodiffBackend>(value: Primitive<AB>) -> Primitive<AB> {
    let value = Tensor::<AB::InnerBackend, 1>::from_primitive(TensorPrimitive::Float(value));
    value.zeros_like().into_primitive().tensor()
}

impl<AB: AutodiffBackend> ModuleMapper<AB> for Gather<'_, AB> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AB, D>>) -> Param<Tensor<AB, D>> {
        let (id, value, mapper) = param.consume();
        if !value.is_require_grad() || self.error.is_some() {
            return Param::from_mapped_value(id, value, mapper);
        }
        if self.sums.is_empty() {
            self.next_bucket();
        }
        self.index += 1;
        let Some(sum) = self.sums.pop_front() else {
            return Param::from_mapped_value(id, value, mapper);
        };
        let sum = Tensor::<AB::InnerBackend, D>::from_primitive(TensorPrimitive::Float(sum));
        Param::from_mapped_value(id, Tensor::from_inner(sum).require_grad(), mapper)
    }
}

/// The ids of `model`'s trainable parameters, in the order the model visits them.
pub fn trainable_ids<AB: AutodiffBackend, M: AutodiffModule<AB>>(model: &M) -> Vec<ParamId> {
    struct Ids(Vec<ParamId>);
    impl<AB: AutodiffBackend> ModuleVisitor<AB> for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
            if param.val().is_require_grad() {
                self.0.push(param.id);
            }
        }
    }
    let mut ids = Ids(Vec::new());
    model.visit(&mut ids);
    ids.0
}

/// Brings the owners' optimizer states together on rank 0, for its checkpoint: each other
/// peer sends its entries as MessagePack bytes, keyed by parameter index (ids are random per
/// process), in buckets. Rank 0 gets the whole state under its own ids; the others `None`.
pub fn gather_state<AB, M>(
    optim: &Optim<M, AB>,
    model: &M,
    device: &AB::Device,
    link: &mut Link<AB::InnerBackend>,
) -> Result<Option<Optim<M, AB>>, DistributedError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    let (rank, peers) = (link.rank(), link.peers());
    let ids = trainable_ids::<AB, M>(model);
    let index: HashMap<ParamId, u64> = (ids.iter().enumerate())
        .map(|(i, id)| (*id, i as u64))
        .collect();
    let mine = optim.rekeyed(|id| index.get(&id).map(|i| ParamId::from(*i)));
    let failed = |reason: String| DistributedError::Collective {
        rank,
        what: "gathering the optimizer state for the checkpoint".into(),
        error: CollectiveError::Other(reason),
    };
    let bytes = match rank {
        0 => Vec::new(),
        _ => mine.to_bytes().map_err(|e| failed(format!("{e:#}")))?,
    };
    // Each peer's length, 24 bits to a value.
    let mut lengths = vec![0.0f32; 3 * peers];
    let len = bytes.len() as u64;
    for (i, slot) in lengths[3 * rank..3 * rank + 3].iter_mut().enumerate() {
        *slot = ((len >> (24 * i)) & 0xff_ffff) as f32;
    }
    let lengths = vec_of::<AB>(link.all_reduce(vec![tensor::<AB>(&lengths, device)])?);
    let packed = pack(&bytes);
    drop(bytes);
    let empty = mine.rekeyed(|_| None);
    let mut whole = (rank == 0).then_some(mine);
    for sender in 1..peers {
        let words = &lengths[3 * sender..3 * sender + 3];
        let len = (words.iter().rev()).fold(0u64, |l, w| (l << 24) | *w as u64) as usize;
        let mut received = Vec::new();
        for start in (0..len.div_ceil(3)).step_by(BUCKET_BYTES / 4) {
            let end = (start + BUCKET_BYTES / 4).min(len.div_ceil(3));
            let values = match sender == rank {
                true => packed[start..end].to_vec(),
                false => vec![0.0; end - start],
            };
            let sums = link.all_reduce(vec![tensor::<AB>(&values, device)])?;
            if rank == 0 {
                received.extend(vec_of::<AB>(sums));
            }
        }
        if let Some(whole) = &mut whole {
            let bytes = unpack(&received, len)
                .ok_or_else(|| failed(format!("peer {sender}'s state arrived garbled")))?;
            let theirs = empty.clone().from_bytes(bytes, device).map_err(failed)?;
            whole.merge(theirs);
        }
    }
    Ok(whole.map(|whole| whole.rekeyed(|i| ids.get(i.val() as usize).copied())))
}

fn tensor<AB: AutodiffBackend>(values: &[f32], device: &AB::Device) -> Primitive<AB> {
    Tensor::<AB::InnerBackend, 1>::from_floats(values, device)
        .into_primitive()
        .tensor()
}

fn vec_of<AB: AutodiffBackend>(sums: Vec<Primitive<AB>>) -> Vec<f32> {
    let sum = sums.into_iter().next();
    let sum = sum.map(|s| Tensor::<AB::InnerBackend, 1>::from_primitive(TensorPrimitive::Float(s)));
    sum.and_then(|s| s.into_data().convert::<f32>().to_vec::<f32>().ok())
        .unwrap_or_default()
}

/// Bytes as f32 values, three to a value (every integer below 2²⁴ is an exact f32, so a sum
/// with zeros keeps them).
pub fn pack(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(3)
        .map(|c| {
            let word = c.iter().rev().fold(0u32, |w, b| (w << 8) | u32::from(*b));
            word as f32
        })
        .collect()
}

/// The first `len` bytes [`pack`] wrote into `values`; `None` when a value is not one it
/// writes (the sum was not one owner's bytes plus zeros).
pub fn unpack(values: &[f32], len: usize) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(values.len() * 3);
    for v in values {
        let exact = v.fract() == 0.0 && (0.0..16_777_216.0).contains(v);
        if !exact {
            return None;
        }
        let word = *v as u32;
        bytes.extend_from_slice(&word.to_le_bytes()[..3]);
    }
    (bytes.len() >= len).then(|| {
        bytes.truncate(len);
        bytes
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_balance_by_size_and_agree() {
        // One big parameter and many small ones: the big one alone on a peer.
        let sizes = [10, 1000, 10, 10, 300, 300, 300, 10];
        let owners = Owners::balance(&sizes, 2);
        assert_eq!(owners.owner(1), 0);
        assert_eq!(owners.held(0), 1000);
        assert_eq!(owners.held(1), 940);
        assert_eq!(owners, Owners::balance(&sizes, 2));
        // Equal sizes go round the peers in the model's order.
        let owners = Owners::balance(&[5; 6], 3);
        let ranks: Vec<usize> = (0..6).map(|i| owners.owner(i)).collect();
        assert_eq!(ranks, [0, 1, 2, 0, 1, 2]);
        // One peer owns everything.
        let owners = Owners::balance(&sizes, 1);
        assert_eq!(owners.held(0), sizes.iter().sum::<usize>());
    }

    #[test]
    fn bytes_survive_packing_and_a_sum_with_zeros() {
        let bytes: Vec<u8> = (0..=255).chain([255, 0, 255, 7]).collect();
        for len in [0, 1, 2, 3, 4, bytes.len()] {
            let packed = pack(&bytes[..len]);
            assert_eq!(packed.len(), len.div_ceil(3));
            let summed: Vec<f32> = packed.iter().map(|v| v + 0.0 + 0.0).collect();
            assert_eq!(unpack(&summed, len).as_deref(), Some(&bytes[..len]));
        }
        // Two owners' bytes summed are not one owner's: refused, not misread.
        assert_eq!(unpack(&[16_777_216.0], 3), None);
        assert_eq!(unpack(&[0.5], 1), None);
        assert_eq!(unpack(&[1.0], 4), None);
    }
}
