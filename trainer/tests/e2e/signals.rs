//! Signals through the binary (issue 31): SIGHUP stops a run like SIGTERM; a second signal
//! says what was kept; a signal at start makes nothing; `compare` and `find-batch-size`
//! forward a signal to their child, report what finished and leave no child behind. Every
//! wait has a deadline; a process still running at it is killed and the test fails.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::common::{arg, binary, root, run, stderr, summary, temp};
use super::reliability::{toml, with_small};

/// Generous bounds against a hang, never a claim about speed.
const LIMIT: Duration = Duration::from_secs(300);

/// A `trainer` process whose stderr lines arrive as it writes them.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

/// A run is killed when its test ends, however it ends (a failed assertion included), so no
/// trainer is left running; one already reaped is left alone.
impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(args: &[String]) -> Running {
    let mut child = Command::new(binary())
        .args(args)
        .current_dir(root())
        .env("OOMLAB_NO_CUDA", "1")
        .env("OOMLAB_NO_WGPU", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn trainer");
    let pipe = child.stderr.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Running {
        child,
        lines,
        seen: Vec::new(),
    }
}

impl Running {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: i32) {
        send(self.pid(), signal);
    }

    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// Waits until `ready(lines so far)` holds; kills the process and fails if it does not
    /// by the deadline, or if the process ended first.
    fn wait_until(&mut self, what: &str, mut ready: impl FnMut(&[String]) -> bool) {
        let deadline = Instant::now() + LIMIT;
        loop {
            self.drain();
            if ready(&self.seen) {
                return;
            }
            let ended = self.child.try_wait().unwrap();
            if ended.is_some() || Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                std::thread::sleep(Duration::from_millis(100));
                self.drain();
                panic!(
                    "waiting for {what}: {} first; stderr:\n{}",
                    ended.map_or("the deadline passed".into(), |s| format!("ended ({s})")),
                    self.seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the exit (killing the process and failing at the deadline) and returns its
    /// code (`None`: killed by a signal) and every stderr line.
    fn finish(mut self) -> (Option<i32>, Vec<String>) {
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.drain();
                panic!("no exit by the deadline; stderr:\n{}", self.seen.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader ends when the pipe closes; bounded anyway.
        let drained = Instant::now() + Duration::from_secs(30);
        loop {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) if Instant::now() > drained => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
        (status.code(), std::mem::take(&mut self.seen))
    }
}

fn send(pid: u32, signal: i32) {
    // SAFETY: kill(2) reads no memory; `pid` is a process this test started (or its child).
    let sent = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal})");
}

/// The children of `pid` (every thread's), from /proc.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name's closing parenthesis.
        let state = stat.rsplit(')').next().unwrap_or_default().trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

/// Waits (bounded) for `pid` to be gone: a process that outlived its parent's exit.
fn gone_soon(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

/// Whether `pid` has a handler for `signal` (its SigCgt mask in /proc).
fn catches(pid: u32, signal: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

/// A small f32 run into `dir` that checkpoints after every step and would run for long.
fn long_run(dir: &Path, config: &str) -> Vec<String> {
    let output = format!("train.output_dir={}", toml(dir));
    with_small(&["--config", config, "--set", "train.epochs=1000"])
        .into_iter()
        .map(String::from)
        .chain(["--set", "train.checkpoint_every=1", "--set", &output].map(String::from))
        .collect()
}

fn step_of(checkpoint: &Path) -> u64 {
    let text = std::fs::read_to_string(checkpoint.join("state.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&text).unwrap();
    state["step"].as_u64().unwrap()
}

/// Closing the terminal (SIGHUP) stops a run like SIGTERM: the window finishes, a checkpoint
/// is written, exit 129, and the run resumes from it.
#[test]
fn sighup_checkpoints_exits_129_and_the_run_resumes() {
    let dir = temp("sighup");
    let manifest = dir.join("checkpoint").join("manifest.json");
    let mut run_ = spawn(&long_run(&dir, "configs/f32.toml"));
    run_.wait_until("the first checkpoint", |_| manifest.exists());
    run_.signal(libc::SIGHUP);
    let (code, lines) = run_.finish();
    let text = lines.join("\n");
    assert_eq!(code, Some(129), "{text}");
    let checkpoint = dir.join("checkpoint");
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("interrupted by SIGHUP (the terminal closed): stopped after step"),
        "{text}"
    );
    assert!(
        last.ends_with(&format!("--resume {}", checkpoint.display())),
        "{text}"
    );

    let step = step_of(&checkpoint);
    let json = dir.join("s.json");
    let mut resumed = long_run(&dir, "configs/f32.toml");
    let more = (step + 1).to_string();
    resumed.extend(["--resume", &arg(&checkpoint), "--max-steps", &more].map(String::from));
    resumed.extend(["--summary-json".into(), arg(&json)]);
    let out = run(&resumed.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(summary(&json)["steps"].as_u64(), Some(step + 1));
}

/// A second Ctrl-C stops at once with exactly one line after the first signal's, naming the
/// checkpoint that was kept, and exit 130. MobileNet's windows last long enough that the
/// second signal comes inside the window the first one lets finish.
#[test]
fn a_second_signal_stops_at_once_and_names_what_was_kept() {
    let dir = temp("second-signal");
    let manifest = dir.join("checkpoint").join("manifest.json");
    let mut run_ = spawn(&long_run(&dir, "configs/mobilenet.toml"));
    run_.wait_until("the first checkpoint", |_| manifest.exists());
    run_.signal(libc::SIGINT);
    let first = "SIGINT received:";
    run_.wait_until("the first signal's line", |seen| {
        seen.iter().any(|l| l.starts_with(first))
    });
    run_.signal(libc::SIGINT);
    let (code, lines) = run_.finish();
    let text = lines.join("\n");
    assert_eq!(code, Some(130), "{text}");
    let at = lines.iter().position(|l| l.starts_with(first)).unwrap();
    let after = &lines[at + 1..];
    assert_eq!(after.len(), 1, "{text}");
    let checkpoint = dir.join("checkpoint");
    assert_eq!(
        after[0],
        format!(
            "second SIGINT: stopped at once; the last checkpoint in {} is intact (--resume {})",
            checkpoint.display(),
            checkpoint.display()
        )
    );
    assert!(manifest.exists());
}

/// A signal as soon as the handler is in place (before any folder is made): a clean exit
/// with one line, and no empty output folder (nothing made, or a checkpoint).
#[test]
fn a_signal_at_start_leaves_no_empty_folder() {
    let base = temp("signal-at-start");
    let dir = base.join("run");
    let mut args = long_run(&dir, "configs/f32.toml");
    args.extend(["--summary-json".into(), arg(&base.join("s.json"))]);
    let run_ = spawn(&args);
    let deadline = Instant::now() + LIMIT;
    // The folder is looked for before the handler: a folder seen while no handler is seen
    // afterwards was made first. (Looked at the other way round, a test thread that is slow
    // to be scheduled would see a folder the run made after its handler.)
    let mut made_before_the_handler = false;
    loop {
        let made = dir.exists();
        let caught = catches(run_.pid(), libc::SIGTERM);
        made_before_the_handler |= made && !caught;
        if caught || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    run_.signal(libc::SIGTERM);
    let (code, lines) = run_.finish();
    let text = lines.join("\n");
    assert!(
        !made_before_the_handler,
        "the output folder was made before the signal handler"
    );
    assert_eq!(code, Some(143), "{text}");
    let last = lines.last().unwrap();
    assert!(last.starts_with("interrupted by SIGTERM: "), "{text}");
    let checkpointed = dir.join("checkpoint").join("manifest.json").exists();
    assert!(
        !dir.exists() || checkpointed,
        "{} is left without a checkpoint: {text}",
        dir.display()
    );
    if !checkpointed {
        assert_eq!(
            last,
            "interrupted by SIGTERM: stopped before training began; nothing was written"
        );
    }
}

/// SIGTERM to `compare` while its second config runs: the child is told (once), the report
/// of the config that finished is written, exit 143, and no child is left running.
#[test]
fn sigterm_to_compare_reports_what_finished_and_leaves_no_child() {
    let out = temp("signal-compare");
    let args: Vec<String> = [
        "compare",
        "configs/f32.toml",
        "configs/amp.toml",
        "--backend",
        "cpu",
        "--steps",
        "100",
        "--set",
        "data.train_size=256",
        "--set",
        "data.eval_size=64",
        "--set",
        "train.batch_size=64",
        "--out",
    ]
    .into_iter()
    .map(String::from)
    .chain([arg(&out)])
    .collect();
    let mut compare = spawn(&args);
    let (pid, first) = (
        compare.pid(),
        out.join("runs").join("f32").join("summary.json"),
    );
    let mut child = None;
    compare.wait_until("the second config's run", |_| {
        child = children(pid).into_iter().find(|c| {
            std::fs::read(format!("/proc/{c}/cmdline"))
                .is_ok_and(|cmd| String::from_utf8_lossy(&cmd).contains("runs/amp"))
        });
        first.exists() && child.is_some()
    });
    let child = child.unwrap();
    compare.signal(libc::SIGTERM);
    let (code, lines) = compare.finish();
    let text = lines.join("\n");
    assert_eq!(code, Some(143), "{text}");
    assert!(gone_soon(child), "the child {child} outlived compare");
    let last = lines.last().unwrap();
    assert!(
        last.starts_with(&format!(
            "interrupted by SIGTERM: 1 of 2 configs finished; their report (report.md, \
             report.csv, report.json, charts) is in {}; the stopped run: ",
            out.display()
        )),
        "{text}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let rows = report.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{report}");
    assert_eq!(rows[0]["name"], "f32");
    assert!(rows[0]["error"].is_null(), "{report}");
    assert!(std::fs::read_to_string(out.join("report.md"))
        .unwrap()
        .contains("1 of 2 configs finished"));
}

/// SIGTERM to `find-batch-size` during a trial: the trial is told, the trials so far and the
/// largest size that fitted are reported, exit 143, and no trial is left running.
#[test]
fn sigterm_to_find_batch_size_reports_the_trials_so_far_and_leaves_no_child() {
    let dir = temp("signal-find");
    let output = format!("train.output_dir={}", toml(&dir));
    let args: Vec<String> = [
        "find-batch-size",
        "--config",
        "configs/f32.toml",
        "--backend",
        "cpu",
        "--budget",
        "1GiB",
        "--set",
        "data.train_size=256",
        "--set",
        "data.eval_size=64",
        "--set",
        &output,
    ]
    .map(String::from)
    .into();
    let mut find = spawn(&args);
    let pid = find.pid();
    let mut child = None;
    find.wait_until("a trial after the first", |seen| {
        child = children(pid).first().copied();
        seen.iter().any(|l| l.contains("micro-batch     1:")) && child.is_some()
    });
    let child = child.unwrap();
    find.signal(libc::SIGTERM);
    let (code, lines) = find.finish();
    let text = lines.join("\n");
    assert_eq!(code, Some(143), "{text}");
    assert!(
        gone_soon(child),
        "the trial {child} outlived find-batch-size"
    );
    let trials = lines
        .iter()
        .filter(|l| l.starts_with("  micro-batch"))
        .count();
    let last = lines.last().unwrap();
    assert!(
        last.starts_with(&format!(
            "interrupted by SIGTERM: find-batch-size stopped after {trials} finished trials; \
             the largest micro-batch that fitted so far is "
        )),
        "{text}"
    );
    assert!(last.ends_with("; the search did not finish"), "{text}");
    assert!(
        !dir.join("find-batch-size").exists(),
        "the trials' scratch folder is removed"
    );
}

/// SIGTERM reaches rank 0 only; the stop rides on the window's all-reduce, so both peers of a
/// data-parallel run end after the same step and rank 0's checkpoint is that step's. It resumes
/// on one device.
#[test]
fn sigterm_stops_every_peer_after_the_same_step() {
    let dir = temp("sigterm-peers");
    let manifest = dir.join("checkpoint").join("manifest.json");
    let mut args = long_run(&dir, "configs/f32.toml");
    args.extend(["--set", "distributed.devices=[\"cpu\",\"cpu\"]"].map(String::from));
    let mut run_ = spawn(&args);
    run_.wait_until("the first checkpoint", |_| manifest.exists());
    run_.signal(libc::SIGTERM);
    let (code, lines) = run_.finish();
    let text = lines.join("\n");
    assert_eq!(code, Some(143), "{text}");
    let last = lines.last().unwrap();
    assert!(last.starts_with("interrupted by SIGTERM"), "{text}");
    let step = step_of(&dir.join("checkpoint"));
    assert!(
        last.contains(&format!("stopped after step {step}")),
        "{text}"
    );

    let json = dir.join("s.json");
    let mut resumed = long_run(&dir, "configs/f32.toml");
    let more = (step + 1).to_string();
    let checkpoint = arg(&dir.join("checkpoint"));
    // One device takes the two peers' 2 × 64 images as one micro-batch: the same window.
    resumed.extend(["--set", "train.batch_size=128"].map(String::from));
    resumed.extend(["--resume", &checkpoint, "--max-steps", &more].map(String::from));
    resumed.extend(["--summary-json".into(), arg(&json)]);
    let out = run(&resumed.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(summary(&json)["steps"].as_u64(), Some(step + 1));
}
