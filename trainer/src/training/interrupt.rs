//! Ctrl-C, SIGTERM and SIGHUP, for every command, by one mechanism: an [`Interrupt`] made
//! first thing in `main` (before any folder is made) and handed down to the command.
//!
//! - The first signal says so on stderr and asks the command to stop cleanly: a training run
//!   finishes its window, writes a checkpoint, says how to resume and exits with 128 + the
//!   signal (130 INT, 143 TERM, 129 HUP); a run stopped before it began makes nothing.
//! - A parent (`compare`, `find-batch-size`) forwards every signal to its running child,
//!   which runs in its own process group (a terminal's Ctrl-C reaches only the parent, so the
//!   child sees each signal once), waits for it, reports what finished and exits the same way.
//! - A second signal forwards again (the child stops at once), prints one line saying what
//!   was kept, and exits with 128 + that signal at once.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The signals that stop a command cleanly.
pub const SIGNALS: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// How long a parent waits for a child to stop cleanly after forwarding the first signal,
/// before forwarding it again (the child then stops at once).
const CHILD_GRACE: Duration = Duration::from_secs(120);

/// How long a parent waits for a child after forwarding a second signal, before killing it.
const CHILD_LAST: Duration = Duration::from_secs(10);

/// Set in a child's environment to the parent's pid: the child asks to receive SIGTERM when
/// the parent dies, so a killed parent leaves no orphan training on.
pub const PARENT_PID_ENV: &str = "OOMLAB_PARENT_PID";

/// What a second signal says was kept: "the last checkpoint in … is intact (--resume …)".
type Kept = Box<dyn Fn() -> String + Send>;

/// Whether, and by which signal, the process was asked to stop; the one handler of
/// SIGINT, SIGTERM and SIGHUP, owned by a thread that this value starts.
pub struct Interrupt {
    shared: Arc<Shared>,
}

struct Shared {
    /// The first signal received (0: none), read without the lock by [`Interrupt::requested`].
    first: AtomicI32,
    state: Mutex<State>,
}

struct State {
    received: usize,
    /// When the first signal came.
    since: Option<Instant>,
    /// The running children that signals are forwarded to: each set while it runs, removed
    /// under this lock once it is reaped, so a forwarded signal never reaches a reused pid.
    children: Vec<u32>,
    kept: Kept,
}

