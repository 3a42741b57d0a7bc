//! A panic while the pipeline is built on the caller's thread, turned into an error that names
//! what was being built. libtorch's tensor calls in tch panic on their errors, an allocation
//! past the device's memory among them: a model too large for its GPU is a sentence with the
//! fix and a non-zero exit, not a panic's message and backtrace. The libtorch frames that follow
//! its message ("Exception raised from ...") are cut.

use crate::quiet_panic::{self, Quiet};
use anyhow::{anyhow, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; a panic inside it comes back as an error naming `what` (with what lowers memory
/// when it was libtorch's out-of-memory, and where it happened when it was no libtorch error).
pub fn caught<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let outcome = {
        let _quiet = Quiet::new();
        catch_unwind(AssertUnwindSafe(f))
    };
    match outcome {
        Ok(result) => result,
        Err(payload) => {
            let raw = panic_text(payload.as_ref());
            let text = torch_message(&raw);
            let at = match quiet_panic::take_place() {
                Some(p) if !raw.contains("Torch(\"") => format!(" (at {p})"),
                _ => String::new(),
            };
            Err(anyhow!(
                "{what} failed: {text}{at}{}",
                build_oom_hint(&text)
            ))
        }
    }
}

/// A panic's message, whatever its payload.
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// What tch's `unwrap` puts before libtorch's error.
const UNWRAP: &str = "called `Result::unwrap()` on an `Err` value: ";

/// libtorch's message alone: tch's `unwrap` wrapping around it (`... Torch("...")`, its quotes
/// escaped) taken off, what came before it kept, and the C++ frames it appends ("Exception
/// raised from ...", with tch's escaped newlines or real ones) cut away.
pub fn torch_message(text: &str) -> String {
    let (head, inner, wrapped) = match text.find("Torch(\"") {
        Some(at) => {
            let head = &text[..at];
            let head = head.strip_suffix(UNWRAP).unwrap_or(head);
            (head, &text[at + "Torch(\"".len()..], true)
        }
        None => ("", text, false),
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
    let message = if wrapped {
        message.replace("\\\"", "\"")
    } else {
        message.to_string()
    };
    let message = without_allocator_advice(message.trim_end(), expandable_segments());
    format!("{head}{message}")
}

/// Whether this process's CUDA allocator runs with expandable segments (src/engine/gpu/
/// alloc_conf.rs sets them unless the user set the allocator).
fn expandable_segments() -> bool {
    let conf = crate::engine::gpu::alloc_conf::describe().replace(' ', "");
    conf.contains(crate::engine::gpu::alloc_conf::EXPANDABLE)
}

/// libtorch's out-of-memory advice to turn on expandable segments, with the documentation link
/// after it, cut where `expandable` says they are on already.
fn without_allocator_advice(message: &str, expandable: bool) -> String {
    const ADVICE: &str = "If reserved but unallocated memory is large try setting";
    let Some(at) = message.find(ADVICE).filter(|_| expandable) else {
        return message.to_string();
    };
    let rest = &message[at..];
    // The advice ends with the link's closing parenthesis.
    let end = rest.find(')').map_or(rest.len(), |e| e + 1);
    let parts = [message[..at].trim_end(), rest[end..].trim()];
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The settings that lower a running step's memory, for libtorch's out-of-memory (empty
/// otherwise). The precision levers (an FP8 target, bf16 moments) are offered by the memory
/// note said after it (src/engine/spec.rs `memory_note`), which knows which are set.
pub fn oom_hint(error: &str) -> &'static str {
    if error.contains("out of memory") {
        " — out of device memory: lower `batch`, `anchors`, `seq_len` or `loss_chunk_mib` \
         (flags or TOML run config), use a smaller --preset, or give the target and the \
         drafters GPUs of their own (--target-devices, --drafter-devices)"
    } else {
        ""
    }
}

/// The same while the models are built, where their weights are what does not fit.
fn build_oom_hint(error: &str) -> &'static str {
    if error.contains("out of memory") {
        " — out of device memory while the weights are made: give the target and the drafters \
         GPUs of their own (--target-devices, --drafter-devices; `bench engine` prints the \
         placement advice with its memory estimate), or use a smaller --preset"
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
                 9.57 GiB. — out of device memory while the weights are made"
            ),
            "{text}"
        );
        assert!(
            !text.contains("frame #0") && !text.contains("Exception raised"),
            "{text}"
        );
        assert!(
            !text.contains("(at "),
            "a libtorch error needs no place: {text}"
        );
        for fix in ["--target-devices", "--preset"] {
            assert!(text.contains(fix), "the fix {fix}: {text}");
            assert!(oom_hint(&text).contains(fix), "a running step's: {fix}");
        }
        // The precision levers come from the memory note, which knows which are set.
        assert!(!text.contains("--target-precision") && !oom_hint(&text).contains("--optimizer"));
        assert!(
            !quiet_panic::here(),
            "the thread's panics are its own again afterwards"
        );
    }

    #[test]
    fn errors_and_values_pass_through_and_other_panics_say_where() {
        assert_eq!(caught("x", || Ok(7)).unwrap(), 7);
        let e = caught("x", || -> Result<()> { Err(anyhow!("plain")) }).unwrap_err();
        assert_eq!(format!("{e:#}"), "plain");
        let e = caught("reading y", || -> Result<()> {
            panic!("index out of range")
        })
        .unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.starts_with(
                "reading y failed: index out of range (at src/engine/pipeline/caught.rs:"
            ),
            "{text}"
        );
        assert!(!text.contains("out of device memory"), "{text}");
        assert!(!quiet_panic::here());
    }

    #[test]
    fn libtorch_messages_keep_what_came_before_and_lose_the_wrapping() {
        assert_eq!(
            torch_message("called `Result::unwrap()` on an `Err` value: Torch(\"bad shape\")"),
            "bad shape"
        );
        assert_eq!(
            torch_message(
                "panicked: called `Result::unwrap()` on an `Err` value: Torch(\"a \\\"b\\\" c\")"
            ),
            "panicked: a \"b\" c"
        );
        assert_eq!(
            torch_message("loading w: Torch(\"boom\\nException raised from x\\nframe #0\")"),
            "loading w: boom"
        );
        assert_eq!(
            torch_message("boom\nException raised from x\nframe #0"),
            "boom"
        );
    }

    /// libtorch's advice to turn on expandable segments goes where they are on (as dflash-top
    /// sets them), and stays where the user turned them off.
    #[test]
    fn the_allocator_advice_goes_where_expandable_segments_are_on() {
        let oom = "CUDA out of memory. Tried to allocate 9.57 GiB. Of the allocated memory 78.35 \
                   GiB is allocated by PyTorch. If reserved but unallocated memory is large try \
                   setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid \
                   fragmentation.  See documentation for Memory Management  \
                   (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing)";
        assert_eq!(
            without_allocator_advice(oom, true),
            "CUDA out of memory. Tried to allocate 9.57 GiB. Of the allocated memory 78.35 GiB \
             is allocated by PyTorch."
        );
        assert_eq!(without_allocator_advice(oom, false), oom);
        let more = format!("{oom} (more)");
        assert!(without_allocator_advice(&more, true).ends_with("by PyTorch. (more)"));
        assert_eq!(without_allocator_advice("bad shape", true), "bad shape");
        let first = "If reserved but unallocated memory is large try setting it (link) after";
        assert_eq!(without_allocator_advice(first, true), "after");
    }
}
