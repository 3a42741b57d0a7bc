//! Kernel launches, and the CPU time spent in CUDA launch and sync calls, per worker thread and
//! step, counted by CUPTI's callback API where libcupti is present (`--cupti auto|on|off`).
//!
//! The library is opened at run time (`dlopen`, src/engine/gpu/cupti/library.rs), never linked. Where: beside libtorch as the
//! CUDA wheels lay it out — `<torch>/lib/../../nvidia/cu13/lib/libcupti.so.13` (CUDA 13, in the
//! torch wheel's own `nvidia-cuda-cupti` dependency), `../../nvidia/cuda_cupti/lib/libcupti.so.12`
//! (CUDA 12) — then by name: `libcupti.so.13`, `libcupti.so.12`, `libcupti.so`. libtorch's
//! directory is the one /proc/self/maps shows libc10 or libtorch_cpu mapped from. CUPTI takes
//! one subscriber a process: under nsys or ncu subscribing fails, and the run says so. The
//! subscription itself, made or ended as `--cupti` says: src/engine/gpu/cupti/install.rs.
//!
//! What counts, by the called function's name, in CUPTI's runtime and driver domains (only these
//! callbacks are enabled, looked up by name with `cuptiGetCallbackName`):
//! - a launch: `cudaLaunchKernel*`, `cudaLaunchCooperativeKernel*`, `cudaGraphLaunch*` and the
//!   driver's `cuLaunchKernel*`, `cuLaunchCooperativeKernel*`, `cuGraphLaunch*`. A CUDA graph's
//!   replay is one launch; `cuLaunchHostFunc` runs no kernel and is not counted.
//! - a sync: `cudaStreamSynchronize*`, `cudaDeviceSynchronize*`, `cudaEventSynchronize*` and the
//!   driver's `cuStreamSynchronize*`, `cuCtxSynchronize*`, `cuEventSynchronize*`. A blocking
//!   `cudaMemcpy` is not one (libtorch reads the device back with an async copy and a stream
//!   sync, which is).
//!
//! A counted call made inside another (the runtime's launch calling the driver's) counts once,
//! as the outer one; its time runs from its entry to its exit. The counts land in a thread-local
//! of the thread that made the call, and `Marks::end_step` takes them into the step's record.
//! Calls of threads that are no worker's go to their CUDA context's account instead: on CUDA,
//! libtorch's autograd engine runs backward on a thread of its own per device while the worker
//! that called it waits, and a drafter's `Marks` adopts its context's account at each step's
//! end, so that its count covers its backward (and the gradient all-reduce launched from it).
//! Two drafters on one device in one process would split that account by who ends first.

use crate::telemetry::{clock, CudaCalls};
use anyhow::{bail, Result};
use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

mod install;
mod library;
pub use install::install;
pub use library::{candidates, torch_lib_dir};

/// `--cupti`: count when a worker is on CUDA and the library loads (`auto`), insist (`on`), or
/// never subscribe (`off`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Setting {
    #[default]
    Auto,
    On,
    Off,
}

impl Setting {
    pub fn parse(s: &str) -> Option<Setting> {
        match s {
            "auto" => Some(Setting::Auto),
            "on" => Some(Setting::On),
            "off" => Some(Setting::Off),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Setting::Auto => "auto",
            Setting::On => "on",
            Setting::Off => "off",
        }
    }
}

/// What the run does about CUPTI, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CuptiState {
    /// Asked for, not yet applied: the configuration as read (`--cupti`, and whether a worker
    /// runs on CUDA) loads nothing; `apply` subscribes or not.
    Requested { setting: Setting, uses_cuda: bool },
    /// CUPTI counts the CUDA threads' calls, through this library.
    Counting(PathBuf),
    /// It does not, for this reason (`off`, `no CUDA device in use`, `libcupti not found`, …).
    NotCounting(String),
}

impl CuptiState {
    /// The `cupti=` field of the run's `config:` line: `on`, `off`, or `n/a (why)`.
    pub fn field(&self) -> String {
        match self {
            CuptiState::Requested { setting, .. } => setting.name().into(),
            CuptiState::Counting(_) => "on".into(),
            CuptiState::NotCounting(why) if why == OFF => "off".into(),
            CuptiState::NotCounting(why) => format!("n/a ({why})"),
        }
    }

    /// Why the CUDA threads' calls are not counted (None: they are).
    pub fn why_not(&self) -> Option<String> {
        match self {
            CuptiState::Requested { .. } => Some(NOT_APPLIED.into()),
            CuptiState::Counting(_) => None,
            CuptiState::NotCounting(why) => Some(why.clone()),
        }
    }

