//! Applying `--cupti` (src/engine/gpu/cupti.rs): the one subscription a process holds, made by
//! subscribing `on_api` and enabling the launch and sync callbacks through the library that
//! loads first, or ended; `on` that cannot count is an error naming the flag and the fix.

use super::library::{candidates, open_first, torch_lib_dir, Api, Library};
use super::{
    kind_of, on_api, CuptiState, Setting, ACTIVE, DOMAIN_DRIVER, DOMAIN_RUNTIME, FIX, MAX_CBID,
    MULTIPLE_SUBSCRIBERS, NO_CUDA, OFF, SUCCESS,
};
use crate::telemetry::clock;
use anyhow::{bail, Result};
use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

/// A live subscription (CUPTI's handle is an opaque pointer it owns).
struct Subscription {
    path: PathBuf,
    api: Api,
    handle: *mut c_void,
}

// SAFETY: the handle is only passed back to CUPTI, whose calls are thread safe for it.
unsafe impl Send for Subscription {}

static SUBSCRIPTION: Mutex<Option<Subscription>> = Mutex::new(None);

/// Subscribes `on_api` and enables the launch and sync callbacks of both domains (every
/// callback of both where this CUPTI cannot name them; `on_api` picks by name then).
fn subscribe(lib: &Library) -> Result<Subscription, String> {
    let api = lib.api;
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: `on_api` has CUpti_CallbackFunc's signature and lives as long as the process.
    let r = unsafe { (api.subscribe)(&mut handle, on_api, std::ptr::null_mut()) };
    if r != SUCCESS {
        let mut why = format!("cuptiSubscribe failed: {}", api.say(r));
        if r == MULTIPLE_SUBSCRIBERS {
            why.push_str(" (CUPTI takes one subscriber a process: is nsys, ncu or another profiler attached?)");
        }
        return Err(why);
    }
    let mut enabled = 0;
    for domain in [DOMAIN_RUNTIME, DOMAIN_DRIVER] {
        let Some(name_of) = api.callback_name else {
            // SAFETY: a live subscriber and a valid domain.
            if unsafe { (api.enable_domain)(1, handle, domain) } == SUCCESS {
                enabled += 1;
            }
            continue;
        };
        for cbid in 1..MAX_CBID {
            let mut name: *const c_char = std::ptr::null();
            // SAFETY: writes a pointer to a static name, or fails for an id it does not know.
            if unsafe { name_of(domain, cbid, &mut name) } != SUCCESS || name.is_null() {
                continue;
            }
            // SAFETY: a static NUL-terminated name.
            if kind_of(unsafe { CStr::from_ptr(name) }.to_bytes()).is_some()
                // SAFETY: a live subscriber, a domain and an id CUPTI named.
                && unsafe { (api.enable_callback)(1, handle, domain, cbid) } == SUCCESS
            {
                enabled += 1;
            }
        }
    }
    if enabled == 0 {
        // SAFETY: the handle this subscription got.
        unsafe { (api.unsubscribe)(handle) };
        return Err("CUPTI enabled none of the launch and sync callbacks".into());
    }
    Ok(Subscription {
        path: lib.path.clone(),
        api,
        handle,
    })
}

/// Ends a subscription (none left: CUPTI calls nothing of ours after this).
fn stop(sub: &mut Option<Subscription>) {
    ACTIVE.store(false, Relaxed);
    if let Some(s) = sub.take() {
        // SAFETY: the handle this subscription got, given back once.
        unsafe { (s.api.unsubscribe)(s.handle) };
    }
}

/// Applies `--cupti` for a run whose workers use CUDA or not (`uses_cuda`): subscribes (once a
/// process; a later run reuses it) or ends any subscription, and says which. `on` that cannot
/// count is an error naming the flag and the fix; `auto` gives the reason instead.
pub fn install(setting: Setting, uses_cuda: bool) -> Result<CuptiState> {
    install_from(setting, uses_cuda, || {
        candidates(torch_lib_dir().as_deref())
    })
}

pub(super) fn install_from(
    setting: Setting,
    uses_cuda: bool,
    candidates: impl FnOnce() -> Vec<PathBuf>,
) -> Result<CuptiState> {
    CuptiState::requested(setting, uses_cuda)?;
    let mut sub = SUBSCRIPTION.lock().unwrap_or_else(|e| e.into_inner());
    let why = match (setting, uses_cuda) {
        (Setting::Off, _) => OFF.to_string(),
        (_, false) => NO_CUDA.to_string(),
        (_, true) => {
            if let Some(s) = sub.as_ref() {
                ACTIVE.store(true, Relaxed);
                return Ok(CuptiState::Counting(s.path.clone()));
            }
            clock::init();
            match open_first(&candidates()).and_then(|lib| subscribe(&lib)) {
                Ok(s) => {
                    let path = s.path.clone();
                    *sub = Some(s);
                    ACTIVE.store(true, Relaxed);
                    return Ok(CuptiState::Counting(path));
                }
                Err(why) if setting == Setting::On => bail!("--cupti on: {why}; {FIX}"),
                Err(why) => why,
            }
        }
    };
    stop(&mut sub);
    Ok(CuptiState::NotCounting(why))
}
