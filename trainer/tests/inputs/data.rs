//! The CIFAR-10 reader on small files written in the exact binary format, and the batcher.

use std::path::Path;

use burn::backend::Flex;
use trainer::data::{generate, load_cifar10, shuffled, Batcher};

const TRAIN: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];

/// Writes `records` records per file; record `i` has label `i % 10` and pixels `(i + p) % 256`.
fn write_cifar(dir: &Path, records: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for name in TRAIN.iter().chain(["test_batch.bin"].iter()) {
        let mut bytes = Vec::new();
        for i in 0..records {
            bytes.push((i % 10) as u8);
            bytes.extend((0..3072).map(|p| ((i + p) % 256) as u8));
        }
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("oomlab-data-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn reads_records_in_order_with_planes_intact() {
    let dir = temp("ok");
    write_cifar(&dir, 7);
    let (train, eval) = load_cifar10(&dir).unwrap();
    assert_eq!(train.len(), 35);
    assert_eq!(eval.len(), 7);
    assert_eq!(train.labels[..8], [0, 1, 2, 3, 4, 5, 6, 0]);
    // record 3 of data_batch_1: the G plane starts at pixel 1024, value (3 + 1024) % 256.
    assert_eq!(train.images[3 * 3072 + 1024], ((3 + 1024) % 256) as u8);
}

#[test]
fn missing_file_is_named() {
    let dir = temp("missing");
    write_cifar(&dir, 2);
    std::fs::remove_file(dir.join("data_batch_4.bin")).unwrap();
    let err = load_cifar10(&dir).unwrap_err().to_string();
    let expected = format!(
        "cannot read {}: No such file or directory (os error 2)",
        dir.join("data_batch_4.bin").display()
    );
    assert_eq!(err, expected);
}

#[test]
fn truncated_file_is_named_with_its_size() {
    let dir = temp("size");
    write_cifar(&dir, 2);
    std::fs::write(dir.join("test_batch.bin"), vec![0u8; 3073 + 10]).unwrap();
    let err = load_cifar10(&dir).unwrap_err().to_string();
    let expected = format!(
        "{}: size 3083 bytes is not a multiple of 3073 (1 label byte + 3072 pixel bytes per record)",
        dir.join("test_batch.bin").display()
    );
    assert_eq!(err, expected);
}

#[test]
fn bad_label_is_named_with_file_and_record() {
    let dir = temp("label");
    write_cifar(&dir, 3);
    let path = dir.join("data_batch_2.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[2 * 3073] = 11;
    std::fs::write(&path, bytes).unwrap();
    let err = load_cifar10(&dir).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("{}: record 2: label 11 is not in 0..=9", path.display())
    );
}

#[test]
fn batches_are_normalised_per_channel() {
    let set = generate(64, 32, 3, 0);
    let batcher = Batcher::fit(&set);
    let all: Vec<usize> = (0..64).collect();
    let (images, labels) = batcher.batch::<Flex>(&set, &all, &Default::default());
    assert_eq!(images.dims(), [64, 3, 32, 32]);
    assert_eq!(labels.dims(), [64]);
    let per_channel = images.swap_dims(0, 1).reshape([3, 64 * 32 * 32]);
    let mean = per_channel
        .clone()
        .mean_dim(1)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let var = per_channel.var(1).into_data().to_vec::<f32>().unwrap();
    for c in 0..3 {
        assert!(mean[c].abs() < 1e-3, "channel {c} mean {}", mean[c]);
        assert!(
            (var[c] - 1.0).abs() < 1e-2,
            "channel {c} variance {}",
            var[c]
        );
    }
}

#[test]
fn shuffles_are_seeded_permutations() {
    let a = shuffled(100, 1, 0);
    assert_eq!(a, shuffled(100, 1, 0));
    assert_ne!(a, shuffled(100, 1, 1), "each epoch has its own order");
    assert_ne!(a, shuffled(100, 2, 0));
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..100).collect::<Vec<_>>());
}
