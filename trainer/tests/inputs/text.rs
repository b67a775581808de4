//! The text reader and the built-in corpus: splits, windows, and every bad file as one line.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use trainer::data::text::{
    corpus_splits, generate_corpus, load_text, windows, TokenSet, TokenSplits, MAX_TEXT_BYTES,
};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("oomlab-text-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn error(path: &Path, seq_len: usize) -> String {
    load_text(path, seq_len).unwrap_err().to_string()
}

#[test]
fn a_utf8_file_splits_at_nine_tenths_byte_for_byte() {
    let dir = temp("split");
    let path = dir.join("t.txt");
    let text = "héllo wörld, ".repeat(20); // 300 bytes, multi-byte characters included
    std::fs::write(&path, &text).unwrap();
    let TokenSplits { train, eval } = load_text(&path, 8).unwrap();
    assert_eq!((train.len(), eval.len()), (270, 30));
    assert_eq!([train, eval].concat(), text.as_bytes());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_text_files_are_one_line_naming_the_file() {
    let dir = temp("bad");
    let latin1 = dir.join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9 au lait, twice as long as a window").unwrap();
    let short = dir.join("short.txt");
    std::fs::write(&short, "too short").unwrap();
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    // Sparse: one byte over the bound costs no disk, and is refused before a byte is read.
    let huge = dir.join("huge.txt");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(MAX_TEXT_BYTES + 1)
        .unwrap();
    let missing = dir.join("missing.txt");
    let fifo = dir.join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let cases = [
        (
            error(&latin1, 2),
            format!(
                "{}: not UTF-8 text (invalid byte sequence at byte 3)",
                latin1.display()
            ),
        ),
        (
            error(&short, 8),
            format!(
                "{}: too short: at least 85 bytes give train and eval one window of seq_len + 1 tokens each",
                short.display()
            ),
        ),
        (
            error(&empty, 8),
            format!(
                "{}: too short: at least 85 bytes give train and eval one window of seq_len + 1 tokens each",
                empty.display()
            ),
        ),
        (
            error(&huge, 8),
            format!(
                "{}: more than 1073741824 bytes (the most a text file may hold)",
                huge.display()
            ),
        ),
        (
            error(&missing, 8),
            format!(
                "cannot read {}: No such file or directory (os error 2)",
                missing.display()
            ),
        ),
        // A FIFO would block a plain open until a writer came: refused at once.
        (
            error(&fifo, 8),
            format!("cannot read {}: not a regular file", fifo.display()),
        ),
        (
            error(&dir, 8),
            format!("cannot read {}: not a regular file", dir.display()),
        ),
        (
            error(Path::new("/dev/zero"), 8),
            "cannot read /dev/zero: not a regular file".to_string(),
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
        assert!(!got.contains('\n'));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn windows_are_inputs_and_targets_one_token_apart() {
    let tokens: Vec<u8> = (0..50).collect();
    let (x, y) = windows::<Flex>(&tokens, &[0, 10, 39], 10, &Default::default());
    let rows = |t: burn::tensor::Tensor<Flex, 2, burn::tensor::Int>| {
        t.into_data().convert::<i64>().to_vec::<i64>().unwrap()
    };
    let (x, y) = (rows(x), rows(y));
    assert_eq!(&x[..10], &(0..10).collect::<Vec<i64>>()[..]);
    assert_eq!(&y[..10], &(1..11).collect::<Vec<i64>>()[..]);
    assert_eq!(&x[20..], &(39..49).collect::<Vec<i64>>()[..]);
    assert_eq!(&y[20..], &(40..50).collect::<Vec<i64>>()[..]);
    let (x, y) = windows::<Flex>(&tokens[..11], &[0], 10, &Default::default());
    assert_eq!((x.dims(), y.dims()), ([1, 10], [1, 10]));
}

#[test]
fn a_split_is_read_as_windows_back_to_back() {
    let set = |n: u8, max: usize| TokenSet::new((0..n).collect(), 10, max);
    // Window i starts at token 10·i and needs 11 tokens: 50 tokens hold 4, 51 hold 5.
    assert_eq!(set(50, usize::MAX).len(), 4);
    assert_eq!(set(51, usize::MAX).len(), 5);
    assert_eq!(set(50, 2).len(), 2);
    // The shortest split holds one window; fewer tokens hold none.
    assert_eq!(set(11, usize::MAX).len(), 1);
    assert!(set(10, usize::MAX).is_empty());
    let (x, y) = set(51, usize::MAX).batch::<Flex>(&[4, 0], &Default::default());
    let rows = |t: burn::tensor::Tensor<Flex, 2, burn::tensor::Int>| {
        t.into_data().convert::<i64>().to_vec::<i64>().unwrap()
    };
    // The last window's last target is the split's last token.
    assert_eq!(
        rows(x),
        [(40..50).collect::<Vec<i64>>(), (0..10).collect()].concat()
    );
    assert_eq!(
        rows(y),
        [(41..51).collect::<Vec<i64>>(), (1..11).collect()].concat()
    );
}

#[test]
fn the_built_in_corpus_is_seeded_ascii_with_its_three_kinds_of_line() {
    let text = generate_corpus(20_000, 1);
    assert_eq!(text.len(), 20_000);
    assert_eq!(text, generate_corpus(20_000, 1));
    assert_ne!(text, generate_corpus(20_000, 2));
    assert!(text.is_ascii());
    let text = String::from_utf8(text).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let full = &lines[..lines.len() - 1]; // the last may be cut
    let mut kinds = [0usize; 3];
    for line in full {
        if let Some(rest) = line.strip_prefix("echo ") {
            let (words, echoed) = rest.split_once(": ").unwrap();
            assert_eq!(format!("{words}."), echoed, "{line}");
            kinds[2] += 1;
        } else if let Some((sum, total)) = line.split_once(" = ") {
            let (a, b) = sum.split_once(" + ").unwrap();
            let total: usize = total.trim_end_matches('.').parse().unwrap();
            assert_eq!(
                a.parse::<usize>().unwrap() + b.parse::<usize>().unwrap(),
                total
            );
            kinds[1] += 1;
        } else {
            // name, verb, and a three-word object.
            assert_eq!(line.split(' ').count(), 5, "{line}");
            assert!(line.ends_with('.'), "{line}");
            kinds[0] += 1;
        }
    }
    assert!(kinds.iter().all(|&k| k > full.len() / 4), "{kinds:?}");
    let splits = corpus_splits(1000, 1, 32).unwrap();
    assert_eq!((splits.train.len(), splits.eval.len()), (900, 100));
    // The fewest bytes that split: 10·33 − 5, eval rounding 32.5 up to 33.
    assert_eq!(corpus_splits(324, 1, 32), Err(325));
    let splits = corpus_splits(325, 1, 32).unwrap();
    assert_eq!((splits.train.len(), splits.eval.len()), (292, 33));
}
