//! `trainer compare`'s outputs: a Markdown table (printed and `report.md`), `report.csv`,
//! `report.json`, `memory.svg`, a bar chart of measured and predicted peaks per config, and
//! `terms.svg`, the predicted peak stacked by term ([`super::terms`]).

use std::path::Path;

use anyhow::Context;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::Row;
use crate::config::{Mistakes, PrecisionMode};
use crate::memory::{human, ProbeKind};

const MIB: f64 = (1u64 << 20) as f64;

/// The columns of the table and the CSV, with each row's cell.
fn columns(r: &Row) -> [(&'static str, String); 15] {
    let opt = |v: Option<&str>| v.unwrap_or("—").to_string();
    let bytes = |b: Option<u64>| b.map_or_else(|| "—".into(), human);
    let batch = match (r.batch_size, r.accum_steps) {
        (Some(b), Some(k)) => format!("{b} × {k}"),
        _ => "—".into(),
    };
    [
        ("config", r.name.clone()),
        ("model", opt(r.model.as_deref())),
        (
            "params",
            r.parameters
                .map_or("—".into(), |p| format!("{:.2} M", p as f64 / 1e6)),
        ),
        ("precision", opt(r.precision.map(PrecisionMode::name))),
        ("BN", r.batch_norm.clone().unwrap_or_else(|| "—".into())),
        ("batch × accum", batch),
        ("predicted", bytes(r.predicted_peak_bytes)),
        ("peak in use", bytes(r.peak_bytes)),
        ("training peak", bytes(r.training_peak_bytes)),
        (
            "peak reserved",
            match (&r.memory_probe, r.reserved_peak_bytes) {
                (_, Some(b)) => match r.reserved_after_step_bytes {
                    Some(after) => format!("{} ({} after step)", human(b), human(after)),
                    None => human(b),
                },
                (Some(ProbeKind::Heap), None) => "n/a (heap)".into(),
                _ => "—".into(),
            },
        ),
        (
            "images/s",
            // A language model's sample is a sequence: its rate is counted in tokens.
            r.images_per_sec.map_or("—".into(), |v| {
                format!("{:.0}", v * r.seq_len.unwrap_or(1) as f64)
            }),
        ),
        (
            "final loss",
            r.final_train_loss.map_or("—".into(), |v| format!("{v:.4}")),
        ),
        (
            "eval acc",
            r.eval_accuracy
                .map_or("—".into(), |v| format!("{:.1}%", 100.0 * v)),
        ),
        (
            "skipped",
            r.skipped_steps.map_or("—".into(), |v| v.to_string()),
        ),
        ("error", r.error.clone().unwrap_or_default()),
    ]
}

/// What the rate column counts: images (CNNs), tokens (language models), or each row its own.
#[derive(Clone, Copy)]
enum Rates {
    Images,
    Tokens,
    Both,
}

/// The peak the ratios compare: the training peak (above what was resident before the
/// model, so a CPU heap's data set is not in it), or the whole peak where none was measured.
fn ratio_peak(r: &Row) -> Option<u64> {
    r.training_peak_bytes.or(r.peak_bytes)
}

/// Columns a table keeps even when every row has the same value: what it compares.
const ALWAYS: [&str; 3] = ["config", "training peak", "vs first"];

/// The comparison as a Markdown table; "vs first" is each training peak over the first
/// row's. With two rows or more, a column whose cell is the same in every row leaves the
/// table for a "Same in every row" line under it, so the table shows what differs. The
/// evaluation's peak is a column only when a row made a `[mistakes]` switch.
pub fn markdown(rows: &[Row]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let eval = rows.iter().any(|r| r.mistakes.is_some_and(Mistakes::any));
    let rates = match rows.iter().filter(|r| r.seq_len.is_some()).count() {
        0 => Rates::Images,
        n if n == rows.len() => Rates::Tokens,
        _ => Rates::Both,
    };
    let table: Vec<Vec<(&str, String)>> = rows
        .iter()
        .map(|r| {
            let mut cells: Vec<(&str, String)> = columns(r).into();
            let ratio = match (ratio_peak(r), ratio_peak(first)) {
                (Some(p), Some(f)) if f > 0 => format!("{:.2}×", p as f64 / f as f64),
                _ => "—".into(),
            };
            cells.insert(9, ("vs first", ratio));
            if let Some(rate) = cells.iter_mut().find(|c| c.0 == "images/s") {
                match (rates, r.seq_len) {
                    (Rates::Images, _) => {}
                    (Rates::Tokens, _) => rate.0 = "tokens/s",
                    (Rates::Both, seq) => {
                        rate.0 = "throughput";
                        if rate.1 != "—" {
                            let unit = if seq.is_some() {
                                "tokens/s"
                            } else {
                                "images/s"
                            };
                            rate.1 = format!("{} {unit}", rate.1);
                        }
                    }
                }
            }
            if eval {
                let peak = match (r.eval_peak_bytes, r.eval_added_bytes) {
                    (Some(p), Some(a)) => format!("{} (+{} by eval)", human(p), human(a)),
                    _ => "—".into(),
                };
                cells.insert(10, ("eval peak", peak));
            }
            cells
        })
        .collect();
    let same = |k: usize| rows.len() > 1 && table.iter().all(|row| row[k].1 == table[0][k].1);
    let (kept, common): (Vec<usize>, Vec<usize>) =
        (0..table[0].len()).partition(|&k| ALWAYS.contains(&table[0][k].0) || !same(k));
    let line = |cells: Vec<&str>| format!("| {} |\n", cells.join(" | "));
    let mut out = line(kept.iter().map(|&k| table[0][k].0).collect());
    out.push_str(&format!("|{}\n", "---|".repeat(kept.len())));
    for row in &table {
        let cells: Vec<String> = kept.iter().map(|&k| row[k].1.replace('|', "\\|")).collect();
        out.push_str(&line(cells.iter().map(String::as_str).collect()));
    }
    let shared: Vec<String> = common
        .iter()
        .map(|&k| &table[0][k])
        .filter(|(_, v)| !v.is_empty() && v != "—")
        .map(|(h, v)| format!("{h} {v}"))
        .collect();
    if !shared.is_empty() {
        out.push_str(&format!("\nSame in every row: {}.\n", shared.join(" · ")));
    }
    out
}

/// The comparison as CSV, raw numbers (bytes, fractions) for other tools.
pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from(
        "config,name,model,parameters,backend,precision,batch_norm,batch_size,accum_steps,predicted_peak_bytes,\
         peak_bytes,training_peak_bytes,reserved_peak_bytes,reserved_after_step_bytes,memory_probe,images_per_sec,\
         final_train_loss,eval_accuracy,skipped_steps,error\n",
    );
    let s = |v: Option<&str>| quote(v.unwrap_or(""));
    let n = |v: Option<String>| v.unwrap_or_default();
    for r in rows {
        let backend = r.backend.as_ref().map(ToString::to_string);
        let cells = [
            quote(&r.config),
            quote(&r.name),
            s(r.model.as_deref()),
            n(r.parameters.map(|v| v.to_string())),
            s(backend.as_deref()),
            s(r.precision.map(PrecisionMode::name)),
            s(r.batch_norm.as_deref()),
            n(r.batch_size.map(|v| v.to_string())),
            n(r.accum_steps.map(|v| v.to_string())),
            n(r.predicted_peak_bytes.map(|v| v.to_string())),
            n(r.peak_bytes.map(|v| v.to_string())),
            n(r.training_peak_bytes.map(|v| v.to_string())),
            n(r.reserved_peak_bytes.map(|v| v.to_string())),
            n(r.reserved_after_step_bytes.map(|v| v.to_string())),
            s(r.memory_probe.map(ProbeKind::name)),
            n(r.images_per_sec.map(|v| format!("{v:.1}"))),
            n(r.final_train_loss.map(|v| format!("{v:.6}"))),
            n(r.eval_accuracy.map(|v| format!("{v:.6}"))),
            n(r.skipped_steps.map(|v| v.to_string())),
            s(r.error.as_deref()),
        ];
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// A CSV field, quoted when it holds a comma, quote or newline.
fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

/// Grouped bars per config: measured peak in use beside the estimate, in MiB, as SVG text.
pub fn chart(rows: &[Row], title: &str, note: Option<&str>) -> anyhow::Result<String> {
    // Each group is wide enough for its label (about 7 px a character at 12 px sans-serif).
    let longest = rows
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0) as u32;
    let group = (7 * longest + 16).max(110);
    let width = (160 + group * rows.len() as u32).max(640);
    let mut svg = String::new();
    let root = SVGBackend::with_string(&mut svg, (width, 480)).into_drawing_area();
    let draw = |e: DrawingAreaErrorKind<std::io::Error>| anyhow::anyhow!("drawing the chart: {e}");
    let plot = noted(&root, note)?;
    let top = rows
        .iter()
        .flat_map(|r| [r.peak_bytes, r.predicted_peak_bytes])
        .flatten()
        .max()
        .unwrap_or(1) as f64
        / MIB;
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        // Headroom above the tallest bar for the legend.
        .build_cartesian_2d(0f64..rows.len() as f64, 0f64..top * 1.3)
        .map_err(draw)?;
    row_mesh(&mut chart, rows, "peak memory (MiB)")?;
    type Value = fn(&Row) -> Option<u64>;
    let series: [(&str, RGBAColor, f64, Value); 2] = [
        ("measured peak in use", BLUE.mix(0.8), 0.1, |r| r.peak_bytes),
        (
            "predicted (trainer estimate)",
            RGBColor(230, 140, 30).mix(0.8),
            0.5,
            |r| r.predicted_peak_bytes,
        ),
    ];
    for (label, color, offset, value) in series {
        let bars = rows.iter().enumerate().filter_map(|(i, r)| {
            let x = i as f64 + offset;
            value(r).map(|b| Rectangle::new([(x, 0.0), (x + 0.4, b as f64 / MIB)], color.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(draw)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    let failed = rows.iter().enumerate().filter(|(_, r)| r.error.is_some());
    chart
        .draw_series(failed.map(|(i, _)| {
            Text::new(
                "failed",
                (i as f64 + 0.3, top * 0.05),
                ("sans-serif", 14).into_font(),
            )
        }))
        .map_err(draw)?;
    crate::report::legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(draw)?;
    root.present().map_err(draw)?;
    // The backend writes into `svg` until every area over it is gone.
    drop((chart, plot, root));
    Ok(svg)
}

/// Fills `root` white and writes `note` (when given) along its foot; the area above is the
/// chart's.
pub(super) fn noted<'a>(
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    note: Option<&str>,
) -> anyhow::Result<DrawingArea<SVGBackend<'a>, plotters::coord::Shift>> {
    let draw = |e: DrawingAreaErrorKind<std::io::Error>| anyhow::anyhow!("drawing the chart: {e}");
    root.fill(&WHITE).map_err(draw)?;
    let Some(note) = note else {
        return Ok(root.clone());
    };
    let height = root.dim_in_pixel().1;
    let (plot, foot) = root.split_vertically(height.saturating_sub(22));
    let style = ("sans-serif", 12).into_text_style(&foot);
    foot.draw_text(note, &style, (16, 4)).map_err(draw)?;
    Ok(plot)
}

/// The axes both charts share: a group of width 1 per row, its name centred under it, and
/// `y_desc` up the side.
pub(super) fn row_mesh(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    rows: &[Row],
    y_desc: &str,
) -> anyhow::Result<()> {
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            let centred = (x - i as f64 - 0.5).abs() < 1e-6;
            match rows.get(i) {
                Some(r) if centred => r.name.clone(),
                _ => String::new(),
            }
        })
        .y_desc(y_desc)
        .draw()
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))
}

