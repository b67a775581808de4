//! Two trainings in one process at once, each with its own run context: each one's figures and
//! the layer boundaries its probe heard equal those of the same run alone.
//!
//! Each run, alone or not, works in its own one-thread rayon pool, as each would own its
//! device: Flex's parallel sums split their work by stealing, so under another run's load
//! the order of their float additions (and so the bits of a loss) changes with timing.

use std::path::Path;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use oomlab_engine::{Boundary, Listener, Pass};
use trainer::backend::{CpuBackend, Selected};
use trainer::distributed::Peer;
use trainer::memory::{MemoryProbe, MemoryReport, Phase};
use trainer::report::summary::Summary;
use trainer::training::{train, RunOptions};

use crate::common::settings;

type Heard = Arc<Mutex<Vec<(&'static str, Pass)>>>;

/// A probe that measures nothing and keeps every boundary crossing its run reports.
#[derive(Default)]
struct Ears(Heard);

impl MemoryProbe for Ears {
    fn sample(&mut self, _: Phase) {}
    fn report(&self) -> MemoryReport {
        MemoryReport::default()
    }
    fn listener(&self) -> Option<Listener> {
        let log = Arc::clone(&self.0);
        Some(Arc::new(move |at: Boundary, pass| {
            log.lock().unwrap().push((at.0, pass))
        }))
    }
}

/// Trains `model`'s config for three accumulated steps into `out`: the summary and what the
/// probe heard.
fn run(model: &[&str], out: &Path) -> (Summary, Vec<(&'static str, Pass)>) {
    let dir = format!("train.output_dir={:?}", out.display().to_string());
    let common = [
        "memory.fuse=blocks",
        "train.batch_size=4",
        "train.accum_steps=2",
        "train.max_steps=3",
        "data.train_size=32",
        "data.eval_size=8",
        dir.as_str(),
    ];
    let s = settings(&[model, &common[..]].concat());
    let mut ears = Ears::default();
    let options = RunOptions::default();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let summary = pool
        .install(|| {
            train::<CpuBackend>(
                &s,
                Default::default(),
                &Selected::Cpu,
                options,
                &mut ears,
                Peer::solo(),
            )
        })
        .expect("a run that trains");
    let heard = ears.0.lock().unwrap().clone();
    (summary, heard)
}

#[test]
fn two_trainings_at_once_equal_their_solo_runs() {
    let tmp = std::env::temp_dir().join(format!("oomlab-concurrent-{}", std::process::id()));
    let simple: &[&str] = &["precision.mode=f16-mixed"];
    let mobile: &[&str] = &["model.name=mobilenet", "model.width_multiplier=0.25"];
    let solo = [
        run(simple, &tmp.join("solo-a")),
        run(mobile, &tmp.join("solo-b")),
    ];
    let start = Barrier::new(2);
    let both = thread::scope(|s| {
        let [a, b] = [(simple, "both-a"), (mobile, "both-b")].map(|(model, dir)| {
            let (start, out) = (&start, tmp.join(dir));
            s.spawn(move || {
                start.wait();
                run(model, &out)
            })
        });
        [a.join().unwrap(), b.join().unwrap()]
    });
    let _ = std::fs::remove_dir_all(&tmp);
    for ((alone, heard_alone), (together, heard_together)) in solo.into_iter().zip(both) {
        let what = &alone.model;
        assert!(
            !heard_alone.is_empty(),
            "{what}: the probe heard no boundary"
        );
        assert_eq!(
            heard_together, heard_alone,
            "{what}: heard another run's crossings"
        );
        let figures =
            |s: &Summary| [s.final_train_loss, s.eval_loss, s.eval_accuracy].map(f64::to_bits);
        assert_eq!(
            figures(&together),
            figures(&alone),
            "{what}: figures differ"
        );
        assert_eq!(together.steps, alone.steps, "{what}");
    }
}
