//! `[mistakes]`: teaching switches that reproduce two common memory mistakes on purpose, so
//! that their cost can be measured beside the fix. Both are off by default; no config in
//! `configs/` turns them on.

use serde::{Deserialize, Serialize};

/// `[mistakes]` as written (and validated: two booleans need no more).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Mistakes {
    /// Evaluate the model as it trains, on the autodiff backend, instead of `model.valid()`:
    /// PyTorch's evaluation without `torch.no_grad()` (in Burn `valid()` is also
    /// `model.eval()`, so batch norm then normalises with batch statistics too).
    pub eval_with_autograd: bool,
    /// Keep a running sum of every loss *tensor* instead of its number: PyTorch's
    /// `total_loss += loss`. Training and evaluation both keep theirs until they end.
    pub keep_losses: bool,
}

impl Mistakes {
    /// Each switch by its TOML name, with whether it is on.
    pub fn switches(self) -> [(&'static str, bool); 2] {
        [
            ("eval_with_autograd", self.eval_with_autograd),
            ("keep_losses", self.keep_losses),
        ]
    }

    /// Whether any switch is on.
    pub fn any(self) -> bool {
        self.switches().iter().any(|(_, on)| *on)
    }

    /// The switches `names` names on, the others off; `None` when a name is no switch.
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<Self> {
        let mut made = Self::default();
        for name in names {
            let switch = match name {
                "eval_with_autograd" => &mut made.eval_with_autograd,
                "keep_losses" => &mut made.keep_losses,
                _ => return None,
            };
            *switch = true;
        }
        Some(made)
    }
}