/// Writes report.md, report.csv, report.json, memory.svg and terms.svg into `dir`, and the
/// line charts the runs have data for (steps.svg, timeline.svg, batch.svg); `note` goes under
/// every chart.
pub fn write_all(
    rows: &[Row],
    dir: &Path,
    heading: &str,
    note: Option<&str>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        crate::report::write_atomic(&path, text.as_bytes())
    };
    let footnote = "\"training peak\" is the peak above what was in use before the model was \
                built (on the CPU heap, the data set), as on a GPU, whose memory holds no data set; \
                \"vs first\" compares training peaks.";
    write(
        "report.md",
        format!("{heading}\n\n{}\n{footnote}\n", markdown(rows)),
    )?;
    write("report.csv", csv(rows))?;
    write("report.json", serde_json::to_string_pretty(rows)? + "\n")?;
    let title = "Peak memory per config: measured and predicted";
    write("memory.svg", chart(rows, title, note)?)?;
    write("terms.svg", super::terms::chart(rows, note)?)?;
    let lines = [
        ("steps.svg", super::lines::steps(rows, note)?),
        ("timeline.svg", super::lines::timeline(rows, note)?),
        ("batch.svg", super::lines::batch(rows, note)?),
        ("seq_len.svg", super::lines::seq_len(rows, note)?),
    ];
    for (name, svg) in lines {
        match svg {
            Some(svg) => write(name, svg)?,
            // A chart from an earlier compare in this folder would not be this one's.
            None => match std::fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("removing the old {name}"))
                }
                _ => {}
            },
        }
    }
    Ok(())
}
