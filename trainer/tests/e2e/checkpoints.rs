//! Hostile checkpoints (issue 31): files that are no regular files, manifests that name other
//! paths, and records whose hashes pass but that do not fit the run. Each is one line naming
//! the file and the field, exit 2, and no hang.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::common::{arg, binary, root, stderr, temp};
use super::reliability::{toml, with_small};

/// The longest a refused resume may take: it fails before any training.
const BOUND: Duration = Duration::from_secs(120);

/// Trains one step of the small f32 run (`sets` added) into a fresh folder `name`; returns
/// its checkpoint folder.
fn checkpoint_of(name: &str, sets: &[&str]) -> PathBuf {
    let dir = temp(name);
    let output = format!("train.output_dir={}", toml(&dir));
    let mut args = with_small(&["--config", "configs/f32.toml", "--set", &output]);
    for set in sets {
        args.extend(["--set", set]);
    }
    args.extend(["--max-steps", "1"]);
    let out = bounded(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    dir.join("checkpoint")
}

/// Runs the binary like `common::run`, killing it (and failing) past [`BOUND`].
fn bounded(args: &[&str]) -> Output {
    let mut child = Command::new(binary())
        .args(args)
        .current_dir(root())
        .env("OOMLAB_NO_CUDA", "1")
        .env("OOMLAB_NO_WGPU", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn trainer");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > BOUND {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("trainer {args:?} hung (killed after {BOUND:?})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Resumes the small f32 run from `checkpoint`; asserts exit 2 and returns the first line.
fn refused(checkpoint: &Path, what: &str) -> String {
    let output = format!(
        "train.output_dir={}",
        toml(&checkpoint.parent().unwrap().join("resumed"))
    );
    let c = arg(checkpoint);
    let out = bounded(&with_small(&[
        "--config",
        "configs/f32.toml",
        "--set",
        &output,
        "--max-steps",
        "2",
        "--resume",
        &c,
    ]));
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{what}: {text}");
    text.lines().next().unwrap_or_default().to_string()
}

/// A copy of the checkpoint folder `from` at `<from>-<name>`, to damage.
fn copy(from: &Path, name: &str) -> PathBuf {
    let to = from.with_file_name(format!("checkpoint-{name}"));
    let _ = std::fs::remove_dir_all(&to);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    to
}

/// The manifest of `dir` as JSON.
fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

fn entry(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    serde_json::json!({"bytes": bytes.len(), "sha256": sha})
}

/// Rewrites the manifest of `dir` with the size and hash of each file it lists now, as an
/// attacker (or a careless copy) would.
fn rehash(dir: &Path) {
    let mut m = manifest(dir);
    let names: Vec<String> = m["files"].as_object().unwrap().keys().cloned().collect();
    for name in names {
        m["files"][&name] = entry(&dir.join(&name));
    }
    write_manifest(dir, &m);
}

fn write_manifest(dir: &Path, m: &serde_json::Value) {
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string_pretty(m).unwrap(),
    )
    .unwrap();
}

const NOT_REGULAR: &str =
    "not a regular file (a checkpoint's files are never links, FIFOs or devices)";

/// A FIFO or a link to /dev/zero in place of a record once made `--resume` wait or hash
/// forever; a linked manifest was followed.
#[test]
fn files_of_a_checkpoint_are_read_only_as_regular_files() {
    let checkpoint = checkpoint_of("ckpt-files", &[]);

    let fifo = copy(&checkpoint, "fifo");
    std::fs::remove_file(fifo.join("model.mpk")).unwrap();
    let path = std::ffi::CString::new(arg(&fifo.join("model.mpk"))).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    assert_eq!(
        refused(&fifo, "FIFO"),
        format!(
            "error: checkpoint file {}: {NOT_REGULAR}",
            fifo.join("model.mpk").display()
        )
    );

    let zero = copy(&checkpoint, "zero");
    std::fs::remove_file(zero.join("optim.mpk")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero.join("optim.mpk")).unwrap();
    assert_eq!(
        refused(&zero, "link to /dev/zero"),
        format!(
            "error: checkpoint file {}: {NOT_REGULAR}",
            zero.join("optim.mpk").display()
        )
    );

    // A link to an intact manifest is still a link.
    let linked = copy(&checkpoint, "linked");
    std::fs::rename(linked.join("manifest.json"), linked.join("real.json")).unwrap();
    std::os::unix::fs::symlink("real.json", linked.join("manifest.json")).unwrap();
    assert_eq!(
        refused(&linked, "linked manifest"),
        format!(
            "error: checkpoint file {}: {NOT_REGULAR}",
            linked.join("manifest.json").display()
        )
    );
}

/// The manifest lists exactly the set's files: it once could name any path (read and hashed,
/// `/dev/zero` for ever) or an extra file.
#[test]
fn a_manifest_names_exactly_the_files_of_a_checkpoint() {
    let checkpoint = checkpoint_of("ckpt-manifest", &[]);
    let known = "model.mpk, optim.mpk, state.json, steps.csv";
    let hostname = Path::new("/etc/hostname");
    for (case, name, target) in [
        ("outside", "../../../etc/hostname", Some(hostname)),
        ("device", "/dev/zero", None),
        ("extra", "notes.txt", None),
    ] {
        let dir = copy(&checkpoint, case);
        let mut m = manifest(&dir);
        m["files"][name] = match (case, target) {
            ("extra", _) => {
                std::fs::write(dir.join("notes.txt"), "hello\n").unwrap();
                entry(&dir.join("notes.txt"))
            }
            // The real size and hash where the file exists: only the name can refuse it.
            (_, Some(t)) if t.is_file() => entry(t),
            _ => serde_json::json!({"bytes": 1, "sha256": "00"}),
        };
        write_manifest(&dir, &m);
        assert_eq!(
            refused(&dir, case),
            format!(
                "error: checkpoint file {}: lists {name:?}, which is not a file of a checkpoint \
                 (those are {known})",
                dir.join("manifest.json").display()
            ),
            "{case}"
        );
    }
    let missing = copy(&checkpoint, "missing");
    let mut m = manifest(&missing);
    m["files"].as_object_mut().unwrap().remove("steps.csv");
    write_manifest(&missing, &m);
    assert_eq!(
        refused(&missing, "missing"),
        format!(
            "error: checkpoint file {}: does not list steps.csv",
            missing.join("manifest.json").display()
        )
    );
}

/// Records that pass their hashes but belong to another run: another model (Burn panicked),
/// another optimizer (Burn's multi-line error, exit 1).
#[test]
fn records_of_another_model_or_optimizer_are_refused() {
    let checkpoint = checkpoint_of("ckpt-records", &[]);
    let mobilenet = checkpoint_of("ckpt-records-mobilenet", &["model.name=\"mobilenet\""]);
    let sgd = checkpoint_of("ckpt-records-sgd", &["train.optimizer=\"sgd\""]);

    let dir = copy(&checkpoint, "mobilenet");
    std::fs::copy(mobilenet.join("model.mpk"), dir.join("model.mpk")).unwrap();
    rehash(&dir);
    assert_eq!(
        refused(&dir, "MobileNet weights"),
        format!(
            "error: checkpoint file {}: the model is a MobileNet where this run's is a Simple",
            dir.join("model.mpk").display()
        )
    );

    let dir = copy(&checkpoint, "sgd");
    // SGD's momentum buffers, keyed by the SGD run's parameters: its model comes along.
    for file in ["model.mpk", "optim.mpk"] {
        std::fs::copy(sgd.join(file), dir.join(file)).unwrap();
    }
    rehash(&dir);
    assert_eq!(
        refused(&dir, "SGD state"),
        format!(
            "error: checkpoint file {}: the state of parameter conv.weight is not adam's: it \
             holds momentum.velocity where adam keeps momentum.max_moment_2, momentum.moment_1, \
             momentum.moment_2, momentum.time",
            dir.join("optim.mpk").display()
        )
    );

    // Adam state of another run's parameters: ids this model does not have.
    let dir = copy(&checkpoint, "foreign");
    std::fs::copy(sgd.join("model.mpk"), dir.join("model.mpk")).unwrap();
    rehash(&dir);
    let line = refused(&dir, "foreign ids");
    let prefix = format!(
        "error: checkpoint file {}: holds state for parameter id ",
        dir.join("optim.mpk").display()
    );
    assert!(
        line.starts_with(&prefix) && line.ends_with(", which is not a parameter of model.mpk"),
        "{line}"
    );
}

/// `state.json` counters a run cannot reach once loaded silently.
#[test]
fn absurd_loop_counters_are_refused() {
    let checkpoint = checkpoint_of("ckpt-state", &[]);
    // One step of 4 windows an epoch: epoch 0, window 1, step 1.
    for (case, key, value, what) in [
        (
            "step",
            "step",
            serde_json::json!(u64::MAX),
            "step 18446744073709551615 is more than the 1000000000 steps a run may take",
        ),
        (
            "epoch",
            "epoch",
            serde_json::json!(4_000_000_000u64),
            "epoch 4000000000 is more than the 1000000 epochs a run may train",
        ),
        (
            "skipped",
            "skipped",
            serde_json::json!(5),
            "step 1 and skipped 5 do not add up to the windows trained: 1 by epoch 0, window 1 \
             at 4 windows an epoch",
        ),
    ] {
        let dir = copy(&checkpoint, case);
        let path = dir.join("state.json");
        let mut state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            (state["step"].as_u64(), state["window"].as_u64()),
            (Some(1), Some(1))
        );
        state[key] = value;
        std::fs::write(&path, serde_json::to_string_pretty(&state).unwrap()).unwrap();
        rehash(&dir);
        assert_eq!(
            refused(&dir, case),
            format!("error: checkpoint file {}: {what}", path.display()),
            "{case}"
        );
    }
}

/// A tmpfs mounted for one test, unmounted however the test ends.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A full disk while checkpointing: the OS's reason reaches the line (it was Burn's
/// `Unknown("invalid value write: error while writing multi-byte MessagePack value")`), and
/// no partial set is left behind. Needs root to mount a 256 KiB tmpfs; elsewhere it says so
/// and checks nothing.
#[test]
fn a_full_disk_is_named_with_the_os_error() {
    let dir = temp("full-disk");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&dir)
        .stderr(Stdio::null())
        .status();
    if !mounted.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    }
    let _guard = Mounted(dir.clone());
    let output = format!("train.output_dir={}", toml(&dir.join("run")));
    let args = with_small(&[
        "--config",
        "configs/f32.toml",
        "--set",
        &output,
        "--max-steps",
        "1",
    ]);
    let out = bounded(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.ends_with("No space left on device (os error 28)"),
        "{last}"
    );
    assert!(
        last.contains(&arg(&dir.join("run"))),
        "names the file: {last}"
    );
    assert!(!text.contains("MessagePack"), "{text}");
    assert!(
        !dir.join("run/checkpoint.partial").exists(),
        "no partial set is left behind"
    );
}
