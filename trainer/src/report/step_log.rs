//! Every optimizer window of a run: loss, learning rate, loss scale, whether the step was
//! skipped, and the bytes in use (and reserved) after it. Written to `<output_dir>/steps.csv` at every checkpoint and at the end; with loss
//! scaling on, also drawn as `<output_dir>/loss_scale.svg` (the scale over the run, skipped
//! steps marked).

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use crate::training::step::Outcome;

/// One window.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Optimizer steps taken before this window.
    pub step: usize,
    /// The window's training loss.
    pub loss: f64,
    /// The loss scale the window's backward used (1 when scaling is off).
    pub scale: f64,
    /// The learning rate, when the step was taken.
    pub lr: Option<f64>,
    /// Bytes in use after the step, where the probe measured them.
    pub in_use: Option<u64>,
    /// Bytes the allocator reserved after the step (pooling allocators only).
    pub reserved: Option<u64>,
}

/// The windows of one run, in order.
#[derive(Debug, Default)]
pub struct StepLog {
    entries: Vec<Entry>,
}

impl StepLog {
    /// Records one window.
    pub fn push(&mut self, step: usize, loss: f64, scale: f64, outcome: Outcome) {
        let lr = match outcome {
            Outcome::Stepped { lr } => Some(lr),
            Outcome::Skipped => None,
        };
        self.entries.push(Entry {
            step,
            loss,
            scale,
            lr,
            in_use: None,
            reserved: None,
        });
    }

    /// The memory after the last window's step.
    pub fn set_memory(&mut self, in_use: Option<u64>, reserved: Option<u64>) {
        if let Some(last) = self.entries.last_mut() {
            (last.in_use, last.reserved) = (in_use, reserved);
        }
    }

    /// The log a checkpoint saved ([`csv`](Self::csv)'s format, or the older one without the
    /// memory columns), to continue it on resume. Rows that do not parse are dropped: the file
    /// was verified by its checksum.
    pub fn parse(csv: &str) -> Self {
        let entries = csv
            .lines()
            .skip(1)
            .filter_map(|line| {
                let f: Vec<&str> = line.split(',').collect();
                let (step, loss, lr, scale, memory) = match f[..] {
                    [_, step, loss, lr, scale, _] => (step, loss, lr, scale, ["", ""]),
                    [_, step, loss, lr, scale, _, in_use, reserved] => {
                        (step, loss, lr, scale, [in_use, reserved])
                    }
                    _ => return None,
                };
                let bytes = |v: &str| v.parse::<u64>().ok();
                Some(Entry {
                    step: step.parse().ok()?,
                    loss: loss.parse().ok()?,
                    scale: scale.parse().ok()?,
                    lr: if lr.is_empty() {
                        None
                    } else {
                        Some(lr.parse().ok()?)
                    },
                    in_use: bytes(memory[0]),
                    reserved: bytes(memory[1]),
                })
            })
            .collect();
        Self { entries }
    }

    /// Bytes in use and reserved after each window, in order.
    pub fn memory(&self) -> impl Iterator<Item = (Option<u64>, Option<u64>)> + '_ {
        self.entries.iter().map(|e| (e.in_use, e.reserved))
    }

    /// The losses of the windows that stepped, in order.
    pub fn step_losses(&self) -> impl Iterator<Item = f64> + '_ {
        self.entries
            .iter()
            .filter(|e| e.lr.is_some())
            .map(|e| e.loss)
    }

    /// `window,step,loss,lr,loss_scale,skipped,in_use_bytes,reserved_bytes` rows (a figure
    /// the probe did not measure is empty).
    pub fn csv(&self) -> String {
        let mut out =
            String::from("window,step,loss,lr,loss_scale,skipped,in_use_bytes,reserved_bytes\n");
        let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        for (i, e) in self.entries.iter().enumerate() {
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{}\n",
                i + 1,
                e.step,
                e.loss,
                e.lr.map_or(String::new(), |lr| lr.to_string()),
                e.scale,
                e.lr.is_none(),
                opt(e.in_use),
                opt(e.reserved)
            ));
        }
        out
    }

    /// Writes steps.csv, and loss_scale.svg when `scaled`, into `dir`.
    pub fn write(&self, dir: &Path, scaled: bool) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let csv = dir.join("steps.csv");
        super::write_atomic(&csv, self.csv().as_bytes())?;
        if scaled && !self.entries.is_empty() {
            let svg = self.chart()?;
            super::write_atomic(&dir.join("loss_scale.svg"), svg.as_bytes())?;
        }
        Ok(())
    }

    /// The loss scale per window on a log axis, as SVG text; a red dot where the step was
    /// skipped.
    pub fn chart(&self) -> anyhow::Result<String> {
        let mut svg = String::new();
        self.draw(&mut svg)?;
        Ok(svg)
    }

    fn draw(&self, svg: &mut String) -> anyhow::Result<()> {
        let draw = |e: DrawingAreaErrorKind<std::io::Error>| anyhow::anyhow!("drawing {e}");
        let root = SVGBackend::with_string(svg, (800, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(draw)?;
        let n = self.entries.len() as f64;
        let (lo, hi) = self
            .entries
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), e| {
                (lo.min(e.scale), hi.max(e.scale))
            });
        let skipped = self.entries.iter().filter(|e| e.lr.is_none()).count();
        let caption = format!("Dynamic loss scale per window ({skipped} steps skipped)");
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..n + 1.0, (lo / 2.0..hi * 2.0).log_scale())
            .map_err(draw)?;
        chart
            .configure_mesh()
            .x_desc("window (micro-batch group = one optimizer step when not skipped)")
            .y_desc("loss scale")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(draw)?;
        let line = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| ((i + 1) as f64, e.scale));
        chart
            .draw_series(std::iter::once(PathElement::new(
                line.collect::<Vec<_>>(),
                BLUE.stroke_width(2),
            )))
            .map_err(draw)?
            .label("loss scale")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE.stroke_width(2)));
        let skips = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.lr.is_none());
        chart
            .draw_series(
                skips.map(|(i, e)| Circle::new(((i + 1) as f64, e.scale), 4, RED.filled())),
            )
            .map_err(draw)?
            .label("step skipped (inf/NaN gradient)")
            .legend(|(x, y)| Circle::new((x + 8, y), 4, RED.filled()));
        crate::report::legend(&mut chart, SeriesLabelPosition::LowerRight).map_err(draw)?;
        root.present().map_err(draw)?;
        Ok(())
    }
}
