//! What a run tells its user: the progress bar while it trains, the per-window step log
//! (steps.csv, loss_scale.svg), the memory timeline of the peak window (memory_timeline.csv,
//! .svg) and the end-of-run summary.

pub mod progress;
pub mod step_log;
pub mod summary;
pub mod timeline;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::coord::CoordTranslate;
use plotters::prelude::*;

/// Draws the chart's legend at `position`, in the framed white box every chart here uses.
pub fn legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(position)
        .draw()
}

/// `path` with `suffix` appended to its last component: `runs/amp` → `runs/amp-2`,
/// `checkpoint` → `checkpoint.partial`.
pub fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Writes `bytes` to `path` whole or not at all: into a temporary file beside it, synced, then
/// renamed over it. `path` must be absent or a regular file ([`crate::outputs::file::fault`]):
/// a link, a FIFO or a device there is an error, never replaced. On an error (a full disk) the
/// temporary file is removed and `path` is as it was; the error names the path and the OS's
/// reason.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(fault) = crate::outputs::file::fault(path) {
        anyhow::bail!(
            "writing {}: {fault}",
            printable(&path.display().to_string())
        );
    }
    let tmp = suffixed(path, ".partial");
    let written = crate::outputs::file::create_fresh(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", printable(&path.display().to_string())))
}

/// `text` safe to print on a terminal or in a report: control characters (an ANSI escape, a
/// carriage return, a newline inside a name) are written as escapes (`\u{1b}`, `\r`, `\n`).
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}
