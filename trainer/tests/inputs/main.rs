//! What users feed the trainer, read without training: configs and flags, and data files.
//!
//! Table of contents:
/// Sizes, scales and overrides that once slipped through: each refused with its bound.
mod bounds;
/// Config loading and validation: every bad input gives one exact line.
mod config;
/// The CIFAR-10 reader on small files in the exact binary format, and the batcher.
mod data;
/// Hundreds of mutated configs and `--set` strings: no panic, one-line rejections.
mod fuzz;
/// The GPT's keys and text's: defaults and every bad value.
mod gpt;
/// summary.json read back: every spelling parses into the report's enums and is rewritten
/// byte for byte.
mod summaries;
/// The text reader and the built-in corpus: splits, windows, bad files.
mod text;
