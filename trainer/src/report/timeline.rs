//! `memory_timeline.csv` and `memory_timeline.svg`: bytes in use (and reserved, on CubeCL) at
//! every sample of the window that peaked, forward then backward per micro-batch, then the
//! optimizer step. The CPU heap and the GPU pools draw the same picture.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use crate::memory::timeline::{Sample, Timeline, WindowPhase};

const MIB: f64 = 1024.0 * 1024.0;

/// Writes both files into `dir` (nothing when no window was sampled).
pub fn write(dir: &Path, timeline: &Timeline) -> anyhow::Result<()> {
    let samples = timeline.peak_window();
    if samples.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    super::write_atomic(&dir.join("memory_timeline.csv"), timeline.csv().as_bytes())?;
    let svg = chart(samples).map_err(|e| anyhow::anyhow!("drawing the memory timeline: {e}"))?;
    super::write_atomic(&dir.join("memory_timeline.svg"), svg.as_bytes())
}

/// The chart as SVG text: backward passes shaded, the peak marked.
fn chart(samples: &[Sample]) -> Result<String, Box<dyn std::error::Error>> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let n = samples.len();
        let mib = |b: u64| b as f64 / MIB;
        let top = samples
            .iter()
            .map(|s| s.reserved.unwrap_or(0).max(s.in_use))
            .max()
            .unwrap_or(0);
        let (peak_at, peak) = samples
            .iter()
            .enumerate()
            .max_by_key(|(i, s)| (s.in_use, std::cmp::Reverse(*i)))
            .map(|(i, s)| (i, *s))
            .ok_or("no samples")?;
        let caption = format!(
            "Memory over the peak window: {:.1} MiB in use after {} ({})",
            mib(peak.in_use),
            peak.event.label(),
            peak.event.phase().name()
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..(n.max(2) - 1) as f64, 0f64..mib(top) * 1.1 + 0.1)?;
        let label = |v: &f64| {
            let i = v.round().max(0.0) as usize;
            samples
                .get(i)
                .map_or(String::new(), |s| s.event.label().to_string())
        };
        chart
            .configure_mesh()
            .x_desc("sample: forward (white) → backward (shaded) per micro-batch → optimizer step")
            .y_desc("MiB")
            .x_label_formatter(&label)
            .draw()?;
        let shade = RGBColor(255, 220, 180).mix(0.5).filled();
        let backward = samples
            .iter()
            .enumerate()
            .filter(|(_, s)| s.event.phase() == WindowPhase::Backward);
        chart.draw_series(backward.map(|(i, _)| {
            let x = i as f64;
            Rectangle::new([(x - 0.5, 0.0), (x + 0.5, mib(top) * 1.1 + 0.1)], shade)
        }))?;
        let line = |value: fn(&Sample) -> Option<u64>| -> Vec<(f64, f64)> {
            samples
                .iter()
                .enumerate()
                .filter_map(|(i, s)| value(s).map(|b| (i as f64, mib(b))))
                .collect()
        };
        let reserved = line(|s| s.reserved);
        if !reserved.is_empty() {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    reserved,
                    BLACK.stroke_width(1),
                )))?
                .label("reserved (allocator pools)")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK));
        }
        chart
            .draw_series(std::iter::once(PathElement::new(
                line(|s| Some(s.in_use)),
                BLUE.stroke_width(2),
            )))?
            .label("in use (live tensors)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(std::iter::once(Circle::new(
                (peak_at as f64, mib(peak.in_use)),
                5,
                RED.filled(),
            )))?
            .label("peak sample")
            .legend(|(x, y)| Circle::new((x + 8, y), 4, RED.filled()));
        crate::report::legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        root.present()?;
    }
    Ok(svg)
}
