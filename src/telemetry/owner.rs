//! Which worker drives a thread that no worker registered (libtorch's own threads), where that
//! can be known from the thread's name:
//! - the intra-op pool (OpenMP in the PyTorch wheels) is created by the worker that first runs a
//!   parallel op, and a new thread inherits its creator's name: `drafter-0`'s helpers are called
//!   `drafter-0` too;
//! - the autograd engine runs the backward pass of `cuda:N` on a thread named `pt_autograd_N`:
//!   it belongs to the one drafter (the only role with grad) on that device. Two drafters on one
//!   device share it, and then it is nobody's in particular.

use super::phase::Role;

/// The kernel keeps 15 bytes of a thread's name.
pub const COMM_LEN: usize = 15;

/// A registered worker, as far as attribution needs it.
#[derive(Clone, Copy, Debug)]
pub struct Worker<'a> {
    pub name: &'a str,
    pub role: Role,
    pub device: &'a str,
}

/// `name` as the kernel shows it (cut to 15 bytes on a character boundary).
pub fn comm_of(name: &str) -> &str {
    if name.len() <= COMM_LEN {
        return name;
    }
    let mut end = COMM_LEN;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// The index in `workers` of the worker that drives a thread called `comm`, if it is known.
pub fn owner(comm: &str, workers: &[Worker]) -> Option<usize> {
    if let Some(i) = workers.iter().position(|w| comm_of(w.name) == comm) {
        return Some(i);
    }
    let device = comm.strip_prefix("pt_autograd_")?;
    device.parse::<u32>().ok()?;
    let device = format!("cuda:{device}");
    let mut drafters = workers
        .iter()
        .enumerate()
        .filter(|(_, w)| w.role == Role::Drafter && w.device == device);
    match (drafters.next(), drafters.next()) {
        (Some((i, _)), None) => Some(i),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w<'a>(name: &'a str, role: Role, device: &'a str) -> Worker<'a> {
        Worker { name, role, device }
    }

    #[test]
    fn pool_threads_and_autograd_threads_find_their_worker() {
        let ws = [
            w("loader", Role::Loader, "cpu"),
            w("target-0", Role::Target, "cuda:0"),
            w("drafter-0", Role::Drafter, "cuda:1"),
            w("drafter-1", Role::Drafter, "cuda:2"),
            w("drafter-2", Role::Drafter, "cuda:2"),
            w("a-very-long-worker-name", Role::Target, "cpu"),
        ];
        assert_eq!(owner("drafter-0", &ws), Some(2));
        assert_eq!(owner("pt_autograd_1", &ws), Some(2));
        // Two drafters on cuda:2: whose backward it runs is not known.
        assert_eq!(owner("pt_autograd_2", &ws), None);
        // No drafter on cuda:0 (the target runs without grad).
        assert_eq!(owner("pt_autograd_0", &ws), None);
        assert_eq!(owner("pt_autograd_x", &ws), None);
        assert_eq!(owner("a-very-long-wor", &ws), Some(5));
        assert_eq!(owner("hub", &ws), None);
        assert_eq!(comm_of("ééééééééé"), "ééééééé");
    }
}
