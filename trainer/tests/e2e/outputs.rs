//! Where a run writes (issue 31): a folder two runs cannot share, output paths that are only
//! ever regular files, nothing written that the run does not own, and flags that never hide a
//! bad value.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::{arg, binary, root, run, stderr, temp};
use super::reliability::{first_line, toml, with_small};

/// A run that keeps training until killed (at the latest when the test ends, even by a failed
/// assertion: no run is left behind): 256 images, a checkpoint after every step.
fn long_run(dir: &Path, cwd: &Path, config: Option<&Path>) -> Owner {
    let mut command = Command::new(binary());
    if let Some(config) = config {
        command.args(["--config", &arg(config)]);
    }
    let mut args = with_small(&[
        "--max-steps",
        "1000000",
        "--set",
        "train.checkpoint_every=1",
    ]);
    let output = format!("train.output_dir={}", toml(dir));
    if config.is_none() {
        args.extend(["--set", &output]);
    }
    command
        .args(&args)
        .current_dir(cwd)
        .env("OOMLAB_NO_CUDA", "1")
        .env("OOMLAB_NO_WGPU", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Owner)
        .expect("spawn trainer")
}

/// The first run of a test, killed when dropped.
struct Owner(Child);

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `trainer ARGS` in the folder `cwd` (where `runs/` is made), CUDA and wgpu off.
fn run_in<S: AsRef<std::ffi::OsStr>>(cwd: &Path, args: &[S]) -> std::process::Output {
    Command::new(binary())
        .args(args)
        .current_dir(cwd)
        .env("OOMLAB_NO_CUDA", "1")
        .env("OOMLAB_NO_WGPU", "1")
        .output()
        .expect("spawn trainer")
}

/// One small training step of `config` with its default output folder under `cwd`.
fn one_step_in(cwd: &Path, config: &Path) -> std::process::Output {
    let config = arg(config);
    let mut args = vec!["--config", config.as_str()];
    args.extend(with_small(&["--max-steps", "1"]));
    run_in(cwd, &args)
}

/// Waits (at most two minutes) until `path` exists, failing the test if `child` ended first.
fn wait_for(path: &Path, Owner(child): &mut Owner) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !path.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the first run ended ({status}) before {} appeared",
                path.display()
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{} did not appear within two minutes", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills the run now (SIGKILL: nothing of it runs on the way out).
fn stop(owner: Owner) {
    drop(owner);
}

#[test]
fn a_folder_in_use_is_refused_and_a_killed_owner_leaves_no_stale_lock() {
    let dir = temp("lock");
    let mut first = long_run(&dir, &root(), None);
    wait_for(&dir.join("checkpoint").join("manifest.json"), &mut first);
    let refused = format!(
        "config error: train.output_dir = {}: in use by another trainer process (pid {}): wait \
         for it to end, or choose another folder",
        dir.display(),
        first.0.id()
    );
    let set = format!("train.output_dir={}", toml(&dir));
    let second = run(&with_small(&[
        "--max-steps",
        "1",
        "--set",
        &set,
        "--overwrite",
    ]));
    assert_eq!(second.status.code(), Some(2), "{}", stderr(&second));
    assert_eq!(first_line(&second), refused);
    // Two resumes of one run at once: the second is refused the same way.
    let resume = run(&with_small(&[
        "--resume",
        &arg(&dir.join("checkpoint")),
        "--max-steps",
        "1000001",
    ]));
    assert_eq!(resume.status.code(), Some(2), "{}", stderr(&resume));
    assert_eq!(first_line(&resume), refused);
    // The kernel drops the lock with its process, however it ends.
    stop(first);
    let after = run(&with_small(&[
        "--max-steps",
        "1",
        "--set",
        &set,
        "--overwrite",
    ]));
    assert_eq!(after.status.code(), Some(0), "{}", stderr(&after));
}

#[test]
fn a_default_folder_in_use_gives_the_next_numbered_one() {
    let dir = temp("lock-default");
    let config = dir.join("busy.toml");
    std::fs::write(&config, "").unwrap();
    let mut first = long_run(&dir, &dir, Some(&config));
    wait_for(&dir.join("runs/busy/checkpoint/manifest.json"), &mut first);
    let second = one_step_in(&dir, &config);
    let pid = first.0.id();
    stop(first);
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        stderr(&second).contains(&format!(
            "note: runs/busy in use by another trainer process (pid {pid}); this run writes to \
             runs/busy-2"
        )),
        "{}",
        stderr(&second)
    );
    assert!(dir.join("runs/busy-2/checkpoint/manifest.json").exists());
}

