//! Text for the language model, as byte-level tokens (vocabulary [`VOCAB`]): any UTF-8 file,
//! or the built-in corpus [`generate_corpus`] writes; split into train and eval, and cut into
//! windows of `seq_len + 1` tokens (the inputs and, one position on, their targets).
//!
//! The built-in corpus needs no download and has structure a small model can learn, each kind
//! of line a different skill:
//! - `alice saw the old map.`: spelling (a word's first letters fix the rest) and word order
//!   (name, verb, object), with a uniform choice among 8 names, 8 verbs and 8 objects;
//! - `17 + 25 = 42.`: the sum of two numbers below 50, which only attention to both operands
//!   predicts;
//! - `echo lamp river stone: lamp river stone.`: three random words repeated, which only
//!   copying from earlier in the line predicts (an induction head).
//!
//! What cannot be learnt is the random choices: 3 × 3 bits of word choice in a 25-byte
//! sentence, 2 × log₂ 50 bits in a 14-byte sum, 3 × 4 bits in a 45-byte echo, and the line
//! kind. Per byte that is about 0.3 nats, against ln 256 = 5.55 for a model that knows
//! nothing: an eval loss near 0.5 means the model has learnt all three skills.

use std::io::Read;
use std::path::Path;

use burn::prelude::*;

use super::{DataError, SplitMix64};

/// Byte-level tokens: one per byte value.
pub const VOCAB: usize = 256;

/// The largest text file read.
pub const MAX_TEXT_BYTES: u64 = 1 << 30;

/// A text's train and eval tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSplits {
    /// The first nine tenths.
    pub train: Vec<u8>,
    /// The last tenth.
    pub eval: Vec<u8>,
}

