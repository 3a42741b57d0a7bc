//! A bounded work queue (crossbeam underneath) that measures itself: pushes, pops, time producers
//! wait on a full queue and consumers on an empty one, time-weighted depth, time spent empty and
//! full, the age of an item when it is taken, and the depth range since the last read (bursts).
//! A wait still in progress counts up to the moment the hub reads the queue (live time), and an
//! item's age starts when it enters the queue, not when a blocked push began.

use super::clock;
use crate::cancel::CancelToken;
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, SendTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a blocked push or pop looks at the cancellation token.
const CANCEL_POLL: Duration = Duration::from_millis(20);

/// Cumulative counters of one queue; the hub takes differences between two reads.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueCounters {
    pub at_ns: u64,
    pub depth: usize,
    pub pushes: u64,
    pub pops: u64,
    pub push_wait_ns: u64,
    pub pop_wait_ns: u64,
    /// Integral of depth over time, depth x ns.
    pub depth_ns: u128,
    pub empty_ns: u64,
    pub full_ns: u64,
    pub age_ns_sum: u64,
    /// Depth range since the previous read.
    pub min_depth: usize,
    pub max_depth: usize,
}

/// Waits that have begun and not ended: how many, and the sum of their start times.
#[derive(Clone, Copy, Debug, Default)]
struct Waiting {
    count: u64,
    start_sum: u128,
}

impl Waiting {
    /// Time all of them have waited by `now`.
    fn so_far(&self, now: u64) -> u64 {
        (self.count as u128 * now as u128).saturating_sub(self.start_sum) as u64
    }
}

#[derive(Debug, Default)]
struct State {
    counters: QueueCounters,
    pushers: Waiting,
    poppers: Waiting,
}

#[derive(Debug)]
struct Shared {
    name: String,
    capacity: usize,
    producers: &'static str,
    consumers: &'static str,
    /// Counters arrive from another process (`set_remote`) instead of being kept here.
    remote: bool,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the start of a blocked push (`push`) or pop; returns its start time.
    fn begin_wait(&self, push: bool) -> u64 {
        let mut st = self.lock();
        // Move the queue's clock to the wait's start, so that a later read's "now" is never
        // before it (a negative term would shrink the other waits' sum).
        let depth = st.counters.depth;
        self.advance(&mut st.counters, clock::now_ns(), depth);
        let now = st.counters.at_ns;
        let w = if push {
            &mut st.pushers
        } else {
            &mut st.poppers
        };
        w.count += 1;
        w.start_sum += now as u128;
        now
    }

    /// Ends a wait begun at `start` (under the lock the caller holds).
    fn end_wait(st: &mut State, push: bool, start: u64) {
        let w = if push {
            &mut st.pushers
        } else {
            &mut st.poppers
        };
        w.count -= 1;
        w.start_sum -= start as u128;
    }

    /// Integrates time-weighted state up to `now`, then applies the new depth. Time never runs
    /// backwards here: a reading older than the last one (another core's clock) counts as zero.
    fn advance(&self, c: &mut QueueCounters, now: u64, new_depth: usize) {
        let now = now.max(c.at_ns);
        let dt = now - c.at_ns;
        c.depth_ns += c.depth as u128 * dt as u128;
        if c.depth == 0 {
            c.empty_ns += dt;
        }
        if c.depth >= self.capacity {
            c.full_ns += dt;
        }
        c.at_ns = now;
        c.depth = new_depth;
        c.min_depth = c.min_depth.min(new_depth);
        c.max_depth = c.max_depth.max(new_depth);
    }
}

struct Stamped<T> {
    item: T,
    pushed_ns: u64,
}

/// The producing end. Clone it for several producers; the queue closes when all are dropped.
pub struct QueueTx<T> {
    tx: Sender<Stamped<T>>,
    shared: Arc<Shared>,
    cancel: CancelToken,
}

impl<T> Clone for QueueTx<T> {
    fn clone(&self) -> Self {
        QueueTx {
            tx: self.tx.clone(),
            shared: self.shared.clone(),
            cancel: self.cancel.clone(),
        }
    }
}

/// The consuming end. Clone it for several consumers.
pub struct QueueRx<T> {
    rx: Receiver<Stamped<T>>,
    shared: Arc<Shared>,
    cancel: CancelToken,
}

impl<T> Clone for QueueRx<T> {
    fn clone(&self) -> Self {
        QueueRx {
            rx: self.rx.clone(),
            shared: self.shared.clone(),
            cancel: self.cancel.clone(),
        }
    }
}

/// A read-only handle the hub samples.
#[derive(Clone)]
pub struct QueueProbe {
    shared: Arc<Shared>,
    len: Arc<dyn Fn() -> usize + Send + Sync>,
}

impl std::fmt::Debug for QueueProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueProbe")
            .field("name", &self.shared.name)
            .finish()
    }
}

/// Why a push or pop gave up.
#[derive(Debug, PartialEq, Eq)]
pub enum QueueClosed {
    Disconnected,
    Cancelled,
}

/// Makes a monitored queue. `producers`/`consumers` name the roles on each side, for the verdict.
pub fn monitored_queue<T: Send + 'static>(
    name: &str,
    capacity: usize,
    producers: &'static str,
    consumers: &'static str,
    cancel: CancelToken,
) -> (QueueTx<T>, QueueRx<T>, QueueProbe) {
    let capacity = capacity.max(1);
    let (tx, rx) = bounded::<Stamped<T>>(capacity);
    let now = clock::now_ns();
    let shared = Arc::new(Shared {
        name: name.to_string(),
        capacity,
        producers,
        consumers,
        remote: false,
        state: Mutex::new(State {
            counters: QueueCounters {
                at_ns: now,
                ..Default::default()
            },
            ..Default::default()
        }),
    });
    let len_rx = rx.clone();
    let probe = QueueProbe {
        shared: shared.clone(),
        len: Arc::new(move || len_rx.len()),
    };
    (
        QueueTx {
            tx,
            shared: shared.clone(),
            cancel: cancel.clone(),
        },
        QueueRx { rx, shared, cancel },
        probe,
    )
}

