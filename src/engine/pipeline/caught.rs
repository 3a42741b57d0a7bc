//! A panic while the pipeline is built on the caller's thread, turned into an error that names
//! what was being built. libtorch's tensor calls in tch panic on their errors, an allocation
//! past the device's memory among them: a model too large for its GPU is a sentence with the
//! fix and a non-zero exit, not a panic's message and backtrace. The libtorch frames that follow
//! its message ("Exception raised from ...") are cut.

use anyhow::{anyhow, Result};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Set while `caught` runs `f` on this thread: its panics are reported by `caught`, so the
    /// panic hook keeps quiet about them.
    static QUIET: Cell<u32> = const { Cell::new(0) };
}

static HOOK: Once = Once::new();

/// Runs `f`; a panic inside it comes back as an error naming `what` (with the settings that
/// lower memory when it was libtorch's out-of-memory).
pub fn caught<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    install_quiet_hook();
    QUIET.with(|q| q.set(q.get() + 1));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(q.get() - 1));
    match outcome {
        Ok(result) => result,
        Err(payload) => {
            let text = torch_message(&panic_text(payload.as_ref()));
            Err(anyhow!("{what} failed: {text}{}", oom_hint(&text)))
        }
    }
}

/// Chains a hook that says nothing for a panic `caught` reports (installed once, on top of
/// whatever hook is there: the TUI's restores the terminal for every other panic).
fn install_quiet_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(|q| q.get()) == 0 {
                previous(info);
            }
        }));
    });
}

/// A panic's message, whatever its payload.
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// libtorch's message alone: what tch's `unwrap` wraps around it (`... Torch("...")`) and the
/// C++ frames it appends ("Exception raised from ...", with tch's escaped newlines or real ones)
/// cut away.
pub fn torch_message(text: &str) -> String {
    let (inner, wrapped) = match text.find("Torch(\"") {
        Some(at) => (&text[at + "Torch(\"".len()..], true),
        None => (text, false),
    };
    let cut = ["\\nException raised from", "\nException raised from"]
        .iter()
        .filter_map(|m| inner.find(m))
        .min();
    let message = match (cut, wrapped) {
        (Some(at), _) => &inner[..at],
        (None, true) => inner.strip_suffix("\")").unwrap_or(inner),
        (None, false) => inner,
    };
    message.trim_end().to_string()
}

/// The settings that lower memory, for libtorch's out-of-memory (empty otherwise).
pub fn oom_hint(error: &str) -> &'static str {
    if error.contains("out of memory") {
        " — out of device memory: lower `batch`, `anchors`, `seq_len` or `loss_chunk_mib` \
         (TOML run config), use a smaller --preset, or give the target and the drafters GPUs of \
         their own (--target-devices, --drafter-devices)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_is_an_error_naming_what_was_built_without_libtorch_frames() {
        let e = caught("building the drafter on cuda:0", || -> Result<()> {
            panic!(
                "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. \
                 Tried to allocate 9.57 GiB.\\nException raised from malloc at x.cpp:1 (most \
                 recent call first):\\nframe #0: c10::Error::Error\")"
            )
        })
        .unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.starts_with(
                "building the drafter on cuda:0 failed: CUDA out of memory. Tried to allocate \
                 9.57 GiB. — out of device memory"
            ),
            "{text}"
        );
        assert!(
            !text.contains("frame #0") && !text.contains("Exception raised"),
            "{text}"
        );
        assert!(text.contains("--target-devices"), "the fix: {text}");
    }

    #[test]
    fn errors_and_values_pass_through_and_other_panics_carry_no_memory_hint() {
        assert_eq!(caught("x", || Ok(7)).unwrap(), 7);
        let e = caught("x", || -> Result<()> { Err(anyhow!("plain")) }).unwrap_err();
        assert_eq!(format!("{e:#}"), "plain");
        let e = caught("reading y", || -> Result<()> {
            panic!("index out of range")
        })
        .unwrap_err();
        assert_eq!(format!("{e:#}"), "reading y failed: index out of range");
        assert_eq!(
            torch_message("called `Result::unwrap()` on an `Err` value: Torch(\"bad shape\")"),
            "bad shape"
        );
        assert_eq!(
            torch_message("boom\nException raised from x\nframe #0"),
            "boom"
        );
        // The thread's panics are its own again afterwards.
        assert_eq!(QUIET.with(|q| q.get()), 0);
    }
}
