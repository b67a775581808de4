//! `terms.svg`: each config's predicted peak as a stack of the terms the book's fixes shrink
//! (parameters, gradients, optimizer state, activations, and the data set in host memory),
//! with the measured training peak marked beside it. Accumulation and mixed precision shrink
//! the activations; a smaller optimizer the optimizer state; nothing here shrinks the data.

use plotters::prelude::*;

use super::Row;
use crate::memory::estimate::Terms;

const MIB: f64 = (1u64 << 20) as f64;

/// The stacked segments, bottom to top: label, colour and the term's bytes.
type Segment = (&'static str, RGBColor, fn(&Terms) -> u64);

const SEGMENTS: [Segment; 5] = [
    ("parameters", RGBColor(70, 110, 180), |t| t.parameters),
    ("gradients", RGBColor(230, 140, 30), |t| t.gradients),
    ("optimizer state", RGBColor(150, 90, 170), |t| {
        t.optimizer_state
    }),
    ("activations", RGBColor(80, 160, 90), |t| t.activations),
    ("data set (host memory)", RGBColor(190, 190, 190), |t| {
        t.data
    }),
];

/// The chart of `rows` as SVG text (rows without terms get an empty slot), `note` under it.
pub fn chart(rows: &[Row], note: Option<&str>) -> anyhow::Result<String> {
    let longest = rows.iter().map(|r| r.name.chars().count()).max();
    let group = (7 * longest.unwrap_or(0) as u32 + 16).max(110);
    let width = (220 + group * rows.len() as u32).max(700);
    let mut svg = String::new();
    let root = SVGBackend::with_string(&mut svg, (width, 500)).into_drawing_area();
    let draw = |e: DrawingAreaErrorKind<std::io::Error>| anyhow::anyhow!("drawing the chart: {e}");
    let plot = super::report::noted(&root, note)?;
    let total = |t: &Terms| SEGMENTS.iter().map(|(_, _, f)| f(t)).sum::<u64>();
    let top = rows
        .iter()
        .flat_map(|r| [r.terms.as_ref().map(total), r.training_peak_bytes])
        .flatten()
        .max()
        .unwrap_or(1) as f64
        / MIB;
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            "Predicted peak by term, and the measured training peak",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        // Headroom above the tallest bar for the legend.
        .build_cartesian_2d(0f64..rows.len() as f64, 0f64..top * 1.45)
        .map_err(draw)?;
    super::report::row_mesh(&mut chart, rows, "MiB")?;
    for (k, (label, color, value)) in SEGMENTS.iter().enumerate() {
        let bars = rows.iter().enumerate().filter_map(|(i, r)| {
            let t = r.terms.as_ref()?;
            let below: u64 = SEGMENTS[..k].iter().map(|(_, _, f)| f(t)).sum();
            let (y0, y1) = (below as f64 / MIB, (below + value(t)) as f64 / MIB);
            let x = i as f64 + 0.2;
            Some(Rectangle::new([(x, y0), (x + 0.6, y1)], color.filled()))
        });
        let color = *color;
        chart
            .draw_series(bars)
            .map_err(draw)?
            .label(*label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    // The measured training peak: a device's figure, to read against the four lower terms.
    let measured = rows.iter().enumerate().filter_map(|(i, r)| {
        let y = r.training_peak_bytes? as f64 / MIB;
        let x = i as f64;
        Some(PathElement::new(
            [(x + 0.12, y), (x + 0.88, y)],
            BLACK.stroke_width(3),
        ))
    });
    chart
        .draw_series(measured)
        .map_err(draw)?
        .label("measured training peak")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], BLACK.stroke_width(3)));
    crate::report::legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(draw)?;
    root.present().map_err(draw)?;
    // The backend writes into `svg` until every area over it is gone.
    drop((chart, plot, root));
    Ok(svg)
}
