//! `trainer compare`'s line charts, one line per config:
//!
//! - `steps.svg`: bytes in use (solid) and reserved (dashed, pooling allocators only) after
//!   every optimizer step, from each run's `steps.csv`: a leak is a line that climbs, a cache
//!   that is never freed a reserved line above the in-use one.
//! - `timeline.svg`: bytes in use over the window that peaked, forward then backward, from each
//!   run's `memory_timeline.csv`, above what was resident before the model.
//! - `batch.svg` (only with `--sweep train.batch_size=…`): the training peak against the batch
//!   size, with each config's least-squares line, its slope (bytes per image) and intercept
//!   (what does not scale with the batch).
//! - `seq_len.svg` (only with `--sweep model.seq_len=…` over three lengths or more): a
//!   language model's training peak against its sequence length, with each config's
//!   least-squares quadratic, its seq² and seq coefficients, and whether the peak grows
//!   quadratically or linearly over the range measured.

use std::path::Path;

use plotters::prelude::*;

use super::{Row, StepMemory};
use crate::memory::timeline::WindowPhase;

const MIB: f64 = (1u64 << 20) as f64;

/// The colour of row `i`'s line.
fn colour(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    PALETTE[i % PALETTE.len()]
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// A chart with a caption, axis names and `note` (when given) under it, drawn by `body` into
/// SVG text: the callers write it atomically.
fn svg(
    size: (u32, u32),
    caption: &str,
    (x, y): (std::ops::Range<f64>, std::ops::Range<f64>),
    (x_desc, y_desc): (&str, &str),
    note: Option<&str>,
    body: impl FnOnce(&mut Chart) -> Result<(), Box<dyn std::error::Error>>,
) -> anyhow::Result<String> {
    let mut text = String::new();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::with_string(&mut text, size).into_drawing_area();
        let plot = super::report::noted(&root, note)?;
        let mut chart = ChartBuilder::on(&plot)
            .caption(caption, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x, y)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()?;
        body(&mut chart)?;
        crate::report::legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        root.present()?;
        Ok(())
    })();
    drawn.map_err(|e| anyhow::anyhow!("drawing {caption}: {e}"))?;
    Ok(text)
}

/// A range around `values` with a margin, so a nearly flat line is still seen to move.
fn around(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return 0.0..1.0;
    }
    let pad = ((hi - lo) * 0.15).max(hi.abs() * 1e-4).max(1e-3);
    // Bytes are never negative; room above for the legend.
    (lo - pad).max(0.0_f64.min(lo))..(hi + pad * 2.5)
}

/// `steps.svg`, or `None` when no run logged memory per step.
pub fn steps(rows: &[Row], note: Option<&str>) -> anyhow::Result<Option<String>> {
    let values = rows
        .iter()
        .flat_map(|r| r.per_step.iter())
        .flat_map(|&(u, r)| [u, r])
        .flatten();
    if values.clone().next().is_none() {
        return Ok(None);
    }
    let n = rows.iter().map(|r| r.per_step.len()).max().unwrap_or(1) as f64;
    let y = around(values.map(|b| b as f64 / MIB));
    let text = svg(
        (900, 440),
        "Memory after each optimizer step",
        (1.0..n.max(2.0), y),
        ("optimizer step (window)", "MiB"),
        note,
        |chart| {
            for (i, row) in rows.iter().enumerate() {
                let c = colour(i);
                let line = |pick: fn(&StepMemory) -> Option<u64>| {
                    row.per_step
                        .iter()
                        .enumerate()
                        .filter_map(|(k, s)| pick(s).map(|b| ((k + 1) as f64, b as f64 / MIB)))
                        .collect::<Vec<_>>()
                };
                let in_use = line(|s| s.0);
                if !in_use.is_empty() {
                    chart
                        .draw_series(std::iter::once(PathElement::new(in_use, c.stroke_width(2))))?
                        .label(format!("{}: in use", row.name))
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                        });
                }
                let reserved = line(|s| s.1);
                if !reserved.is_empty() {
                    chart
                        .draw_series(DashedLineSeries::new(reserved, 6, 4, c.stroke_width(1)))?
                        .label(format!("{}: reserved", row.name))
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 6, y)], c.stroke_width(1))
                        });
                }
            }
            Ok(())
        },
    )?;
    Ok(Some(text))
}

