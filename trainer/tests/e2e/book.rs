//! The book (docs/src) cannot rot: every `trainer` command it quotes parses and its configs
//! load (`--dry-run`), every chapter in SUMMARY.md exists, and every figure has been generated.

use std::path::PathBuf;
use std::process::Command;

use super::common::{binary, root, temp};

fn chapters() -> Vec<(PathBuf, String)> {
    let src = root().join("docs/src");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// `trainer …` lines inside fenced blocks (also `$ trainer …`), continuations joined and
/// trailing `# comments` dropped.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut fenced, mut pending): (bool, Option<String>) = (false, None);
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            continue;
        }
        let line = match pending.take() {
            Some(start) => format!("{start} {line}"),
            None => match line.strip_prefix("$ ").unwrap_or(line) {
                l if l.starts_with("trainer ") => l.to_string(),
                _ => continue,
            },
        };
        if let Some(start) = line.strip_suffix('\\') {
            pending = Some(start.trim_end().to_string());
            continue;
        }
        let command = line.split(" #").next().unwrap_or(&line).trim().to_string();
        out.push(command);
    }
    out
}

#[test]
fn every_trainer_command_in_the_book_parses_and_loads() {
    let bin_dir = binary().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut checked = 0;
    for (file, text) in chapters() {
        for command in commands(&text) {
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("{command} --dry-run"))
                .current_dir(root())
                .env("PATH", &path)
                .env("OOMLAB_NO_CUDA", "1")
                .output()
                .unwrap();
            assert!(
                out.status.success() && out.stdout.starts_with(b"dry run: "),
                "{}: `{command}` failed: {}{}",
                file.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} commands found in the book");
}

#[test]
fn every_chapter_exists_and_every_figure_is_generated() {
    let src = root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    for link in summary.split("](").skip(1) {
        let file = link.split(')').next().unwrap();
        assert!(
            src.join(file).exists(),
            "SUMMARY.md links to missing {file}"
        );
    }
    let mut figures = 0;
    for (file, text) in chapters() {
        let mut rest = text.as_str();
        while let Some(start) = rest.find("<!-- figure ") {
            let after = &rest[start..];
            let end = after
                .find("<!-- /figure -->")
                .unwrap_or_else(|| panic!("{}: unclosed figure", file.display()));
            let body = after[..end].lines().skip(1).collect::<Vec<_>>().join("\n");
            assert!(
                !body.trim().is_empty(),
                "{}: {} is empty: run scripts/book-figures.sh",
                file.display(),
                after.lines().next().unwrap()
            );
            for image in body.split("](figures/").skip(1) {
                let name = image.split(')').next().unwrap();
                assert!(
                    src.join("figures").join(name).exists(),
                    "missing figure {name}"
                );
            }
            figures += 1;
            rest = &after[end..];
        }
    }
    assert!(figures >= 12, "only {figures} figures");
}

#[test]
fn the_command_extractor_joins_continuations_and_drops_comments() {
    let text =
        "```sh\ntrainer --config a.toml   # note\ntrainer compare x \\\n    --steps 2\n```\n\
                trainer outside a block\n```text\n$ trainer estimate\noutput\n```\n";
    assert_eq!(
        commands(text),
        [
            "trainer --config a.toml",
            "trainer compare x --steps 2",
            "trainer estimate"
        ]
    );
}

/// `scripts/book-figures.sh --check` with the test's binary first on PATH, on the chapters in
/// `src` (the book's own by default).
fn book_check(src: Option<&std::path::Path>) -> std::process::Output {
    let bin_dir = binary().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("bash");
    command
        .arg(root().join("scripts/book-figures.sh"))
        .arg("--check")
        .current_dir(root())
        .env("PATH", path);
    if let Some(src) = src {
        command.env("BOOK_SRC", src);
    }
    command.output().unwrap()
}

#[test]
fn the_books_deterministic_sections_match_the_program() {
    // Estimates, the out-of-memory diagnosis and config diffs: re-run, compared line by line.
    let out = book_check(None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the book has drifted from the program:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.matches("matches the program").count(), 5, "{stdout}");
}

#[test]
fn the_drift_check_fails_when_a_number_in_the_book_is_wrong() {
    let dir = temp("book-drift");
    let src = root().join("docs/src");
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let chapter = dir.join("01-why-oom.md");
    let text = std::fs::read_to_string(&chapter).unwrap();
    let start = text.find("<!-- figure estimate-simple -->").unwrap();
    let line = text[start..]
        .lines()
        .find(|l| l.contains("MiB"))
        .unwrap()
        .to_string();
    std::fs::write(&chapter, text.replacen(&line, &format!("{line}0"), 1)).unwrap();
    let out = book_check(Some(&dir));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "book-figures: estimate-simple in {} has drifted",
            chapter.display()
        )),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