/// `mkfifo PATH`, or `None` where the command is missing.
fn fifo(path: &Path) -> Option<PathBuf> {
    let made = Command::new("mkfifo").arg(path).status().ok()?;
    made.success().then(|| path.to_path_buf())
}

#[test]
fn output_paths_are_regular_files_or_absent_and_nothing_else_is_replaced() {
    let dir = temp("paths");
    let set = format!("train.output_dir={}", toml(&dir.join("run")));
    let started = Instant::now();
    let summary = |path: &Path| run(&with_small(&["--set", &set, "--summary-json", &arg(path)]));
    let expect = |out: std::process::Output, flag: &str, path: &Path, what: &str| {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert_eq!(
            first_line(&out),
            format!("config error: {flag} = {}: {what}", path.display())
        );
    };
    let device = "is not a regular file (a FIFO, a device or a socket): name a file";
    expect(
        summary(Path::new("/dev/null")),
        "--summary-json",
        Path::new("/dev/null"),
        device,
    );
    use std::os::unix::fs::FileTypeExt;
    let null = std::fs::metadata("/dev/null").unwrap().file_type();
    assert!(null.is_char_device(), "/dev/null is still a device");
    if let Some(fifo) = fifo(&dir.join("fifo.json")) {
        expect(summary(&fifo), "--summary-json", &fifo, device);
        let estimate = run(&["estimate", "--json", &arg(&fifo)]);
        expect(estimate, "--json", &fifo, device);
        let find = run(&[
            "find-batch-size",
            "--backend",
            "cpu",
            "--budget",
            "1GiB",
            "--json",
            &arg(&fifo),
        ]);
        expect(find, "--json", &fifo, device);
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }
    let target = dir.join("target.json");
    std::fs::write(&target, "mine").unwrap();
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let linked = "is a symbolic link: name the file itself (links are not followed)";
    expect(summary(&link), "--summary-json", &link, linked);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "mine");
    expect(
        run(&["estimate", "--json", &arg(&dir)]),
        "--json",
        &dir,
        "is a folder: name a file",
    );
    let compare = run(&["compare", "configs/f32.toml", "--out", &arg(&target)]);
    assert_eq!(compare.status.code(), Some(2), "{}", stderr(&compare));
    assert!(
        first_line(&compare).starts_with(&format!(
            "config error: --out = {}: cannot write there: ",
            target.display()
        )),
        "{}",
        first_line(&compare)
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "nothing blocked on a FIFO"
    );
}

#[test]
fn every_file_of_the_output_folder_is_checked_before_the_first_step() {
    let case = |name: &str, make: &dyn Fn(&Path), what: &str| {
        let dir = temp(&format!("own-{name}"));
        // An earlier run's folder (its lock file marks it), with something odd in it.
        std::fs::write(dir.join(".oomlab.lock"), "").unwrap();
        make(&dir);
        let set = format!("train.output_dir={}", toml(&dir));
        let out = run(&with_small(&["--max-steps", "1", "--set", &set]));
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        assert_eq!(
            first_line(&out),
            format!("config error: train.output_dir = {}: {what}", dir.display()),
            "{name}"
        );
        assert!(
            !stderr(&out).contains("epoch"),
            "{name}: nothing was trained"
        );
    };
    case(
        "steps-folder",
        &|d| std::fs::create_dir_all(d.join("steps.csv")).unwrap(),
        "steps.csv there is a folder: name a file",
    );
    case(
        "checkpoint-file",
        &|d| std::fs::write(d.join("checkpoint"), "x").unwrap(),
        "checkpoint there is not a folder, not a checkpoint this run wrote: move it away",
    );
    case(
        "partial-link",
        &|d| std::os::unix::fs::symlink("/nowhere", d.join("checkpoint.partial")).unwrap(),
        "checkpoint.partial there is a symbolic link, not a checkpoint this run wrote: move it \
         away",
    );
    case(
        "stranger-in-checkpoint",
        &|d| {
            std::fs::create_dir_all(d.join("checkpoint")).unwrap();
            std::fs::write(d.join("checkpoint/notes.txt"), "mine").unwrap();
        },
        "checkpoint/notes.txt there is not part of a checkpoint and would be deleted with it: \
         move it away",
    );
}

