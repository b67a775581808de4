//! The analytic estimate against the models Burn builds.

use trainer::config::{load_for, Purpose};
use trainer::memory::estimate::estimate;
use trainer::model::Classifier;

use crate::common::B;

fn settings(sets: &[&str]) -> trainer::config::Settings {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    load_for("", "t.toml".as_ref(), &sets, Purpose::Estimate).unwrap()
}

/// The estimate counts parameters from the architecture table; Burn counts the built model.
#[test]
fn parameter_counts_match_the_built_models() {
    let cases: [&[&str]; 5] = [
        &[],
        &["model.name=mobilenet", "model.width_multiplier=0.25"],
        &["model.name=mobilenet", "model.width_multiplier=1.0"],
        &[
            "model.name=mobilenet",
            "model.width_multiplier=0.5",
            "model.input_size=224",
            "model.num_classes=1000",
        ],
        &[
            "model.name=mobilenet",
            "model.width_multiplier=0.75",
            "model.input_size=96",
        ],
    ];
    for sets in cases {
        let s = settings(sets);
        let model: Classifier<B> = Classifier::init(&s.model, &Default::default()).unwrap();
        let e = estimate(&s, true);
        assert_eq!(e.parameters as usize, model.trainable_params(), "{sets:?}");
    }
}

#[test]
fn activations_scale_with_the_micro_batch_and_halve_in_f16() {
    let saved = |sets: &[&str]| -> u64 {
        let mut all = vec!["model.name=mobilenet", "model.width_multiplier=0.5"];
        all.extend_from_slice(sets);
        estimate(&settings(&all), true)
            .activations
            .iter()
            .map(|l| l.bytes)
            .sum()
    };
    let f32 = saved(&["train.batch_size=64"]);
    assert_eq!(f32, 2 * saved(&["train.batch_size=32"]));
    let f16 = saved(&["train.batch_size=64", "precision.mode=f16-mixed"]);
    // Everything but the f32 logits halves.
    assert!(
        (f16 as f64 / f32 as f64 - 0.5).abs() < 1e-3,
        "{f16} / {f32}"
    );
}
