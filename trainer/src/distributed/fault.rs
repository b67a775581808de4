//! Faults injected into one peer, for the tests of what the others do: `OOMLAB_FAULT` =
//! `KIND:RANK:WINDOW`, where KIND is `overflow` (that peer's gradients turn inf before the
//! all-reduce), `fail` (the peer stops with an error) or `hang` (the peer stops answering).
//! Unset, or naming another rank, it does nothing.

use std::time::Duration;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use super::link::DistributedError;

/// The environment variable read.
pub const FAULT_ENV: &str = "OOMLAB_FAULT";

/// What to break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Overflow,
    Fail,
    Hang,
}

/// A fault for this peer at one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    kind: Kind,
    rank: usize,
    /// The window (counted from 1 in this process) it strikes at.
    window: usize,
}

impl Fault {
    /// The fault `OOMLAB_FAULT` sets for peer `rank`, if any.
    pub fn from_env(rank: usize) -> Option<Self> {
        let text = std::env::var(FAULT_ENV).ok()?;
        Self::parse(&text).filter(|f| f.rank == rank)
    }

    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(':');
        let kind = match parts.next()? {
            "overflow" => Kind::Overflow,
            "fail" => Kind::Fail,
            "hang" => Kind::Hang,
            _ => return None,
        };
        let rank = parts.next()?.parse().ok()?;
        let window = parts.next()?.parse().ok()?;
        parts
            .next()
            .is_none()
            .then_some(Self { kind, rank, window })
    }

    /// Strikes, if `window` is its window: before this peer's gradients are sent.
    pub fn before_reduce<B: Backend>(
        self,
        window: usize,
        tensors: &mut [B::FloatTensorPrimitive],
    ) -> Result<(), DistributedError> {
        if window != self.window {
            return Ok(());
        }
        match self.kind {
            Kind::Overflow => {
                if let Some(first) = tensors.first_mut() {
                    let t = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(first.clone()));
                    let inf = t.ones_like().mul_scalar(f32::INFINITY);
                    *first = inf.into_primitive().tensor();
                }
                Ok(())
            }
            Kind::Fail => Err(DistributedError::Injected {
                rank: self.rank,
                window,
            }),
            Kind::Hang => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_strictly() {
        let f = Fault::parse("overflow:1:3").unwrap();
        assert_eq!((f.kind, f.rank, f.window), (Kind::Overflow, 1, 3));
        for bad in [
            "",
            "overflow",
            "overflow:1",
            "overflow:1:3:4",
            "melt:1:3",
            "fail:x:1",
        ] {
            assert_eq!(Fault::parse(bad), None, "{bad}");
        }
    }
}
