//! The pipeline's worker threads as one crew: each started on a named thread, a failure (an
//! error or a panic) turned into one sentence naming the thread and its phase (and after an
//! out-of-memory the memory note), kept, told at once to the other ranks of a job, and the whole
//! crew stopped.

use super::caught::{oom_hint, panic_text, torch_message};
use super::memory_checks::with_memory_note;
use crate::cancel::CancelToken;
use crate::engine::parallel::ranks::JobLink;
use anyhow::{Context, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What every worker thread shares: the first errors, the stop, the count of those running.
pub(super) struct Crew {
    pub(super) errors: Arc<Mutex<Vec<String>>>,
    pub(super) cancel: CancelToken,
    running: Arc<AtomicUsize>,
    /// In a job: the other ranks, told at once when a worker here fails.
    link: Option<Arc<JobLink>>,
    /// Said after a worker's out-of-memory (`super::memory_note`), here and to the other ranks.
    memory_note: String,
}

impl Crew {
    /// A crew stopped by `cancel`; in a job, watched by the other ranks (a fault there stops it).
    /// `memory_note` follows a worker's out-of-memory.
    pub(super) fn new(
        cancel: CancelToken,
        link: Option<Arc<JobLink>>,
        memory_note: String,
    ) -> Result<Crew> {
        let crew = Crew {
            errors: Arc::new(Mutex::new(Vec::new())),
            cancel,
            running: Arc::new(AtomicUsize::new(0)),
            link,
            memory_note,
        };
        if let Some(l) = &crew.link {
            l.watch(crew.cancel.clone(), crew.running.clone())?;
        }
        Ok(crew)
    }
}

/// Decrements the running count however the worker's thread ends.
struct Leaving(Arc<AtomicUsize>);

impl Drop for Leaving {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Starts `f` on a thread named `name`: a failure (an error or a panic) is kept as a sentence
/// naming the thread and its phase, told to the other ranks of a job, and stops the crew.
pub(super) fn spawn<F: FnOnce() -> Result<()> + Send + 'static>(
    name: String,
    crew: &Crew,
    f: F,
) -> Result<JoinHandle<()>> {
    let errors = crew.errors.clone();
    let cancel = crew.cancel.clone();
    let link = crew.link.clone();
    let note = crew.memory_note.clone();
    let label = name.clone();
    crew.running.fetch_add(1, Ordering::SeqCst);
    let leaving = Leaving(crew.running.clone());
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let _leaving = leaving;
            // Fault injection for the tests of the terminal's restore path: checked once, at start.
            if crate::fault::panic_at_start(&label) {
                panic!("injected panic in {label} (DFLASH_TOP_FAULT=panic_at_start:{label})");
            }
            // A panic is caught here, quietly (libtorch's errors, an allocation past the GPU's
            // memory among them, are panics in tch), so that the others stop and the report
            // names the thread and its phase, like an error, and where it happened unless it was
            // libtorch's error.
            let outcome = {
                let _quiet = crate::quiet_panic::Quiet::new();
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            };
            let failure = match outcome {
                Ok(Ok(())) => return,
                Ok(Err(e)) => format!("{e:#}"),
                Err(p) => {
                    let raw = panic_text(p.as_ref());
                    match crate::quiet_panic::take_place() {
                        Some(at) if !raw.contains("Torch(\"") => {
                            format!("panicked: {raw} (at {at})")
                        }
                        _ => format!("panicked: {raw}"),
                    }
                }
            };
            let sentence = worker_failure(&label, crate::telemetry::phase::current(), &failure);
            let sentence = with_memory_note(&sentence, &note).unwrap_or(sentence);
            // The other ranks of a job learn it now, unless this failure follows theirs.
            if let Some(l) = link.as_ref().filter(|l| l.fault().is_none()) {
                l.say_failed(&sentence);
            }
            errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(sentence);
            cancel.cancel();
        })
        .context("cannot start a worker thread")
}

/// The sentence for a worker that failed: the thread, its phase, the error, and for libtorch's
/// out-of-memory the settings that lower memory.
pub fn worker_failure(thread: &str, phase: Option<crate::telemetry::Phase>, error: &str) -> String {
    let phase = phase.map_or("start-up".to_string(), |p| format!("phase `{}`", p.name()));
    let error = torch_message(error);
    format!("{thread} failed in {phase}: {error}{}", oom_hint(&error))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker's out-of-memory is kept (and so told to a job's other ranks, the same sentence)
    /// with the memory note after it; another error without.
    #[test]
    fn a_workers_out_of_memory_carries_the_memory_note() {
        let crew = Crew::new(CancelToken::new(), None, "the note".into()).unwrap();
        let failing = |error: &'static str| -> Result<()> { Err(anyhow::anyhow!(error)) };
        for (name, error) in [("oom", "CUDA out of memory."), ("other", "bad shape")] {
            spawn(name.into(), &crew, move || failing(error))
                .unwrap()
                .join()
                .unwrap();
        }
        let errors = crew.errors.lock().unwrap().clone();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with("oom failed in start-up: CUDA out of memory.")
                && errors[0].ends_with(" (the note)"),
            "{}",
            errors[0]
        );
        assert_eq!(errors[1], "other failed in start-up: bad shape");
        assert!(crew.cancel.is_cancelled(), "a failure stops the crew");
    }
}
