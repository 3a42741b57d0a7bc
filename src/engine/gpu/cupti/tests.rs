//! Tests of the CUPTI counting (src/engine/gpu/cupti.rs).

use super::install::install_from;
use super::library::open_first;
use super::*;

/// Calls `on_api` as CUPTI would, on context 0x10.
fn call(name: &CStr, domain: u32, site: u32) {
    call_on(name, domain, site, 0x10);
}

fn call_on(name: &CStr, domain: u32, site: u32, context: usize) {
    let d = CallbackData {
        callback_site: site,
        function_name: name.as_ptr(),
        function_params: std::ptr::null(),
        function_return_value: std::ptr::null_mut(),
        symbol_name: std::ptr::null(),
        context: context as *mut c_void,
        context_uid: 1,
        correlation_data: std::ptr::null_mut(),
        correlation_id: 1,
    };
    // SAFETY: a CallbackData with a valid name, as CUPTI passes.
    unsafe {
        on_api(
            std::ptr::null_mut(),
            domain,
            0,
            &d as *const _ as *const c_void,
        )
    };
}

fn spin(ms: u64) {
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_millis(ms) {
        std::hint::spin_loop();
    }
}

fn pair(name: &CStr, domain: u32, ms: u64) {
    call(name, domain, API_ENTER);
    spin(ms);
    call(name, domain, API_EXIT);
}

#[test]
fn launches_and_syncs_count_on_the_calling_thread_once_each_and_take_starts_over() {
    claim_thread();
    let _ = take_counts();
    // A runtime launch with the driver's inside it: one launch, timed from the outer entry.
    call(c"cudaLaunchKernel", DOMAIN_RUNTIME, API_ENTER);
    pair(c"cuLaunchKernel", DOMAIN_DRIVER, 1);
    spin(1);
    call(c"cudaLaunchKernel", DOMAIN_RUNTIME, API_EXIT);
    pair(c"cuLaunchKernelEx_ptsz", DOMAIN_DRIVER, 0);
    pair(c"cuGraphLaunch", DOMAIN_DRIVER, 0);
    pair(c"cudaStreamSynchronize", DOMAIN_RUNTIME, 3);
    // Not counted: another call, a host function, another domain, an exit with no entry.
    pair(c"cuMemcpyAsync", DOMAIN_DRIVER, 2);
    pair(c"cuLaunchHostFunc", DOMAIN_DRIVER, 0);
    pair(c"cuLaunchKernel", 3, 0);
    call(c"cuStreamSynchronize", DOMAIN_DRIVER, API_EXIT);
    // Another worker's calls are its own.
    std::thread::Builder::new()
        .name("other".into())
        .spawn(|| {
            claim_thread();
            pair(c"cuLaunchKernel", DOMAIN_DRIVER, 0)
        })
        .unwrap()
        .join()
        .unwrap();
    let c = take_counts();
    assert_eq!(c.launches, 3, "{c:?}");
    assert!(
        (2_000_000..100_000_000).contains(&c.launch_ns),
        "the nested launch's 2 ms: {c:?}"
    );
    assert!(
        (3_000_000..100_000_000).contains(&c.sync_ns),
        "the sync's 3 ms, not the copy's: {c:?}"
    );
    assert_eq!(take_counts(), CudaCalls::default());
    // Counts are only handed on while a subscription counts.
    pair(c"cuLaunchKernel", DOMAIN_DRIVER, 0);
    if !ACTIVE.load(Relaxed) {
        assert_eq!(take(), None);
    }
}

