//! The host side: the data set lives in host memory on every backend. A config whose data set
//! cannot fit the machine is refused before anything is allocated (an allocation abort is not
//! an error anyone can read).

use crate::config::Settings;
use crate::memory::human;

/// The data set of a config does not fit this machine's memory.
#[derive(Debug, thiserror::Error)]
#[error(
    "out of memory before training: the data set needs {} of host memory, this machine has {} \
     (lower data.train_size or data.eval_size)",
    human(*needs),
    human(*has)
)]
pub struct HostMemory {
    /// Bytes the data set takes.
    pub needs: u64,
    /// The machine's memory.
    pub has: u64,
}

/// `find-batch-size`: not even the smallest value (a micro-batch or a seq_len of 1) fits
/// (exit 3).
#[derive(Debug, thiserror::Error)]
#[error("out of memory: even {what} does not fit{}: see the trial above", limit.map_or_else(String::new, |l| format!(" in {}", human(l))))]
pub struct NothingFits {
    /// The smallest value tried: "a micro-batch of 1".
    pub what: &'static str,
    /// The limit a trial had to stay under, where the budget set one.
    pub limit: Option<u64>,
}

/// Bytes the data set of `settings` takes in host memory (u8 pixels and a label per image, or
/// a byte per token).
pub fn data_bytes(settings: &Settings) -> u64 {
    settings.data.host_bytes(settings.input_size)
}

/// The machine's memory (`MemTotal`), where the system says.
pub fn total_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// An error when the data set alone needs more than the machine has.
pub fn check(settings: &Settings) -> Result<(), HostMemory> {
    let needs = data_bytes(settings);
    match total_memory() {
        Some(has) if needs > has => Err(HostMemory { needs, has }),
        _ => Ok(()),
    }
}
