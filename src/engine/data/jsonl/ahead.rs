//! Reading ahead of the loader (src/engine/data/jsonl.rs): a few threads read, parse and
//! tokenize the lines of the next stream positions while the loader packs; their results come
//! back in any order and are handed out in stream order, and a skip lets go of what was read
//! before it.

use super::{Item, Lines, Order};
use anyhow::{bail, Context, Result};
use crossbeam_channel::{Receiver, Sender};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Threads that read the lines of the next positions while the loader packs; their results come
/// back in any order and are taken in stream order.
pub(super) struct Ahead {
    jobs: Option<Sender<(u64, usize)>>,
    results: Receiver<(u64, Result<Item>)>,
    /// Results that came before their turn.
    done: HashMap<u64, Result<Item>>,
    /// Positions below it were sent out.
    sent: u64,
    /// The position asked for next when reading goes on without a skip.
    next: u64,
    /// How far ahead of the loader the threads read.
    window: u64,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Ahead {
    pub(super) fn start(lines: &Arc<Lines>, threads: usize) -> Result<Ahead> {
        let (jobs, job_rx) = crossbeam_channel::unbounded::<(u64, usize)>();
        let (result_tx, results) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for i in 0..threads {
            let (lines, job_rx, result_tx, stop) = (
                lines.clone(),
                job_rx.clone(),
                result_tx.clone(),
                stop.clone(),
            );
            let h = std::thread::Builder::new()
                .name(format!("loader-read-{i}"))
                .spawn(move || {
                    while let Ok((pos, line)) = job_rx.recv() {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let item = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            lines.item(line)
                        }))
                        .unwrap_or_else(|_| {
                            bail!(
                                "{} line {}: reading it panicked",
                                lines.path.display(),
                                line + 1
                            )
                        });
                        if result_tx.send((pos, item)).is_err() {
                            break;
                        }
                    }
                })
                .context("cannot start a data reading thread")?;
            handles.push(h);
        }
        Ok(Ahead {
            jobs: Some(jobs),
            results,
            done: HashMap::new(),
            sent: 0,
            next: 0,
            window: 32 * threads as u64,
            stop,
            threads: handles,
        })
    }

    /// The line at stream position `pos`, with the next `window` ones sent out to read.
    pub(super) fn get(&mut self, pos: u64, order: &mut Order) -> Result<Item> {
        if pos != self.next {
            self.done.retain(|&p, _| p >= pos); // skipped: what was read before goes
        }
        self.next = pos + 1;
        self.sent = self.sent.max(pos);
        let jobs = self.jobs.as_ref().expect("open until dropped");
        while self.sent < pos + self.window {
            // The threads hold the receiver until this sender goes: a send cannot fail here.
            let _ = jobs.send((self.sent, order.line(self.sent)));
            self.sent += 1;
        }
        loop {
            if let Some(item) = self.done.remove(&pos) {
                return item;
            }
            let (p, item) = self
                .results
                .recv()
                .context("the data reading threads stopped")?;
            if p >= pos {
                self.done.insert(p, item);
            }
        }
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.jobs.take();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}
