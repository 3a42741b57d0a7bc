//! A progress line on stderr for work that runs longer than a second (reading data, loading
//! weights, generating): nothing in the first second, then at most one line a second.

use std::time::{Duration, Instant};

pub struct Ticker {
    started: Instant,
    next: Instant,
}

impl Default for Ticker {
    fn default() -> Self {
        Self::new()
    }
}

impl Ticker {
    pub fn new() -> Ticker {
        let now = Instant::now();
        Ticker {
            started: now,
            next: now + Duration::from_secs(1),
        }
    }

    /// Prints `line(seconds so far)` when a second has passed since the last line (or the start).
    pub fn tick(&mut self, line: impl FnOnce(f64) -> String) {
        let now = Instant::now();
        if now >= self.next {
            self.next = now + Duration::from_secs(1);
            eprintln!("{}", line(self.seconds()));
        }
    }

    pub fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Whether the work took more than a second (then its end deserves a line too).
    pub fn took_long(&self) -> bool {
        self.seconds() > 1.0
    }
}