/// `timeline.svg`, or `None` when no run wrote a timeline.
pub fn timeline(rows: &[Row], note: Option<&str>) -> anyhow::Result<Option<String>> {
    let resident = |r: &Row| match (r.peak_bytes, r.training_peak_bytes) {
        (Some(p), Some(t)) => p.saturating_sub(t),
        _ => 0,
    };
    let top = rows
        .iter()
        .flat_map(|r| {
            r.timeline
                .iter()
                .map(move |s| s.1.saturating_sub(resident(r)))
        })
        .max();
    let Some(top) = top else {
        return Ok(None);
    };
    let text = svg(
        (900, 440),
        "Memory over the peak window, forward then backward",
        (0.0..1.0, 0.0..top as f64 / MIB * 1.35 + 0.1),
        (
            "position in the window: forward (rising) → backward (falling) → step",
            "MiB in use above what was resident before the model",
        ),
        note,
        |chart| {
            for (i, row) in rows.iter().enumerate() {
                let (c, base, n) = (colour(i), resident(row), row.timeline.len());
                if n == 0 {
                    continue;
                }
                let points: Vec<(f64, f64)> = row
                    .timeline
                    .iter()
                    .enumerate()
                    .map(|(k, s)| {
                        let x = k as f64 / (n.max(2) - 1) as f64;
                        (x, s.1.saturating_sub(base) as f64 / MIB)
                    })
                    .collect();
                let forward_end = row
                    .timeline
                    .iter()
                    .rposition(|s| s.0 == WindowPhase::Forward);
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        points.clone(),
                        c.stroke_width(2),
                    )))?
                    .label(row.name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                    });
                // The end of forward: where the saved activations are all alive.
                if let Some(k) = forward_end {
                    chart.draw_series(std::iter::once(Circle::new(points[k], 4, c.filled())))?;
                }
            }
            Ok(())
        },
    )?;
    Ok(Some(text))
}

/// Least-squares `y = slope·x + intercept` through `points` (at least two distinct x).
pub fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    (points.len() >= 2 && sxx > 0.0).then(|| (sxy / sxx, my - sxy / sxx * mx))
}

/// Each config's `(x, training peak in MiB)` points, `x` read from each run's row (runs without
/// it or without a peak left out), grouped by config in order.
fn peaks_by_config(rows: &[Row], x: fn(&Row) -> Option<usize>) -> Vec<(&str, Vec<(f64, f64)>)> {
    let mut groups: Vec<(&str, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let (Some(x), Some(p)) = (x(r), r.training_peak_bytes.or(r.peak_bytes)) else {
            continue;
        };
        let point = (x as f64, p as f64 / MIB);
        match groups.iter_mut().find(|(c, _)| *c == r.config) {
            Some((_, points)) => points.push(point),
            None => groups.push((&r.config, vec![point])),
        }
    }
    groups
}

/// `batch.svg`: each config's training peak per batch size (rows grouped by config, in
/// order), with its fitted line; `None` when no config has two measured batch sizes.
pub fn batch(rows: &[Row], note: Option<&str>) -> anyhow::Result<Option<String>> {
    let mut groups = peaks_by_config(rows, |r| r.batch_size);
    groups.retain(|(_, p)| fit(p).is_some());
    if groups.is_empty() {
        return Ok(None);
    }
    let all = || groups.iter().flat_map(|(_, p)| p.iter());
    let x_max = all().map(|p| p.0).fold(1.0, f64::max);
    let y_max = all().map(|p| p.1).fold(1.0, f64::max);
    let text = svg(
        (900, 460),
        "Training peak against batch size",
        (0.0..x_max * 1.05, 0.0..y_max * 1.4),
        ("batch size (images per micro-batch)", "training peak (MiB)"),
        note,
        |chart| {
            for (i, (config, points)) in groups.iter().enumerate() {
                let c = colour(i);
                let Some((slope, intercept)) = fit(points) else {
                    continue;
                };
                let name = Path::new(config)
                    .file_stem()
                    .map_or(config.to_string(), |s| s.to_string_lossy().into_owned());
                let line = vec![
                    (0.0, intercept),
                    (x_max * 1.05, intercept + slope * x_max * 1.05),
                ];
                chart
                    .draw_series(DashedLineSeries::new(line, 6, 4, c.stroke_width(1)))?
                    .label(format!(
                        "{name}: {:.3} MiB per image + {:.1} MiB",
                        slope, intercept
                    ))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                    });
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
            }
            Ok(())
        },
    )?;
    Ok(Some(text))
}