/// Reads the UTF-8 file at `path` (a regular file, or a link to one, of at most
/// [`MAX_TEXT_BYTES`]) and splits it; each split must hold at least one window of
/// `seq_len + 1` tokens.
pub fn load_text(path: &Path, seq_len: usize) -> Result<TokenSplits, DataError> {
    use std::os::unix::fs::OpenOptionsExt;
    let read = |error| DataError::Read {
        path: path.to_owned(),
        error,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        // Opening a FIFO returns at once instead of waiting for a writer.
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(read)?;
    // The opened handle is what is checked and read (and `take` bounds one that grows): a
    // swap after the open changes nothing.
    let meta = file.metadata().map_err(read)?;
    if !meta.is_file() {
        return Err(read(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    let too_large = || DataError::TextTooLarge {
        path: path.to_owned(),
        max: MAX_TEXT_BYTES,
    };
    if meta.len() > MAX_TEXT_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_TEXT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        return Err(too_large());
    }
    if let Err(e) = std::str::from_utf8(&bytes) {
        return Err(DataError::NotUtf8 {
            path: path.to_owned(),
            offset: e.valid_up_to(),
        });
    }
    split(bytes, seq_len).map_err(|needed| DataError::TextTooShort {
        path: path.to_owned(),
        needed,
    })
}

/// The built-in corpus's splits: `bytes` bytes drawn from `seed`, split as a file is.
pub fn corpus_splits(bytes: usize, seed: u64, seq_len: usize) -> Result<TokenSplits, usize> {
    split(generate_corpus(bytes, seed), seq_len)
}

/// Splits `bytes` at nine tenths (eval, nanoGPT's split, gets the last tenth, rounded half
/// up); `Err` carries the fewest bytes that give each split one window of `seq_len + 1` tokens.
fn split(mut bytes: Vec<u8>, seq_len: usize) -> Result<TokenSplits, usize> {
    let eval_len = eval_bytes(bytes.len());
    let window = seq_len + 1;
    let train_len = bytes.len() - eval_len;
    if eval_len < window || train_len < window {
        return Err(least_bytes(seq_len));
    }
    let eval = bytes.split_off(train_len);
    Ok(TokenSplits { train: bytes, eval })
}

/// Bytes of a `len`-byte text the eval split gets: the last tenth, rounded half up.
pub fn eval_bytes(len: usize) -> usize {
    (len + 5) / 10
}

/// The fewest bytes that give each split one window of `seq_len + 1` tokens: the eval tenth
/// holds one from 10·window − 5 bytes on, and train is then nine times larger.
pub fn least_bytes(seq_len: usize) -> usize {
    (seq_len + 1).saturating_mul(10) - 5
}

/// Windows of `seq_len + 1` tokens that `tokens` tokens hold back to back.
pub fn windows_in(tokens: usize, seq_len: usize) -> usize {
    tokens.saturating_sub(1) / seq_len
}

/// `(inputs, targets)`, each `[starts.len(), seq_len]`: the windows of `tokens` beginning at
/// `starts`, and the same shifted by one. Every start leaves `seq_len + 1` tokens (as
/// [`train_starts`] and [`eval_starts`] give).
pub fn windows<B: Backend>(
    tokens: &[u8],
    starts: &[usize],
    seq_len: usize,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    assert!(
        starts.iter().all(|&s| s + seq_len < tokens.len()),
        "a window past the tokens' end"
    );
    let take = |offset: usize| {
        let values: Vec<i64> = starts
            .iter()
            .flat_map(|&s| {
                tokens[s + offset..s + offset + seq_len]
                    .iter()
                    .map(|&t| t as i64)
            })
            .collect();
        Tensor::from_data(TensorData::new(values, [starts.len(), seq_len]), device)
    };
    (take(0), take(1))
}

/// A split's tokens read as windows back to back: window `i` starts at token `i · seq_len`
/// (its last target is the next window's first input). Each epoch visits them in a new order.
#[derive(Debug, Clone)]
pub struct TokenSet {
    tokens: Vec<u8>,
    seq_len: usize,
    windows: usize,
}

impl TokenSet {
    /// The windows of `tokens`, at most `max` of them (from the start).
    pub fn new(tokens: Vec<u8>, seq_len: usize, max: usize) -> Self {
        assert!(seq_len > 0, "an empty window");
        let windows = windows_in(tokens.len(), seq_len).min(max);
        Self {
            tokens,
            seq_len,
            windows,
        }
    }

    /// Windows.
    pub fn len(&self) -> usize {
        self.windows
    }

    /// True when not one window fits.
    pub fn is_empty(&self) -> bool {
        self.windows == 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.tokens.len()
    }

    /// `(inputs, targets)` of the windows at `indices`, each `[indices.len(), seq_len]`.
    pub fn batch<B: Backend>(
        &self,
        indices: &[usize],
        device: &B::Device,
    ) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
        assert!(
            indices.iter().all(|&i| i < self.windows),
            "a window past the split's end"
        );
        let starts: Vec<usize> = indices.iter().map(|&i| i * self.seq_len).collect();
        windows(&self.tokens, &starts, self.seq_len, device)
    }
}

const NAMES: [&str; 8] = [
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi",
];
const VERBS: [&str; 8] = [
    "saw", "found", "painted", "lost", "carried", "sold", "kept", "drew",
];
const OBJECTS: [&str; 8] = [
    "the old map",
    "a red ball",
    "the tall lamp",
    "a blue boat",
    "the small key",
    "a green cup",
    "the last letter",
    "a silver coin",
];
const WORDS: [&str; 16] = [
    "lamp", "river", "stone", "cloud", "apple", "tiger", "glass", "piano", "mouse", "candle",
    "forest", "button", "rocket", "violin", "pepper", "ladder",
];

/// `bytes` bytes of the built-in corpus (see the module's text), the same for a seed on every
/// machine. ASCII, so valid UTF-8 at any cut.
pub fn generate_corpus(bytes: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed, 3);
    let mut text = String::with_capacity(bytes + 64);
    while text.len() < bytes {
        let line = match rng.below(3) {
            0 => format!(
                "{} {} {}.\n",
                NAMES[rng.below(8)],
                VERBS[rng.below(8)],
                OBJECTS[rng.below(8)]
            ),
            1 => {
                let (a, b) = (rng.below(50), rng.below(50));
                format!("{a} + {b} = {}.\n", a + b)
            }
            _ => {
                let w = [0; 3].map(|_| WORDS[rng.below(16)]).join(" ");
                format!("echo {w}: {w}.\n")
            }
        };
        text.push_str(&line);
    }
    let mut out = text.into_bytes();
    out.truncate(bytes);
    out
}