impl<T> QueueTx<T> {
    /// Pushes, blocking while the queue is full; the blocked time counts as producer wait (live,
    /// while it lasts). The item's age starts when it is in the queue.
    pub fn push(&self, item: T) -> Result<(), QueueClosed> {
        let mut msg = Stamped {
            item,
            pushed_ns: clock::now_ns(),
        };
        let mut wait_start = None;
        let closed = loop {
            if self.cancel.is_cancelled() {
                break Some(QueueClosed::Cancelled);
            }
            let patience = if wait_start.is_some() {
                CANCEL_POLL
            } else {
                Duration::ZERO
            };
            match self.tx.send_timeout(msg, patience) {
                Ok(()) => break None,
                Err(SendTimeoutError::Timeout(mut m)) => {
                    wait_start.get_or_insert_with(|| self.shared.begin_wait(true));
                    m.pushed_ns = clock::now_ns();
                    msg = m;
                }
                Err(SendTimeoutError::Disconnected(_)) => break Some(QueueClosed::Disconnected),
            }
        };
        let mut st = self.shared.lock();
        // Not before the hub's last read: what it counted live must not shrink.
        let now = clock::now_ns().max(st.counters.at_ns);
        if let Some(start) = wait_start {
            Shared::end_wait(&mut st, true, start);
            st.counters.push_wait_ns += now.saturating_sub(start);
        }
        if let Some(why) = closed {
            return Err(why);
        }
        let depth = self.tx.len();
        self.shared.advance(&mut st.counters, now, depth);
        st.counters.pushes += 1;
        Ok(())
    }
}

impl<T> QueueRx<T> {
    /// Pops, blocking while the queue is empty; the blocked time counts as consumer wait (live,
    /// while it lasts).
    pub fn pop(&self) -> Result<T, QueueClosed> {
        let mut wait_start = None;
        let got = loop {
            if self.cancel.is_cancelled() {
                break Err(QueueClosed::Cancelled);
            }
            match self.rx.try_recv() {
                Ok(m) => break Ok(m),
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    break Err(QueueClosed::Disconnected)
                }
                Err(crossbeam_channel::TryRecvError::Empty) => {}
            }
            wait_start.get_or_insert_with(|| self.shared.begin_wait(false));
            match self.rx.recv_timeout(CANCEL_POLL) {
                Ok(m) => break Ok(m),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break Err(QueueClosed::Disconnected),
            }
        };
        self.took(got, wait_start)
    }

    /// Pops what is there without waiting: `None` when the queue is empty, closed or cancelled.
    pub fn try_pop(&self) -> Option<T> {
        if self.cancel.is_cancelled() {
            return None;
        }
        let got = self.rx.try_recv().map_err(|_| QueueClosed::Disconnected);
        self.took(got, None).ok()
    }

    /// Counts a pop that ended (`wait_start`: when it began to wait, if it did).
    fn took(
        &self,
        got: Result<Stamped<T>, QueueClosed>,
        wait_start: Option<u64>,
    ) -> Result<T, QueueClosed> {
        let mut st = self.shared.lock();
        // Not before the hub's last read: what it counted live must not shrink.
        let now = clock::now_ns().max(st.counters.at_ns);
        if let Some(start) = wait_start {
            Shared::end_wait(&mut st, false, start);
            st.counters.pop_wait_ns += now.saturating_sub(start);
        }
        let msg = got?;
        let depth = self.rx.len();
        self.shared.advance(&mut st.counters, now, depth);
        st.counters.pops += 1;
        st.counters.age_ns_sum += now.saturating_sub(msg.pushed_ns);
        Ok(msg.item)
    }
}

impl QueueProbe {
    /// A queue of another process (an attached pipeline): `read` returns the counters last
    /// given to `set_remote`.
    pub fn remote(
        name: &str,
        capacity: usize,
        producers: &'static str,
        consumers: &'static str,
    ) -> QueueProbe {
        QueueProbe {
            shared: Arc::new(Shared {
                name: name.to_string(),
                capacity: capacity.max(1),
                producers,
                consumers,
                remote: true,
                state: Mutex::new(State::default()),
            }),
            len: Arc::new(|| 0),
        }
    }

    /// The latest counters of a remote queue (timestamps on this process's clock).
    pub fn set_remote(&self, c: QueueCounters) {
        self.shared.lock().counters = c;
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    pub fn producers(&self) -> &'static str {
        self.shared.producers
    }

    pub fn consumers(&self) -> &'static str {
        self.shared.consumers
    }

    /// Cumulative counters up to `now_ns`, waits still in progress included up to then; resets
    /// the depth range for the next read. Successive reads never decrease.
    pub fn read(&self, now_ns: u64) -> QueueCounters {
        let mut st = self.shared.lock();
        if self.shared.remote {
            return st.counters;
        }
        let depth = (self.len)();
        self.shared.advance(&mut st.counters, now_ns, depth);
        let now = st.counters.at_ns;
        let mut out = st.counters;
        out.push_wait_ns += st.pushers.so_far(now);
        out.pop_wait_ns += st.poppers.so_far(now);
        st.counters.min_depth = depth;
        st.counters.max_depth = depth;
        out
    }
}