/// A thread that is no worker's (libtorch's autograd thread running a backward) counts into
/// its context's account, which the worker last on that context adopts; a worker on another
/// context gets none of it.
#[test]
fn calls_of_a_thread_that_is_no_workers_go_to_the_worker_on_its_context() {
    fn named<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let t = std::thread::Builder::new().name(name.into());
        t.spawn(f).unwrap().join().unwrap()
    }
    // The worker: one launch of its own on context 0x20.
    let (own, adopted, again) = named("worker", || {
        claim_thread();
        call_on(c"cuLaunchKernel", DOMAIN_DRIVER, API_ENTER, 0x20);
        call_on(c"cuLaunchKernel", DOMAIN_DRIVER, API_EXIT, 0x20);
        let own = take_counts();
        // The autograd thread: two launches and a sync on 0x20, one launch on 0x30.
        named("autograd", || {
            for _ in 0..2 {
                call_on(c"cudaLaunchKernel", DOMAIN_RUNTIME, API_ENTER, 0x20);
                call_on(c"cudaLaunchKernel", DOMAIN_RUNTIME, API_EXIT, 0x20);
            }
            call_on(c"cuStreamSynchronize", DOMAIN_DRIVER, API_ENTER, 0x20);
            spin(2);
            call_on(c"cuStreamSynchronize", DOMAIN_DRIVER, API_EXIT, 0x20);
            call_on(c"cuLaunchKernel", DOMAIN_DRIVER, API_ENTER, 0x30);
            call_on(c"cuLaunchKernel", DOMAIN_DRIVER, API_EXIT, 0x30);
        });
        (own, adopt_foreign(), adopt_foreign())
    });
    assert_eq!(own.launches, 1, "{own:?}");
    assert_eq!(adopted.launches, 2, "{adopted:?}");
    assert!(adopted.sync_ns >= 2_000_000, "{adopted:?}");
    assert_eq!(
        again,
        CudaCalls::default(),
        "adopting starts the account over"
    );
    // 0x30's launch waits for a worker on 0x30; a thread that is no worker adopts nothing.
    assert_eq!(account(0x30, false).unwrap().launches.load(Relaxed), 1);
    assert_eq!(named("other", adopt_foreign), CudaCalls::default());
}

#[test]
fn names_sort_into_launches_syncs_and_the_rest() {
    for n in [
        "cudaLaunchKernel_v7000",
        "cudaLaunchKernelExC_v11060",
        "cudaGraphLaunch",
    ] {
        assert_eq!(kind_of(n.as_bytes()), Some(Kind::Launch), "{n}");
    }
    for n in ["cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch_ptsz"] {
        assert_eq!(kind_of(n.as_bytes()), Some(Kind::Launch), "{n}");
    }
    for n in [
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuStreamSynchronize_ptsz",
        "cudaDeviceSynchronize_v3020",
    ] {
        assert_eq!(kind_of(n.as_bytes()), Some(Kind::Sync), "{n}");
    }
    for n in [
        "cuLaunchHostFunc",
        "cuMemcpyDtoH_v2",
        "cuStreamQuery",
        "cuLaunch",
    ] {
        assert_eq!(kind_of(n.as_bytes()), None, "{n}");
    }
}

#[test]
fn the_search_says_not_found_without_the_library_and_finds_the_wheels() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("torch/lib");
    std::fs::create_dir_all(&lib).unwrap();
    let beside: Vec<PathBuf> = candidates(Some(&lib)).into_iter().take(2).collect();
    assert_eq!(
        beside,
        [
            lib.join("../../nvidia/cu13/lib/libcupti.so.13"),
            lib.join("../../nvidia/cuda_cupti/lib/libcupti.so.12"),
        ]
    );
    assert_eq!(open_first(&beside).err().as_deref(), Some(NOT_FOUND));
    // A file of that name that is not a library is named with the loader's reason.
    let fake = dir.path().join("nvidia/cu13/lib");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::write(fake.join("libcupti.so.13"), b"not a library").unwrap();
    let e = open_first(&beside).err().unwrap();
    assert!(e.contains("libcupti.so.13 would not load"), "{e}");
    // This build's libtorch is the torch wheel's: its CUDA 13 libcupti sits beside it.
    let torch = torch_lib_dir().expect("libtorch is mapped");
    let wheel = torch.join("../../nvidia/cu13/lib/libcupti.so.13");
    if wheel.exists() {
        let found = open_first(&candidates(Some(&torch))).unwrap();
        assert_eq!(found.path, wheel);
        assert!(found.api.callback_name.is_some());
    } else {
        eprintln!(
            "no {}: the wheel's libcupti is not checked",
            wheel.display()
        );
    }
}

#[test]
fn off_and_a_cpu_run_need_no_library_and_on_says_the_fix() {
    let none = Vec::new;
    assert_eq!(
        install_from(Setting::Off, true, none).unwrap(),
        CuptiState::NotCounting("off".into())
    );
    assert_eq!(
        install_from(Setting::Auto, false, none).unwrap().field(),
        "n/a (no CUDA device in use)"
    );
    let e = install_from(Setting::On, false, none)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--cupti on: no worker runs on CUDA"), "{e}");
    let missing = || vec![PathBuf::from("/nonexistent/libcupti.so.13")];
    let auto = install_from(Setting::Auto, true, missing).unwrap();
    assert_eq!(auto.why_not().as_deref(), Some("libcupti not found"));
    let e = install_from(Setting::On, true, missing)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("--cupti on: libcupti not found; install the nvidia-cuda-cupti"),
        "{e}"
    );
    assert_eq!(Setting::parse("on"), Some(Setting::On));
    assert_eq!(Setting::parse("yes"), None);
}
