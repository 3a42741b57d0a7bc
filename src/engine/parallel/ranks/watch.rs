//! The watch over a job's ranks: this rank's heartbeat in the store and a look at the others'
//! twice a second; a rank that fails or falls silent is the fault that stops this one, and how
//! each rank ended is said in the store (src/engine/parallel/ranks.rs has the rendezvous and exchanges).

use super::*;

impl JobLink {
    /// The fault that stopped this rank, if one did.
    pub fn fault(&self) -> Option<String> {
        self.fault.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(in crate::engine) fn set_fault(&self, why: String) {
        let mut f = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(why);
        }
    }

    /// The heartbeat and the watch over the others, on a thread of its own until `finish`.
    /// `running` counts this process's workers: after a fault, if some are still running
    /// `EXIT_GRACE` later, the process exits.
    pub fn watch(
        self: &Arc<Self>,
        cancel: CancelToken,
        running: Arc<AtomicUsize>,
    ) -> Result<JoinHandle<()>> {
        let link = self.clone();
        std::thread::Builder::new()
            .name("job-watch".into())
            .spawn(move || link.watch_loop(cancel, running))
            .map_err(|e| anyhow!("cannot start the job's watch thread: {e}"))
    }

    fn watch_loop(&self, cancel: CancelToken, running: Arc<AtomicUsize>) {
        let me = self.tag.rank;
        let others: Vec<u32> = (0..self.tag.world).filter(|r| *r != me).collect();
        let mut last: BTreeMap<u32, (i64, Instant)> = BTreeMap::new();
        let mut faulted_at: Option<Instant> = None;
        while !self.ending.load(Ordering::SeqCst) {
            if let Some(at) = faulted_at {
                if running.load(Ordering::SeqCst) == 0 {
                    return; // every worker ended: the session reports the fault
                }
                if at.elapsed() >= EXIT_GRACE {
                    let why = self.fault().unwrap_or_default();
                    (self.hooks.exit_now)(
                        1,
                        &format!(
                            "dflash-top: {why} (this rank did not stop within {} s: exiting)",
                            EXIT_GRACE.as_secs()
                        ),
                    );
                }
            } else if let Some(why) = self.look(&cancel, me, &others, &mut last) {
                self.set_fault(why);
                cancel.cancel();
                faulted_at = Some(Instant::now());
            }
            std::thread::sleep(BEAT);
        }
    }

    /// One beat: ours, then the others' (None while all is well).
    fn look(
        &self,
        cancel: &CancelToken,
        me: u32,
        others: &[u32],
        last: &mut BTreeMap<u32, (i64, Instant)>,
    ) -> Option<String> {
        let lost_store = |e: String| store_gone(&self.tag, &e);
        if let Err(e) = self.beat.add(&format!("alive/{me}"), 1) {
            return Some(lost_store(e));
        }
        for &r in others {
            match self.beat.try_get(&format!("end/{r}")) {
                Err(e) => return Some(lost_store(e)),
                Ok(Some(v)) if v.is_empty() => {
                    // It ended well (its steps done, or its user stopped it): so does this one.
                    cancel.cancel();
                    continue;
                }
                Ok(Some(v)) => {
                    return Some(format!(
                        "rank {r} failed: {}; rank {me} stops",
                        String::from_utf8_lossy(&v)
                    ))
                }
                Ok(None) => {}
            }
            let beats = match self.beat.add(&format!("alive/{r}"), 0) {
                Ok(n) => n,
                Err(e) => return Some(lost_store(e)),
            };
            let now = Instant::now();
            let seen = last.entry(r).or_insert((beats, now));
            if seen.0 != beats {
                *seen = (beats, now);
            } else if now.duration_since(seen.1) >= LOST_AFTER {
                return Some(format!(
                    "rank {r} stopped answering (no heartbeat for {} s: it died or hangs); rank {me} stops",
                    LOST_AFTER.as_secs()
                ));
            }
        }
        None
    }

    /// Tells the others at once that this rank failed (`finish` says it again at the end).
    pub fn say_failed(&self, why: &str) {
        let _ = self
            .store
            .set(&format!("end/{}", self.tag.rank), why.as_bytes());
    }

    /// Says how this rank ended (`Err`: its failure, for the others to name) and stops the
    /// watch. Rank 0 hosts the store: it stays until every other rank has said how it ended,
    /// or is known gone (at most `LOST_AFTER` plus a little).
    pub fn finish(&self, outcome: &Result<()>) {
        self.ending.store(true, Ordering::SeqCst);
        let said = match outcome {
            Ok(()) => Vec::new(),
            Err(e) => format!("{e:#}").into_bytes(),
        };
        let _ = self.store.set(&format!("end/{}", self.tag.rank), &said);
        if self.tag.rank != 0 {
            return;
        }
        // After a fault some rank may never say: wait less for it.
        let wait = match self.fault() {
            Some(_) => Duration::from_secs(2),
            None => LOST_AFTER + Duration::from_secs(2),
        };
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            let ended = (1..self.tag.world)
                .all(|r| matches!(self.store.try_get(&format!("end/{r}")), Ok(Some(_))));
            if ended {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
