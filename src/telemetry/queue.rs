//! A bounded work queue (crossbeam underneath) that measures itself: pushes, pops, time producers
//! wait on a full queue and consumers on an empty one, time-weighted depth, time spent empty and
//! full, the age of an item when it is taken, and the depth range since the last read (bursts).

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

#[derive(Debug)]
struct Shared {
    name: String,
    capacity: usize,
    producers: &'static str,
    consumers: &'static str,
    state: Mutex<QueueCounters>,
}

impl Shared {
    /// Integrates time-weighted state up to `now`, then applies the new depth.
    fn advance(&self, c: &mut QueueCounters, now: u64, new_depth: usize) {
        let dt = now.saturating_sub(c.at_ns);
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
        state: Mutex::new(QueueCounters {
            at_ns: now,
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
    /// Pushes, blocking while the queue is full; the blocked time counts as producer wait.
    pub fn push(&self, item: T) -> Result<(), QueueClosed> {
        let start = clock::now_ns();
        let mut msg = Stamped {
            item,
            pushed_ns: start,
        };
        let mut waited = false;
        loop {
            if self.cancel.is_cancelled() {
                return Err(QueueClosed::Cancelled);
            }
            match self
                .tx
                .send_timeout(msg, if waited { CANCEL_POLL } else { Duration::ZERO })
            {
                Ok(()) => break,
                Err(SendTimeoutError::Timeout(m)) => {
                    msg = m;
                    waited = true;
                }
                Err(SendTimeoutError::Disconnected(_)) => return Err(QueueClosed::Disconnected),
            }
        }
        let now = clock::now_ns();
        let mut c = self.shared.state.lock().expect("queue stats poisoned");
        self.shared.advance(&mut c, now, self.tx.len());
        c.pushes += 1;
        c.push_wait_ns += now - start;
        Ok(())
    }
}

impl<T> QueueRx<T> {
    /// Pops, blocking while the queue is empty; the blocked time counts as consumer wait.
    pub fn pop(&self) -> Result<T, QueueClosed> {
        let start = clock::now_ns();
        let msg = loop {
            if self.cancel.is_cancelled() {
                return Err(QueueClosed::Cancelled);
            }
            match self.rx.recv_timeout(CANCEL_POLL) {
                Ok(m) => break m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Err(QueueClosed::Disconnected),
            }
        };
        let now = clock::now_ns();
        let mut c = self.shared.state.lock().expect("queue stats poisoned");
        self.shared.advance(&mut c, now, self.rx.len());
        c.pops += 1;
        c.pop_wait_ns += now - start;
        c.age_ns_sum += now.saturating_sub(msg.pushed_ns);
        Ok(msg.item)
    }
}

impl QueueProbe {
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

    /// Cumulative counters up to `now_ns`; resets the depth range for the next read.
    pub fn read(&self, now_ns: u64) -> QueueCounters {
        let mut c = self.shared.state.lock().expect("queue stats poisoned");
        let depth = (self.len)();
        let now = now_ns.max(c.at_ns);
        self.shared.advance(&mut c, now, depth);
        let out = *c;
        c.min_depth = depth;
        c.max_depth = depth;
        out
    }
}
