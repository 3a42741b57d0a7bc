//! Every place a step of the engine reads the device back to the host (and so waits for the
//! work queued before it) goes through `read`, which counts it for the calling thread and the
//! phase it last marked. `Marks::end_step` hands the step's counts to its record; the hub shows
//! them per thread and phase and the `host_sync` warning rule judges them.
//!
//! Counted: the engine's own reads (today one a drafter step: the step's figures, in `metrics`).
//! Not counted: the `sync` GPU timing mode's waits at phase marks (the profiler's, chosen by the
//! user) and reads outside a step (checkpoints). A read on the CPU is counted too: it is the same
//! code, and a host sync once the step runs on a GPU.

use crate::telemetry::{Phase, N_PHASES};
use std::cell::Cell;
use tch::{Device, TchError, Tensor};

thread_local! {
    /// This thread's host syncs since its last step ended, by phase.
    static COUNTS: Cell<[u32; N_PHASES]> = const { Cell::new([0; N_PHASES]) };
}

/// Reads `t` back to the host as `T` (a number or a `Vec`), counting one host sync.
pub fn read<T>(t: &Tensor) -> Result<T, TchError>
where
    T: for<'a> TryFrom<&'a Tensor, Error = TchError>,
{
    count_one();
    T::try_from(&t.to_device(Device::Cpu))
}

/// Counts one host sync in the phase the calling thread last marked (`other` before any).
fn count_one() {
    let phase = crate::telemetry::phase::current().unwrap_or(Phase::Other);
    COUNTS.with(|c| {
        let mut n = c.get();
        n[phase.index()] = n[phase.index()].saturating_add(1);
        c.set(n);
    });
}

/// The calling thread's host syncs since the last take, by phase; starts the count over.
pub fn take() -> [u32; N_PHASES] {
    COUNTS.with(|c| c.replace([0; N_PHASES]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_counts_in_the_phase_last_marked_and_take_starts_over() {
        let _ = take();
        let t = Tensor::from_slice(&[1.5f32, 2.5]);
        let v: Vec<f32> = read(&t).unwrap();
        assert_eq!(v, [1.5, 2.5]);
        let x: f64 = read(&t.sum(tch::Kind::Double)).unwrap();
        assert_eq!(x, 4.0);
        let n = take();
        let at = crate::telemetry::phase::current().unwrap_or(Phase::Other);
        assert_eq!(n[at.index()], 2);
        assert_eq!(n.iter().sum::<u32>(), 2);
        assert_eq!(take(), [0; N_PHASES]);
    }
}