    /// `--cupti` as read, checked without loading anything: `on` with no worker on CUDA is an
    /// error naming the flag and the fix.
    pub fn requested(setting: Setting, uses_cuda: bool) -> Result<CuptiState> {
        if setting == Setting::On && !uses_cuda {
            bail!(
                "--cupti on: no worker runs on CUDA, so there are no kernel launches to count; \
                 put a worker on cuda:N (--target-devices, --drafter-devices) or use --cupti \
                 auto or off"
            );
        }
        Ok(CuptiState::Requested { setting, uses_cuda })
    }

    /// Applies a requested setting (`install`); an applied state stays as it is.
    pub fn apply(&self) -> Result<CuptiState> {
        match self {
            CuptiState::Requested { setting, uses_cuda } => install(*setting, *uses_cuda),
            applied => Ok(applied.clone()),
        }
    }
}

const OFF: &str = "off";
const NOT_APPLIED: &str = "not applied: the run has not started";
const NO_CUDA: &str = "no CUDA device in use";
const NOT_FOUND: &str = "libcupti not found";
/// What `--cupti on` tells a user whose run cannot count.
const FIX: &str = "install the nvidia-cuda-cupti wheel that matches your CUDA (a torch CUDA \
                   wheel brings it), or use --cupti auto or off";

// CUPTI's facts (cupti_callbacks.h, cupti_result.h): the callback sites, the domains, the
// results this code tells apart, and the data a runtime or driver callback gets.
const API_ENTER: u32 = 0;
const API_EXIT: u32 = 1;
const DOMAIN_DRIVER: u32 = 1;
const DOMAIN_RUNTIME: u32 = 2;
const SUCCESS: u32 = 0;
const MULTIPLE_SUBSCRIBERS: u32 = 39;
/// Callback ids looked up by name, per domain (CUDA 12.x has 782 driver and 487 runtime ids).
const MAX_CBID: u32 = 4096;

/// `CUpti_CallbackData`, as the header lays it out.
#[repr(C)]
pub struct CallbackData {
    pub callback_site: u32,
    pub function_name: *const c_char,
    pub function_params: *const c_void,
    pub function_return_value: *mut c_void,
    pub symbol_name: *const c_char,
    pub context: *mut c_void,
    pub context_uid: u32,
    pub correlation_data: *mut u64,
    pub correlation_id: u32,
}

type Callback = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);
type Subscribe = unsafe extern "C" fn(*mut *mut c_void, Callback, *mut c_void) -> u32;
type Unsubscribe = unsafe extern "C" fn(*mut c_void) -> u32;
type EnableCallback = unsafe extern "C" fn(u32, *mut c_void, u32, u32) -> u32;
type EnableDomain = unsafe extern "C" fn(u32, *mut c_void, u32) -> u32;
type CallbackName = unsafe extern "C" fn(u32, u32, *mut *const c_char) -> u32;
type ResultString = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Launch,
    Sync,
}

const LAUNCHES: [&[u8]; 6] = [
    b"cudaLaunchKernel",
    b"cudaLaunchCooperativeKernel",
    b"cudaGraphLaunch",
    b"cuLaunchKernel",
    b"cuLaunchCooperativeKernel",
    b"cuGraphLaunch",
];
const SYNCS: [&[u8]; 6] = [
    b"cudaStreamSynchronize",
    b"cudaDeviceSynchronize",
    b"cudaEventSynchronize",
    b"cuStreamSynchronize",
    b"cuCtxSynchronize",
    b"cuEventSynchronize",
];

/// A launch or a sync by the function's name (a version suffix such as `_v7000` or `_ptsz`
/// changes nothing); None for any other call.
fn kind_of(name: &[u8]) -> Option<Kind> {
    if LAUNCHES.iter().any(|p| name.starts_with(p)) {
        Some(Kind::Launch)
    } else if SYNCS.iter().any(|p| name.starts_with(p)) {
        Some(Kind::Sync)
    } else {
        None
    }
}

/// A thread's counts since its last take, and the counted call it is in.
#[derive(Clone, Copy)]
struct Calls {
    launches: u64,
    launch_ticks: u64,
    sync_ticks: u64,
    /// Counted calls entered and not yet left (a runtime call and the driver call inside it).
    depth: u32,
    outer: Kind,
    start: u64,
}

const NONE: Calls = Calls {
    launches: 0,
    launch_ticks: 0,
    sync_ticks: 0,
    depth: 0,
    outer: Kind::Launch,
    start: 0,
};

thread_local! {
    static CALLS: Cell<Calls> = const { Cell::new(NONE) };
    /// Whether this thread is a worker's (its counts are its own; else its context's account).
    static WORKER: Cell<bool> = const { Cell::new(false) };
    /// The CUDA context of this worker's last counted call (0: none yet).
    static CONTEXT: Cell<usize> = const { Cell::new(0) };
}

/// The counted calls of threads that are no worker's, for one CUDA context.
struct Account {
    context: AtomicUsize,
    launches: AtomicU64,
    launch_ticks: AtomicU64,
    sync_ticks: AtomicU64,
}