#[test]
fn a_run_writes_only_in_a_folder_it_owns() {
    // The file system's root and a folder of the user's own files are not a run's.
    for dir in [PathBuf::from("/"), temp("users-folder")] {
        if dir != Path::new("/") {
            std::fs::write(dir.join("steps.csv"), "the user's own").unwrap();
        }
        let set = format!("train.output_dir={}", toml(&dir));
        let out = run(&with_small(&["--max-steps", "1", "--set", &set]));
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let line = first_line(&out);
        assert!(
            line.starts_with(&format!(
                "config error: train.output_dir = {}: holds files this program did not write (",
                dir.display()
            )) && line.ends_with("name a new or empty folder, or one an earlier run wrote"),
            "{line}"
        );
        if dir != Path::new("/") {
            assert_eq!(
                std::fs::read_to_string(dir.join("steps.csv")).unwrap(),
                "the user's own"
            );
        }
    }
    // Resuming run A into folder B, which holds run B's checkpoint: refused, B untouched.
    let (a, b) = (temp("owner-a"), temp("owner-b"));
    for dir in [&a, &b] {
        let set = format!("train.output_dir={}", toml(dir));
        let out = run(&with_small(&["--max-steps", "1", "--set", &set]));
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let manifest = std::fs::read(b.join("checkpoint/manifest.json")).unwrap();
    let into_b = format!("train.output_dir={}", toml(&b));
    let a_ckpt = a.join("checkpoint");
    let out = run(&with_small(&[
        "--resume",
        &arg(&a_ckpt),
        "--max-steps",
        "2",
        "--set",
        &into_b,
    ]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        first_line(&out),
        format!(
            "config error: train.output_dir = {}: holds the checkpoint of another run than the \
             one resumed (--resume {}): choose another folder, or replace it with --overwrite",
            b.display(),
            a_ckpt.canonicalize().unwrap().display()
        )
    );
    assert_eq!(
        std::fs::read(b.join("checkpoint/manifest.json")).unwrap(),
        manifest
    );
    // An output folder inside the checkpoint being resumed.
    let inside = format!("train.output_dir={}", toml(&a_ckpt.join("out")));
    let out = run(&with_small(&["--resume", &arg(&a_ckpt), "--set", &inside]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        first_line(&out).ends_with(&format!(
            "lies inside the checkpoint it resumes (--resume {}): choose another folder",
            a_ckpt.canonicalize().unwrap().display()
        )),
        "{}",
        first_line(&out)
    );
    // The same, spelled through a folder that does not exist yet: nothing is made.
    let around = dir_around(&a_ckpt);
    let set = format!("train.output_dir={}", toml(&around));
    let out = run(&with_small(&["--resume", &arg(&a_ckpt), "--set", &set]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(first_line(&out).contains("lies inside the checkpoint it resumes"));
    assert!(!a.join("nope").exists() && !a_ckpt.join("out").exists());
    // --summary-json over the run's own step log, or into a checkpoint.
    let into_a = format!("train.output_dir={}", toml(&a));
    for (path, what) in [
        (
            a.join("steps.csv"),
            "is one of the run's own files (steps.csv): name another file".to_string(),
        ),
        (
            a_ckpt.join("summary.json"),
            format!(
                "lies inside a checkpoint ({}): name a file outside it",
                a_ckpt.canonicalize().unwrap().display()
            ),
        ),
    ] {
        let out = run(&with_small(&[
            "--resume",
            &arg(&a_ckpt),
            "--max-steps",
            "2",
            "--set",
            &into_a,
            "--summary-json",
            &arg(&path),
        ]));
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert_eq!(
            first_line(&out),
            format!("config error: --summary-json = {}: {what}", path.display())
        );
    }
}

/// `<a>/nope/../checkpoint/out` for the checkpoint `<a>/checkpoint`.
fn dir_around(checkpoint: &Path) -> PathBuf {
    let a = checkpoint.parent().unwrap();
    a.join("nope").join("..").join("checkpoint").join("out")
}

#[test]
fn flags_never_hide_a_bad_value_and_searches_stay_inside_their_bounds() {
    let out = run(&["--backend", "cpu", "--set", "backend.kind=tpu", "--dry-run"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(first_line(&out).starts_with("config error: backend.kind: unknown variant `tpu`"));
    let out = run(&[
        "--set",
        "train.max_steps=0",
        "--max-steps",
        "5",
        "--dry-run",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        first_line(&out),
        "config error: train.max_steps = 0: must be at least 1 (or left out)"
    );
    let out = run(&[
        "compare",
        "configs/f32.toml",
        "--set",
        "train.output_dir=x",
        "--dry-run",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        first_line(&out),
        "config error: --set = train.output_dir=x: compare gives every run its own folder \
         under --out: name --out instead"
    );
    let out = run(&["find-batch-size", "--max-batch", "65537", "--dry-run"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("must be at most 65536"),
        "{}",
        stderr(&out)
    );
    // A search never reports a micro-batch larger than the split it trains on.
    let dir = temp("find-split");
    let json = dir.join("found.json");
    let set = format!("train.output_dir={}", toml(&dir));
    let out = run(&[
        "find-batch-size",
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--budget",
        "4GiB",
        "--set",
        "data.train_size=24",
        "--set",
        "data.eval_size=8",
        "--set",
        &set,
        "--json",
        &arg(&json),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "note: the train split has 24 images, so micro-batches above 24 are not tried"
        ),
        "{}",
        stderr(&out)
    );
    let found: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(found["batch_size"], 24, "{found}");
    let largest = found["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["batch_size"].as_u64().unwrap())
        .max();
    assert_eq!(largest, Some(24));
}

#[test]
fn compare_keeps_an_earlier_report_unless_told() {
    let dir = temp("compare-again");
    let out_dir = dir.join("report");
    let config = arg(&root().join("configs/f32.toml"));
    let compare = |extra: &[&str]| {
        let mut args = vec![
            "compare",
            config.as_str(),
            "--backend",
            "cpu",
            "--steps",
            "1",
            "--set",
            "data.train_size=32",
            "--set",
            "data.eval_size=8",
            "--set",
            "train.batch_size=16",
        ];
        args.extend_from_slice(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let named = compare(&["--out", out_dir.to_str().unwrap()]);
    let named: Vec<&str> = named.iter().map(String::as_str).collect();
    assert!(run(&named).status.success());
    let report = std::fs::read(out_dir.join("report.json")).unwrap();
    let again = run(&named);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert_eq!(
        first_line(&again),
        format!(
            "config error: --out = {}: holds the report of an earlier compare: replace it with \
             --overwrite, or choose another folder",
            out_dir.display()
        )
    );
    assert_eq!(std::fs::read(out_dir.join("report.json")).unwrap(), report);
    let mut replace = named.clone();
    replace.push("--overwrite");
    assert!(run(&replace).status.success());
    // Without --out, a second compare takes runs/compare-2.
    let default = compare(&[]);
    for n in [1, 2] {
        let out = run_in(&dir, &default);
        assert!(out.status.success(), "{}", stderr(&out));
        if n == 2 {
            assert!(
                stderr(&out).contains(
                    "note: runs/compare holds the report of an earlier compare; this compare \
                     writes to runs/compare-2"
                ),
                "{}",
                stderr(&out)
            );
        }
    }
    assert!(dir.join("runs/compare-2/report.json").exists());
}

#[test]
fn a_config_name_with_escapes_reaches_no_terminal_or_folder_raw() {
    let dir = temp("escapes");
    let config = dir.join("red\u{1b}[31m\nname.toml");
    std::fs::write(&config, "").unwrap();
    let out = one_step_in(&dir, &config);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(dir
        .join("runs/red--31m-name/checkpoint/manifest.json")
        .exists());
    std::fs::write(&config, "[train\n").unwrap();
    let out = run(&["--config", &arg(&config), "--dry-run"]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert_eq!(text.lines().count(), 1, "one line: {text}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(text.contains("red\\u{1b}[31m\\nname.toml"), "{text}");
}

/// A swap cut short between its two renames leaves `checkpoint.old` only: resuming the run by
/// its usual name continues it (the folder's own set is the one resumed).
#[test]
fn a_resume_after_a_swap_cut_short_continues_in_its_folder() {
    let dir = temp("swap-cut");
    let set = format!("train.output_dir={}", toml(&dir));
    let first = run(&with_small(&["--max-steps", "1", "--set", &set]));
    assert!(first.status.success(), "{}", stderr(&first));
    std::fs::rename(dir.join("checkpoint"), dir.join("checkpoint.old")).unwrap();
    let resume = run(&with_small(&[
        "--resume",
        &arg(&dir.join("checkpoint")),
        "--max-steps",
        "2",
    ]));
    assert!(resume.status.success(), "{}", stderr(&resume));
    assert!(dir.join("checkpoint/manifest.json").exists());
}
