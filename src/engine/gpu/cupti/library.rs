//! Finding and opening libcupti at run time (`dlopen`, never linked): where to look beside
//! libtorch and by name, the first candidate that loads, and the CUPTI functions the counting in
//! src/engine/gpu/cupti.rs calls.

use super::{
    CallbackName, EnableCallback, EnableDomain, ResultString, Subscribe, Unsubscribe, NOT_FOUND,
    SUCCESS,
};
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// The functions this code calls, from an opened libcupti (kept open for the process's life).
#[derive(Clone, Copy)]
pub(super) struct Api {
    pub(super) subscribe: Subscribe,
    pub(super) unsubscribe: Unsubscribe,
    pub(super) enable_callback: EnableCallback,
    pub(super) enable_domain: EnableDomain,
    pub(super) callback_name: Option<CallbackName>,
    pub(super) result_string: ResultString,
}

pub(super) struct Library {
    pub(super) path: PathBuf,
    pub(super) api: Api,
}

impl Api {
    pub(super) fn say(&self, result: u32) -> String {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: cuptiGetResultString writes a pointer to a static string, or fails.
        let ok = unsafe { (self.result_string)(result, &mut s) } == SUCCESS;
        if ok && !s.is_null() {
            // SAFETY: a static NUL-terminated string (cupti_result.h).
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        } else {
            format!("CUPTI error {result}")
        }
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// A symbol of `handle`, as a function of type `F` (a pointer-sized fn type).
///
/// # Safety
/// `F` must be the symbol's real signature.
unsafe fn symbol<F: Copy>(handle: *mut c_void, name: &CStr) -> Option<F> {
    // SAFETY: `handle` came from dlopen; the name is a C string.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    // SAFETY: F is a fn pointer of the symbol's signature (the caller's promise).
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// Opens `path` (a file path, or a bare name the loader looks up) and finds CUPTI's functions.
fn open(path: &Path) -> Result<Library, String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{} is not a file name", path.display()))?;
    // SAFETY: a C string; the handle is kept (never closed) while the process runs.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(dlerror());
    }
    let lacks = |name: &str| format!("{} has no {name}", path.display());
    // SAFETY: the signatures are those of cupti_callbacks.h and cupti_result.h.
    unsafe {
        Ok(Library {
            path: path.to_path_buf(),
            api: Api {
                subscribe: symbol(handle, c"cuptiSubscribe")
                    .ok_or_else(|| lacks("cuptiSubscribe"))?,
                unsubscribe: symbol(handle, c"cuptiUnsubscribe")
                    .ok_or_else(|| lacks("cuptiUnsubscribe"))?,
                enable_callback: symbol(handle, c"cuptiEnableCallback")
                    .ok_or_else(|| lacks("cuptiEnableCallback"))?,
                enable_domain: symbol(handle, c"cuptiEnableDomain")
                    .ok_or_else(|| lacks("cuptiEnableDomain"))?,
                callback_name: symbol(handle, c"cuptiGetCallbackName"),
                result_string: symbol(handle, c"cuptiGetResultString")
                    .ok_or_else(|| lacks("cuptiGetResultString"))?,
            },
        })
    }
}

/// The directory libtorch was loaded from (None when it is not mapped, which a build of this
/// program never is).
pub fn torch_lib_dir() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libc10.so") || p.ends_with("/libtorch_cpu.so"))
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
}

/// Where to look, in order: beside libtorch as the CUDA wheels lay it out, then by name.
pub fn candidates(torch_lib: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(lib) = torch_lib {
        let site = lib.join("../..");
        out.push(site.join("nvidia/cu13/lib/libcupti.so.13"));
        out.push(site.join("nvidia/cuda_cupti/lib/libcupti.so.12"));
    }
    for name in ["libcupti.so.13", "libcupti.so.12", "libcupti.so"] {
        out.push(PathBuf::from(name));
    }
    out
}

/// The first of `candidates` that opens: a path that is not there is passed over; one that is
/// there but will not load is the reason given when none opens (else `libcupti not found`).
pub(super) fn open_first(candidates: &[PathBuf]) -> Result<Library, String> {
    let mut failed = None;
    for p in candidates {
        let bare = p.components().count() == 1;
        if !bare && !p.exists() {
            continue;
        }
        match open(p) {
            Ok(lib) => return Ok(lib),
            Err(e) if !bare => failed = Some(format!("{} would not load: {e}", p.display())),
            Err(_) => {}
        }
    }
    Err(failed.unwrap_or_else(|| NOT_FOUND.into()))
}
