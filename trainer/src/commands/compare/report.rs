//! `trainer compare`'s outputs: a Markdown table (printed and `report.md`), `report.csv`,
//! `report.json`, `memory.svg`, a bar chart of measured and predicted peaks per config, and
//! `terms.svg`, the predicted peak stacked by term ([`super::terms`]).

use std::path::Path;

use anyhow::Context;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::Row;
use crate::memory::human;

const MIB: f64 = (1u64 << 20) as f64;

/// The columns of the table and the CSV, with each row's cell.
fn columns(r: &Row) -> [(&'static str, String); 15] {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "—".into());
    let bytes = |b: Option<u64>| b.map_or_else(|| "—".into(), human);
    let batch = match (r.batch_size, r.accum_steps) {
        (Some(b), Some(k)) => format!("{b} × {k}"),
        _ => "—".into(),
    };
    [
        ("config", r.name.clone()),
        ("model", opt(&r.model)),
        (
            "params",
            r.parameters
                .map_or("—".into(), |p| format!("{:.2} M", p as f64 / 1e6)),
        ),
        ("precision", opt(&r.precision)),
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
                (Some(p), None) if p == "heap" => "n/a (heap)".into(),
                _ => "—".into(),
            },
        ),
        (
            "images/s",
            r.images_per_sec.map_or("—".into(), |v| format!("{v:.0}")),
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

/// The peak the ratios compare: the training peak (above what was resident before the
/// model, so a CPU heap's data set is not in it), or the whole peak where none was measured.
fn ratio_peak(r: &Row) -> Option<u64> {
    r.training_peak_bytes.or(r.peak_bytes)
}

/// The comparison as a Markdown table; "vs first" is each training peak over the first
/// row's.
pub fn markdown(rows: &[Row]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mut head: Vec<&str> = columns(first).iter().map(|(h, _)| *h).collect();
    head.insert(9, "vs first");
    let mut out = format!("| {} |\n", head.join(" | "));
    out.push_str(&format!("|{}\n", "---|".repeat(head.len())));
    for r in rows {
        let mut cells: Vec<String> = columns(r)
            .into_iter()
            .map(|(_, c)| c.replace('|', "\\|"))
            .collect();
        let ratio = match (ratio_peak(r), ratio_peak(first)) {
            (Some(p), Some(f)) if f > 0 => format!("{:.2}×", p as f64 / f as f64),
            _ => "—".into(),
        };
        cells.insert(9, ratio);
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
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
    let s = |v: &Option<String>| quote(v.as_deref().unwrap_or(""));
    let n = |v: Option<String>| v.unwrap_or_default();
    for r in rows {
        let cells = [
            quote(&r.config),
            quote(&r.name),
            s(&r.model),
            n(r.parameters.map(|v| v.to_string())),
            s(&r.backend),
            s(&r.precision),
            s(&r.batch_norm),
            n(r.batch_size.map(|v| v.to_string())),
            n(r.accum_steps.map(|v| v.to_string())),
            n(r.predicted_peak_bytes.map(|v| v.to_string())),
            n(r.peak_bytes.map(|v| v.to_string())),
            n(r.training_peak_bytes.map(|v| v.to_string())),
            n(r.reserved_peak_bytes.map(|v| v.to_string())),
            n(r.reserved_after_step_bytes.map(|v| v.to_string())),
            s(&r.memory_probe),
            n(r.images_per_sec.map(|v| format!("{v:.1}"))),
            n(r.final_train_loss.map(|v| format!("{v:.6}"))),
            n(r.eval_accuracy.map(|v| format!("{v:.6}"))),
            n(r.skipped_steps.map(|v| v.to_string())),
            s(&r.error),
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

/// Grouped bars per config: measured peak in use beside the estimate, in MiB.
pub fn chart(rows: &[Row], title: &str, path: &Path) -> anyhow::Result<()> {
    // Each group is wide enough for its label (about 7 px a character at 12 px sans-serif).
    let longest = rows
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0) as u32;
    let group = (7 * longest + 16).max(110);
    let width = (160 + group * rows.len() as u32).max(640);
    let root = SVGBackend::new(path, (width, 480)).into_drawing_area();
    let draw = |e: DrawingAreaErrorKind<std::io::Error>| anyhow::anyhow!("drawing the chart: {e}");
    root.fill(&WHITE).map_err(draw)?;
    let top = rows
        .iter()
        .flat_map(|r| [r.peak_bytes, r.predicted_peak_bytes])
        .flatten()
        .max()
        .unwrap_or(1) as f64
        / MIB;
    let mut chart = ChartBuilder::on(&root)
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
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(draw)?;
    root.present().map_err(draw)?;
    Ok(())
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

/// Writes report.md, report.csv, report.json, memory.svg and terms.svg into `dir`.
pub fn write_all(rows: &[Row], dir: &Path, heading: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        crate::report::write_atomic(&path, text.as_bytes())
    };
    let note = "\"training peak\" is the peak above what was in use before the model was \
                built (on the CPU heap, the data set), as on a GPU, whose memory holds no data set; \
                \"vs first\" compares training peaks.";
    write(
        "report.md",
        format!("{heading}\n\n{}\n{note}\n", markdown(rows)),
    )?;
    write("report.csv", csv(rows))?;
    write("report.json", serde_json::to_string_pretty(rows)? + "\n")?;
    chart(
        rows,
        "Peak memory per config: measured and predicted",
        &dir.join("memory.svg"),
    )?;
    super::terms::chart(rows, &dir.join("terms.svg"))
}