/// CUDA contexts accounted for: one per device (the primary context libtorch uses).
const ACCOUNTS: usize = 16;

#[allow(clippy::declare_interior_mutable_const)] // the initialiser of each array element
const EMPTY: Account = Account {
    context: AtomicUsize::new(0),
    launches: AtomicU64::new(0),
    launch_ticks: AtomicU64::new(0),
    sync_ticks: AtomicU64::new(0),
};

static FOREIGN: [Account; ACCOUNTS] = [EMPTY; ACCOUNTS];

/// The account of `context`, opened when `open` and there is none (None: a null context, or
/// all accounts taken).
fn account(context: usize, open: bool) -> Option<&'static Account> {
    if context == 0 {
        return None;
    }
    for a in &FOREIGN {
        match a.context.load(Relaxed) {
            c if c == context => return Some(a),
            0 if open => match a.context.compare_exchange(0, context, Relaxed, Relaxed) {
                Ok(_) => return Some(a),
                Err(c) if c == context => return Some(a),
                Err(_) => {}
            },
            _ => {}
        }
    }
    None
}

/// Makes the calling thread a worker's: its counted calls are its own from now on.
pub fn claim_thread() {
    WORKER.with(|w| w.set(true));
}

/// The calls of threads that are no worker's on the CUDA context of the calling worker's last
/// counted call, since the last adoption; starts that account over.
pub fn adopt_foreign() -> CudaCalls {
    let Some(a) = account(CONTEXT.with(Cell::get), false) else {
        return CudaCalls::default();
    };
    CudaCalls {
        launches: a.launches.swap(0, Relaxed),
        launch_ns: clock::ticks_to_ns(a.launch_ticks.swap(0, Relaxed)),
        sync_ns: clock::ticks_to_ns(a.sync_ticks.swap(0, Relaxed)),
    }
}

/// Whether a subscription counts now (`take` gives None otherwise).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// CUPTI's callback: at a counted call's entry it notes the time, at its exit it adds the call
/// to the calling thread's counts. No allocation, no lock, no panic.
///
/// # Safety
/// `data` is null or points to a `CallbackData` whose `function_name` is null or a C string,
/// as CUPTI passes for the runtime and driver domains.
unsafe extern "C" fn on_api(_user: *mut c_void, domain: u32, _cbid: u32, data: *const c_void) {
    if data.is_null() || !(domain == DOMAIN_DRIVER || domain == DOMAIN_RUNTIME) {
        return;
    }
    // SAFETY: CUPTI passes a CUpti_CallbackData for these two domains (checked above).
    let d = unsafe { &*(data as *const CallbackData) };
    if d.function_name.is_null() {
        return;
    }
    // SAFETY: a non-null function name is a NUL-terminated global constant (the header).
    let name = unsafe { CStr::from_ptr(d.function_name) }.to_bytes();
    let Some(kind) = kind_of(name) else { return };
    let now = clock::ticks();
    let worker = WORKER.try_with(Cell::get).unwrap_or(false);
    let context = d.context as usize;
    let _ = CALLS.try_with(|cell| {
        let mut c = cell.get();
        match d.callback_site {
            API_ENTER => {
                if c.depth == 0 {
                    c.outer = kind;
                    c.start = now;
                }
                c.depth += 1;
            }
            // An exit whose entry came before the subscription is let go.
            API_EXIT if c.depth > 0 => {
                c.depth -= 1;
                if c.depth == 0 {
                    let spent = clock::elapsed(c.start, now);
                    if worker {
                        let _ = CONTEXT.try_with(|x| x.set(context));
                        match c.outer {
                            Kind::Launch => {
                                c.launches += 1;
                                c.launch_ticks += spent;
                            }
                            Kind::Sync => c.sync_ticks += spent,
                        }
                    } else if let Some(a) = account(context, true) {
                        match c.outer {
                            Kind::Launch => {
                                a.launches.fetch_add(1, Relaxed);
                                a.launch_ticks.fetch_add(spent, Relaxed);
                            }
                            Kind::Sync => {
                                a.sync_ticks.fetch_add(spent, Relaxed);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        cell.set(c);
    });
}

/// The calling thread's counts since its last take; starts them over.
fn take_counts() -> CudaCalls {
    CALLS.with(|cell| {
        let c = cell.get();
        cell.set(Calls {
            launches: 0,
            launch_ticks: 0,
            sync_ticks: 0,
            ..c
        });
        CudaCalls {
            launches: c.launches,
            launch_ns: clock::ticks_to_ns(c.launch_ticks),
            sync_ns: clock::ticks_to_ns(c.sync_ticks),
        }
    })
}

/// The calling thread's CUDA calls since its last take (None while CUPTI does not count);
/// starts them over.
pub fn take() -> Option<CudaCalls> {
    let c = take_counts();
    ACTIVE.load(Relaxed).then_some(c)
}

#[cfg(test)]
mod tests;
