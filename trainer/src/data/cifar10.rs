//! The CIFAR-10 binary version: `data_batch_1.bin` … `data_batch_5.bin` and `test_batch.bin`,
//! each a run of records of 1 label byte followed by 3072 pixel bytes (R, G, B planes of 32×32).

use std::path::Path;

use super::{DataError, ImageSet, Splits};

const RECORD: usize = 1 + 3072;
const TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
const TEST_FILE: &str = "test_batch.bin";

/// Reads the five train batches and the test batch from `dir`.
pub fn load_cifar10(dir: &Path) -> Result<Splits, DataError> {
    let mut train = empty();
    for name in TRAIN_FILES {
        read_into(&dir.join(name), &mut train)?;
    }
    let mut eval = empty();
    read_into(&dir.join(TEST_FILE), &mut eval)?;
    Ok(Splits { train, eval })
}

fn empty() -> ImageSet {
    ImageSet {
        images: Vec::new(),
        labels: Vec::new(),
        size: 32,
    }
}

fn read_into(path: &Path, set: &mut ImageSet) -> Result<(), DataError> {
    let bytes = std::fs::read(path).map_err(|error| DataError::Read {
        path: path.to_owned(),
        error,
    })?;
    if bytes.len() % RECORD != 0 {
        return Err(DataError::Size {
            path: path.to_owned(),
            size: bytes.len(),
        });
    }
    for (record, chunk) in bytes.chunks_exact(RECORD).enumerate() {
        let label = chunk[0];
        if label > 9 {
            return Err(DataError::Label {
                path: path.to_owned(),
                record,
                label,
            });
        }
        set.labels.push(label);
        set.images.extend_from_slice(&chunk[1..]);
    }
    Ok(())
}
