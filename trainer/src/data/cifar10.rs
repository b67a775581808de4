//! The CIFAR-10 binary version: `data_batch_1.bin` … `data_batch_5.bin` and `test_batch.bin`,
//! each a run of records of 1 label byte followed by 3072 pixel bytes (R, G, B planes of 32×32).

use std::path::Path;

use super::{DataError, ImageSet};

const RECORD: usize = 1 + 3072;
const TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
const TEST_FILE: &str = "test_batch.bin";

/// The largest batch file read: CIFAR-10's hold 10,000 records (30.7 MB) each.
const MAX_FILE_BYTES: u64 = 64 << 20;

/// Reads the five train batches and the test batch from `dir`: `(train, eval)`. A split with
/// no record is an error naming its files: training on it would never advance.
pub fn load_cifar10(dir: &Path) -> Result<(ImageSet, ImageSet), DataError> {
    let mut train = empty();
    for name in TRAIN_FILES {
        read_into(&dir.join(name), &mut train)?;
    }
    if train.is_empty() {
        return Err(DataError::Empty {
            paths: TRAIN_FILES.iter().map(|n| dir.join(n)).collect(),
        });
    }
    let mut eval = empty();
    read_into(&dir.join(TEST_FILE), &mut eval)?;
    if eval.is_empty() {
        return Err(DataError::Empty {
            paths: vec![dir.join(TEST_FILE)],
        });
    }
    Ok((train, eval))
}

fn empty() -> ImageSet {
    ImageSet {
        images: Vec::new(),
        labels: Vec::new(),
        size: 32,
    }
}

fn read_into(path: &Path, set: &mut ImageSet) -> Result<(), DataError> {
    let read = |error| DataError::Read {
        path: path.to_owned(),
        error,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    // A FIFO or device would block or never end; a huge file is not CIFAR-10.
    if !meta.is_file() {
        return Err(read(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(DataError::TooLarge {
            path: path.to_owned(),
            size: meta.len(),
        });
    }
    let bytes = std::fs::read(path).map_err(read)?;
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