/// Least-squares `y = a + b·x + c·x²` through `points` (at least three distinct x): `[a, b,
/// c]`. Solved on x scaled to [0, 1] (the normal equations of raw sequence lengths are
/// ill-conditioned), then scaled back.
pub fn fit_quadratic(points: &[(f64, f64)]) -> Option<[f64; 3]> {
    let mut xs: Vec<f64> = points.iter().map(|p| p.0).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let top = xs.last().copied().filter(|&t| t > 0.0 && xs.len() >= 3)?;
    // Normal equations M·β = v for the basis 1, u, u² with u = x / top.
    let mut m = [[0.0f64; 4]; 3];
    for &(x, y) in points {
        let u = x / top;
        let basis = [1.0, u, u * u];
        for i in 0..3 {
            for j in 0..3 {
                m[i][j] += basis[i] * basis[j];
            }
            m[i][3] += basis[i] * y;
        }
    }
    // Gaussian elimination with partial pivoting.
    for col in 0..3 {
        let pivot = (col..3).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        m.swap(col, pivot);
        if m[col][col].abs() < 1e-12 {
            return None;
        }
        let pivot_row = m[col];
        for (_, row) in m.iter_mut().enumerate().filter(|(r, _)| *r != col) {
            let f = row[col] / pivot_row[col];
            for (v, p) in row.iter_mut().zip(pivot_row).skip(col) {
                *v -= f * p;
            }
        }
    }
    let beta = [0, 1, 2].map(|i| m[i][3] / m[i][i]);
    Some([beta[0], beta[1] / top, beta[2] / (top * top)])
}

/// How a fitted peak grows over `0..=x_max`: quadratically when its x² term is at least a
/// tenth of what the peak adds over that range, else linearly.
pub fn growth([_, b, c]: [f64; 3], x_max: f64) -> &'static str {
    let (quadratic, linear) = (c * x_max * x_max, b * x_max);
    match quadratic.abs() >= 0.1 * (quadratic + linear).abs() {
        true => "quadratic",
        false => "linear",
    }
}

/// `seq_len.svg`: each config's training peak per sequence length (rows grouped by config),
/// with its fitted quadratic; `None` when no config has three measured lengths.
pub fn seq_len(rows: &[Row], note: Option<&str>) -> anyhow::Result<Option<String>> {
    let mut groups = peaks_by_config(rows, |r| r.seq_len);
    groups.retain(|(_, p)| fit_quadratic(p).is_some());
    if groups.is_empty() {
        return Ok(None);
    }
    let all = || groups.iter().flat_map(|(_, p)| p.iter());
    let x_max = all().map(|p| p.0).fold(1.0, f64::max);
    let y_max = all().map(|p| p.1).fold(1.0, f64::max);
    let text = svg(
        (900, 460),
        "Training peak against sequence length",
        (0.0..x_max * 1.05, 0.0..y_max * 1.4),
        ("sequence length (tokens)", "training peak (MiB)"),
        note,
        |chart| {
            for (i, (config, points)) in groups.iter().enumerate() {
                let c = colour(i);
                let Some(coef) = fit_quadratic(points) else {
                    continue;
                };
                let [a, b, q] = coef;
                let name = Path::new(config)
                    .file_stem()
                    .map_or(config.to_string(), |s| s.to_string_lossy().into_owned());
                let curve: Vec<(f64, f64)> = (0..=100)
                    .map(|k| {
                        let x = x_max * 1.05 * k as f64 / 100.0;
                        (x, a + b * x + q * x * x)
                    })
                    .collect();
                chart
                    .draw_series(DashedLineSeries::new(curve, 6, 4, c.stroke_width(1)))?
                    .label(format!(
                        "{name}: {}, {:.2e} MiB·seq² + {:.3} MiB·seq + {:.1} MiB",
                        growth(coef, x_max),
                        q,
                        b,
                        a
                    ))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                    });
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
            }
            Ok(())
        },
    )?;
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::{fit_quadratic, growth};

    #[test]
    fn a_quadratic_is_recovered_and_told_from_a_line() {
        let quad: Vec<(f64, f64)> = [64.0, 128.0, 256.0, 512.0]
            .iter()
            .map(|&t| (t, 20.0 + 0.05 * t + 0.001 * t * t))
            .collect();
        let [a, b, c] = fit_quadratic(&quad).unwrap();
        assert!((a - 20.0).abs() < 1e-6 && (b - 0.05).abs() < 1e-9 && (c - 0.001).abs() < 1e-12);
        assert_eq!(growth([a, b, c], 512.0), "quadratic");
        let line: Vec<(f64, f64)> = [64.0, 128.0, 256.0, 512.0]
            .iter()
            .map(|&t| (t, 20.0 + 0.4 * t))
            .collect();
        let coef = fit_quadratic(&line).unwrap();
        assert!(coef[2].abs() < 1e-12, "{coef:?}");
        assert_eq!(growth(coef, 512.0), "linear");
        // Two lengths cannot fix a quadratic.
        assert!(fit_quadratic(&line[..2]).is_none());
    }
}
