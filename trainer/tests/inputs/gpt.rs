//! The GPT's `[model]` keys and text's `[data]` keys: defaults, and every bad value as one
//! exact line naming the key.

use trainer::config::{DataSpec, ModelSpec, TextSource};

use crate::config::{error, settings};

const GPT: &str = "[model]\nname = \"gpt\"\n[data]\nsource = \"text\"\n";

#[test]
fn a_gpt_config_defaults_to_a_small_byte_level_model_on_the_built_in_corpus() {
    let s = settings(GPT, &[]);
    let ModelSpec::Gpt(c) = s.model else {
        panic!("{:?}", s.model)
    };
    assert_eq!(
        (c.n_layer, c.n_head, c.d_model, c.seq_len, c.vocab_size),
        (4, 4, 128, 64, 256)
    );
    let DataSpec::Text {
        text: TextSource::Corpus { bytes, seed: 0 },
        seq_len: 64,
        eval_windows: 256,
    } = s.data
    else {
        panic!("{:?}", s.data)
    };
    assert_eq!(bytes, 1 << 20);
    let s = settings(
        GPT,
        &["data.path=input.txt", "model.attention=memory_efficient"],
    );
    assert!(matches!(
        s.data,
        DataSpec::Text {
            text: TextSource::File(_),
            ..
        }
    ));
    let ModelSpec::Gpt(c) = s.model else { panic!() };
    assert_eq!(c.attention, burn_models::Attention::MemoryEfficient);
}

#[test]
fn every_bad_gpt_key_is_one_line_naming_it() {
    let cases: &[(&[&str], &str)] = &[
        (&["model.n_layer=0"], "model.n_layer = 0: must be in 1..=96"),
        (&["model.n_layer=97"], "model.n_layer = 97: must be in 1..=96"),
        (&["model.n_head=0"], "model.n_head = 0: must be in 1..=128"),
        (&["model.d_model=0"], "model.d_model = 0: must be in 1..=16384"),
        (
            &["model.d_model=100", "model.n_head=3"],
            "model.d_model = 100: must be divisible by model.n_head (3)",
        ),
        (&["model.seq_len=0"], "model.seq_len = 0: must be in 1..=65536"),
        (
            &["model.seq_len=65537"],
            "model.seq_len = 65537: must be in 1..=65536",
        ),
        (
            &["model.vocab_size=100"],
            "model.vocab_size = 100: must be at least 256: text is read as byte-level tokens",
        ),
        (
            &["model.vocab_size=2000000"],
            "model.vocab_size = 2000000: must be in 1..=1048576",
        ),
        (
            &["model.attention=\"flash\""],
            "model.attention: unknown variant `flash`, expected `naive` or `memory_efficient`",
        ),
        (
            &["model.dropout=0.1"],
            "model.dropout = 0.1: must be 0: oomlab's GPT has no dropout (its memory figures are without it)",
        ),
        (
            &["model.num_classes=10"],
            "model.num_classes: applies only to the CNNs (model.name = \"simple\", \"mobilenet\" or \"resnet\")",
        ),
        (
            &["model.input_size=32"],
            "model.input_size: applies only to the CNNs (model.name = \"simple\", \"mobilenet\" or \"resnet\")",
        ),
        (
            &["model.width_multiplier=0.5"],
            "model.width_multiplier: applies only to the CNNs (model.name = \"simple\", \"mobilenet\" or \"resnet\")",
        ),
        (
            &["data.source=synthetic"],
            "data.source: must be \"text\" for model.name = \"gpt\" (a language model reads tokens)",
        ),
        (
            &["data.train_size=100"],
            "data.train_size: applies only to images (text: data.corpus_bytes sizes the built-in corpus)",
        ),
        (&["data.eval_size=0"], "data.eval_size = 0: must be at least 1"),
        (
            &["data.corpus_bytes=100"],
            "data.corpus_bytes = 100: must be at least 645 for model.seq_len = 64 (one window of seq_len + 1 tokens in each split)",
        ),
        (
            &["data.corpus_bytes=2000000000"],
            "data.corpus_bytes = 2000000000: must be at most 1073741824",
        ),
        (
            &["data.path=a.txt", "data.corpus_bytes=100000"],
            "data.corpus_bytes: applies only to the built-in corpus (data.source = \"text\" without data.path)",
        ),
        (
            &["memory.fuse=blocks"],
            "memory.fuse = \"blocks\": fuses a CNN's conv blocks: model.name = \"gpt\" has none",
        ),
    ];
    for (sets, expected) in cases {
        assert_eq!(error(GPT, sets), *expected, "{sets:?}");
    }
}

#[test]
fn gpt_keys_and_text_are_refused_for_the_cnns() {
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "",
            &["model.n_layer=2"],
            "model.n_layer: applies only to model.name = \"gpt\"",
        ),
        (
            "",
            &["model.attention=naive"],
            "model.attention: applies only to model.name = \"gpt\"",
        ),
        (
            "",
            &["data.source=text"],
            "data.source: \"text\" is for model.name = \"gpt\" (this model reads images)",
        ),
        (
            "",
            &["data.corpus_bytes=100000"],
            "data.corpus_bytes: applies only to data.source = \"text\"",
        ),
        (
            "",
            &["memory.checkpointing=blocks"],
            "memory.checkpointing = \"blocks\": recomputes whole transformer blocks: model.name = \"gpt\" only (a CNN takes \"balanced\")",
        ),
    ];
    for (text, sets, expected) in cases {
        assert_eq!(error(text, sets), *expected, "{sets:?}");
    }
}
