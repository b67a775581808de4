//! Sizes, scales, paths and overrides that once panicked, wrapped or slipped through
//! (issue 13): each is one line naming the key and its bound.

use crate::config::{error, settings};

/// Sizes that once wrapped, divided by zero or aborted the allocator are refused with their
/// bound (issue 13).
#[test]
fn huge_sizes_are_refused_with_their_bound() {
    let mobilenet = "[model]\nname = \"mobilenet\"\n";
    let cases: [(&str, &[&str], &str); 8] = [
        (
            "",
            &["train.accum_steps=4611686018427387904"],
            "train.accum_steps = 4611686018427387904: must be at most 65536",
        ),
        (
            "",
            &["train.batch_size=128", "train.accum_steps=65536"],
            "train.accum_steps = 65536: train.batch_size × train.accum_steps must be at most 1048576",
        ),
        (
            mobilenet,
            &["model.input_size=4611686018427387904"],
            "model.input_size = 4611686018427387904: must be at most 2048",
        ),
        (
            "",
            &["data.train_size=9223372036854775807"],
            "data.train_size = 9223372036854775807: must be at most 10000000",
        ),
        (
            "",
            &["data.train_size=1000000000000"],
            "data.train_size = 1000000000000: must be at most 10000000",
        ),
        (
            "",
            &["train.epochs=9223372036854775807"],
            "train.epochs = 9223372036854775807: must be at most 1000000",
        ),
        (
            "",
            &["model.num_classes=1000000"],
            "model.num_classes = 1000000: must be at most 100000",
        ),
        (
            "",
            &["train.checkpoint_every=0"],
            "train.checkpoint_every = 0: must be at least 1 (or left out: checkpoints at epoch ends only)",
        ),
    ];
    for (text, sets, expected) in cases {
        assert_eq!(error(text, sets), expected, "{sets:?}");
    }
}

/// The smaller gaps of issue 13, each one line naming the key.
#[test]
fn scales_paths_and_overrides_that_once_slipped_through() {
    let scale = "must be in [1, 2^40] (1 … 1.10e12): a larger scale overflows the scaled \
                 loss, a smaller one shrinks f16 gradients to zero";
    assert_eq!(
        error("", &["precision.init_scale=1e30"]),
        format!("precision.init_scale = 1000000000000000000000000000000: {scale}")
    );
    assert_eq!(
        error("", &["precision.init_scale=1e-45"]),
        format!("precision.init_scale = 0.000000000000000000000000000000000000000000001: {scale}")
    );
    assert_eq!(
        error(
            "",
            &["precision.mode=f16-mixed", "precision.loss_scale=1e40"]
        ),
        format!("precision.loss_scale = 10000000000000000000000000000000000000000: {scale}")
    );
    assert_eq!(
        error("", &["train.output_dir=\"\""]),
        "train.output_dir = \"\": must name a folder (or be left out for runs/<config name>)"
    );
    assert_eq!(
        error(
            "[data]\nsource = \"cifar10\"\npath = \"x\"\n",
            &["data.train_size=100"]
        ),
        "data.train_size: applies only to data.source = \"synthetic\" (CIFAR-10 has 50,000 \
         train and 10,000 test images)"
    );
    assert_eq!(
        error("", &["train.lr=1e-3\ntrain.batch_size=0"]),
        "--set train.lr=1e-3\\ntrain.batch_size=0: a value must be on one line"
    );
    assert_eq!(
        error("", &["memory.budget=0"]),
        "memory.budget = 0: expected a positive size such as \"6GiB\", \"512MiB\", \"1.5GB\" \
         or \"800000000\" (bytes)"
    );
    assert_eq!(
        settings("", &["memory.budget=4096"]).memory.budget,
        Some(4096)
    );
    // An override does not hide a bad value in the file.
    assert_eq!(
        error("[backend]\nkind = \"tpu\"\n", &["backend.kind=cpu"]),
        "backend.kind: unknown variant `tpu`, expected one of `auto`, `cuda`, `wgpu`, `cpu`"
    );
}

/// Values that made a run meaningless while it exited 0 (issue 31): a loss scale that flushes
/// every f16 gradient to zero, a denormal learning rate, an invalid value hidden by a later
/// `--set` of the same key.
#[test]
fn values_that_would_train_on_nothing_are_refused() {
    let scale = "must be in [1, 2^40] (1 … 1.10e12): a larger scale overflows the scaled loss, \
                 a smaller one shrinks f16 gradients to zero";
    assert_eq!(
        error("", &["precision.loss_scale=1e-7"]),
        format!("precision.loss_scale = 0.0000001: {scale}")
    );
    assert_eq!(
        error("", &["precision.init_scale=0.5"]),
        format!("precision.init_scale = 0.5: {scale}")
    );
    settings("", &["precision.mode=f16-mixed", "precision.loss_scale=1"]);
    let lr = "must be at least 1e-9: a smaller step leaves every f32 weight above 0.01 as it \
              was (Adam moves a weight by about lr per step), so nothing would train";
    let line = error("", &["train.lr=1e-320"]);
    assert!(
        line.starts_with("train.lr = 0.000") && line.ends_with(&format!("1: {lr}")),
        "{line}"
    );
    settings("", &["train.lr=1e-9"]);
    // A value replaced by a later `--set`, or a file's value replaced by a `--set`, is checked
    // where it stood.
    let negative = "train.lr = -1: must be a finite number > 0";
    assert_eq!(error("", &["train.lr=-1", "train.lr=0.1"]), negative);
    assert_eq!(error("[train]\nlr = -1\n", &["train.lr=0.1"]), negative);
    settings("", &["model.name=mobilenet", "model.width_multiplier=0.5"]);
    assert_eq!(
        error("", &["backend.kind=tpu", "backend.kind=cpu"]),
        "backend.kind: unknown variant `tpu`, expected one of `auto`, `cuda`, `wgpu`, `cpu`"
    );
}