impl Interrupt {
    /// Installs the handler for SIGINT, SIGTERM and SIGHUP and starts its thread. In a child
    /// of `compare` or `find-batch-size` it also asks for SIGTERM when the parent dies.
    pub fn install() -> std::io::Result<Self> {
        let mut signals = Signals::new(SIGNALS)?;
        let shared = Arc::new(Shared {
            first: AtomicI32::new(0),
            state: Mutex::new(State {
                received: 0,
                since: None,
                children: Vec::new(),
                kept: Box::new(|| "nothing had been written yet".into()),
            }),
        });
        let handler = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    handler.received(signal);
                }
            })?;
        if let Some(parent) = std::env::var(PARENT_PID_ENV)
            .ok()
            .and_then(|p| p.parse().ok())
        {
            die_with_parent(parent);
        }
        Ok(Self { shared })
    }

    /// The first signal received, if any.
    pub fn requested(&self) -> Option<i32> {
        match self.shared.first.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// What a second signal reports as kept, from now on (asked at that moment).
    pub fn on_second(&self, kept: impl Fn() -> String + Send + 'static) {
        self.shared.lock().kept = Box::new(kept);
    }

    /// Waits for `child`, forwarding every signal to it meanwhile (and at once a signal that
    /// came before it was registered). The wait is bounded once a signal came: after
    /// [`CHILD_GRACE`] the signal is forwarded again, and [`CHILD_LAST`] later the child is
    /// killed.
    pub fn wait(&self, child: &mut Child) -> std::io::Result<ExitStatus> {
        let mut status = None;
        self.wait_all(std::slice::from_mut(child), None, |_, s| status = Some(s))?;
        status.ok_or_else(|| std::io::Error::other("the child was not reaped"))
    }

    /// Waits for every one of `children`, forwarding every signal to each one still running
    /// and calling `ended(index, status)` as each ends, bounded once a signal came as
    /// [`Interrupt::wait`] is, and `linger` after the first child that failed, when given:
    /// the rest are then killed.
    pub fn wait_all(
        &self,
        children: &mut [Child],
        linger: Option<Duration>,
        mut ended: impl FnMut(usize, ExitStatus),
    ) -> std::io::Result<()> {
        let mut failed_at: Option<Instant> = None;
        let mut running: Vec<usize> = (0..children.len()).collect();
        {
            let mut state = self.shared.lock();
            for child in children.iter() {
                state.children.push(child.id());
                if let Some(signal) = self.requested() {
                    forward(child.id(), signal);
                }
            }
        }
        let mut again = false;
        while !running.is_empty() {
            {
                let mut state = self.shared.lock();
                let mut failure = None;
                running.retain(|&i| {
                    let status = match children[i].try_wait() {
                        Ok(None) => return true,
                        Ok(Some(status)) => Some(status),
                        Err(e) => {
                            failure.get_or_insert(e);
                            None
                        }
                    };
                    let pid = children[i].id();
                    state.children.retain(|p| *p != pid);
                    if let Some(status) = status {
                        if !status.success() {
                            failed_at.get_or_insert_with(Instant::now);
                        }
                        ended(i, status);
                    }
                    false
                });
                if let (Some(at), Some(linger)) = (failed_at, linger) {
                    if at.elapsed() > linger {
                        for &i in &running {
                            let _ = children[i].kill();
                        }
                    }
                }
                if let Some(e) = failure {
                    for &i in &running {
                        let pid = children[i].id();
                        state.children.retain(|p| *p != pid);
                    }
                    return Err(e);
                }
                let waited = state.since.map(|since| since.elapsed());
                if let (Some(waited), Some(signal)) = (waited, self.requested()) {
                    if !again && waited > CHILD_GRACE {
                        for &i in &running {
                            forward(children[i].id(), signal);
                        }
                        again = true;
                    } else if waited > CHILD_GRACE + CHILD_LAST {
                        // The children ignored two signals: they are ended, not left running.
                        for &i in &running {
                            let _ = children[i].kill();
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl std::fmt::Debug for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interrupt")
            .field("requested", &self.requested())
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it: plain fields.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One signal: forwarded to the running child; the first asks for a clean stop, a
    /// second ends the process at once with one line.
    fn received(&self, signal: i32) {
        let mut state = self.lock();
        state.received += 1;
        for &pid in &state.children {
            forward(pid, signal);
        }
        // A progress bar may be drawn on a terminal: the line starts on its own.
        let start = if std::io::stderr().is_terminal() {
            "\n"
        } else {
            ""
        };
        let short = short_name(signal);
        // Written without eprintln!, which panics where the terminal is gone (SIGHUP): the
        // stop must happen whether or not its line can be shown.
        let mut err = std::io::stderr();
        if signal == SIGHUP {
            leave_the_terminal();
        }
        if state.received == 1 {
            state.since = Some(Instant::now());
            self.first.store(signal, Ordering::SeqCst);
            let _ = writeln!(
                err,
                "{start}{short} received: finishing the current step, then stopping cleanly \
                 (a second {short} stops at once)"
            );
        } else {
            let _ = writeln!(
                err,
                "{start}second {short}: stopped at once; {}",
                crate::report::printable(&(state.kept)())
            );
            // `_exit`: other threads may be mid-step; nothing of theirs must run on the way out.
            signal_hook::low_level::exit(128 + signal);
        }
    }
}

/// After SIGHUP the terminal is gone: a write to it fails (EIO), and every `println!` or
/// `eprintln!` the run still makes (a note, the summary table) would panic. Standard output
/// and error that are terminals are pointed at /dev/null instead; a file or a pipe they write
/// to (`trainer … > log 2>&1`) is kept.
fn leave_the_terminal() {
    use std::os::fd::AsRawFd;
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return;
    };
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: isatty(3) and dup2(2) take plain descriptors and touch no memory of ours;
        // `null` is open for both calls, and dup2 replaces `fd` in one step, so no other
        // thread's write sees it closed.
        unsafe {
            if libc::isatty(fd) == 1 {
                libc::dup2(null.as_raw_fd(), fd);
            }
        }
    }
}

/// Sends `signal` to the child `pid`, which the caller has not reaped.
pub(crate) fn forward(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) reads no memory of ours. `pid` is a child of this process that has not
    // been reaped (the caller holds the lock under which it is cleared once reaped), so it
    // names that child and no other process.
    unsafe { libc::kill(pid, signal) };
}

/// Asks the kernel for SIGTERM when the parent `parent` dies (a child run then checkpoints
/// and stops), and stops at once if it has died already. (The kernel sends it when the parent's
/// thread that started this process ends: `compare` and `find-batch-size` start children from
/// their main thread.)
fn die_with_parent(parent: u32) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, SIGTERM as libc::c_ulong) };
    if std::os::unix::process::parent_id() != parent {
        // The parent died before the request was made: no one is waiting for this run.
        std::process::exit(128 + SIGTERM);
    }
}

/// The run stopped at a signal, after checkpointing.
#[derive(Debug, thiserror::Error)]
#[error(
    "interrupted by {}: stopped after step {step}; the checkpoint is in {}; continue with \
     --resume {}",
    name(*signal),
    checkpoint.display(),
    checkpoint.display()
)]
pub struct Interrupted {
    /// SIGINT, SIGTERM or SIGHUP.
    pub signal: i32,
    /// Optimizer steps taken.
    pub step: usize,
    /// The checkpoint written.
    pub checkpoint: PathBuf,
}

/// A command stopped at a signal: `what` says what it kept (a run stopped before it began,
/// `compare`'s report of the configs that finished, `find-batch-size`'s trials so far).
#[derive(Debug, thiserror::Error)]
#[error("interrupted by {}: {what}", name(*signal))]
pub struct Stopped {
    /// SIGINT, SIGTERM or SIGHUP.
    pub signal: i32,
    /// What was done and kept, in a few words.
    pub what: String,
}

/// The signal's name, with what usually sends it.
fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT (Ctrl-C)",
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP (the terminal closed)",
        _ => "a signal",
    }
}

/// The signal's short name.
fn short_name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP",
        _ => "signal",
    }
}
