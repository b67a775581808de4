//! Capturing panics from code that reports failure by panicking (CubeCL's device set-up and
//! allocations, often on its own server thread): one hook that keeps the first matching panic
//! message from any thread, restored afterwards.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// What a captured run produced: its result (or its panic) and the first panic message, from
/// any thread, that the filter kept.
pub struct Captured<T> {
    /// `f`'s value, or the payload of its own panic.
    pub result: std::thread::Result<T>,
    /// The first kept panic message.
    pub first: Option<String>,
}

/// Runs `f` with a panic hook that keeps the first message `keep` accepts and prints nothing
/// for it; a message `keep` rejects goes to the previous hook when `chain` (else it is
/// silenced too). The previous hook is restored before returning.
pub fn capture<T>(keep: fn(&str) -> bool, chain: bool, f: impl FnOnce() -> T) -> Captured<T> {
    capture_if(move |info| keep(&message(info.payload())), chain, f)
}

/// [`capture`] of the panics raised in source files whose path holds one of `files` (a
/// crate's name: its code panics where it should return an error).
pub fn capture_from<T>(
    files: &'static [&'static str],
    chain: bool,
    f: impl FnOnce() -> T,
) -> Captured<T> {
    let keep = move |info: &panic::PanicHookInfo<'_>| {
        let file = info.location().map(|l| l.file()).unwrap_or_default();
        files.iter().any(|f| file.contains(f))
    };
    capture_if(keep, chain, f)
}

fn capture_if<T>(
    keep: impl Fn(&panic::PanicHookInfo<'_>) -> bool + Send + Sync + 'static,
    chain: bool,
    f: impl FnOnce() -> T,
) -> Captured<T> {
    let first: Arc<Mutex<Option<String>>> = Arc::default();
    let previous = Arc::new(panic::take_hook());
    let (kept, chained) = (first.clone(), previous.clone());
    panic::set_hook(Box::new(move |info| {
        let text = message(info.payload());
        if keep(info) {
            if let Ok(mut first) = kept.lock() {
                first.get_or_insert(text);
            }
        } else if chain {
            chained(info);
        }
    }));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    // Dropping our hook releases its clone of `previous`, so it can be put back.
    drop(panic::take_hook());
    if let Ok(hook) = Arc::try_unwrap(previous) {
        panic::set_hook(hook);
    }
    let first = first.lock().ok().and_then(|mut f| f.take());
    Captured { result, first }
}

/// A panic payload's message (`panic!` gives a `String` or a `&str`), else empty.
pub fn message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_matching_panic_of_any_thread_and_restores_the_hook() {
        let captured = capture(
            |m| m.contains("kept"),
            false,
            || {
                let other = std::thread::spawn(|| panic!("kept: from another thread"));
                assert!(other.join().is_err());
                panic!("dropped");
            },
        );
        assert!(captured.result.is_err());
        assert_eq!(captured.first.as_deref(), Some("kept: from another thread"));
        // The previous hook is back: a second capture starts empty.
        let again = capture(|_| true, false, || 7);
        assert_eq!((again.result.ok(), again.first), (Some(7), None));
    }
}
