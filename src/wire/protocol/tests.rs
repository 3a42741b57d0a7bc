//! Tests of the socket protocol's frames and their bounds (src/wire/protocol.rs).

use super::*;

#[test]
fn messages_round_trip_and_bad_input_is_named() {
    let msgs = vec![
        Msg::Status { text: "hi".into() },
        Msg::Command {
            cmd: HubCommand::SetProfiling(false),
        },
        Msg::Step(WireStep {
            th: 2,
            end: 10,
            wall: 5,
            ph: vec![(0, 3)],
            prof: true,
            timing: Timing::Host,
            steps: 1,
            idle: 0,
            tok: 7,
            m: None,
            n: vec![(1, 3)],
            sy: vec![(2, 1)],
            cu: Some(CudaCalls {
                launches: 412,
                launch_ns: 3_100_000,
                sync_ns: 400_000,
            }),
        }),
    ];
    let mut buf = Vec::new();
    write_preamble(&mut buf).unwrap();
    for m in &msgs {
        write_msg(&mut buf, m).unwrap();
    }
    let mut r = &buf[..];
    read_preamble(&mut r).unwrap();
    for m in &msgs {
        assert_eq!(read_msg(&mut r).unwrap().as_ref(), Some(m));
    }
    assert!(read_msg(&mut r).unwrap().is_none());
    // A peer of another version is refused with both numbers.
    let mut other = Vec::new();
    write_preamble_version(&mut other, 9).unwrap();
    let e = read_preamble(&mut &other[..]).unwrap_err().to_string();
    assert!(e.contains("version 1") && e.contains("version 9"), "{e}");
    assert!(matches!(
        read_preamble(&mut &b"GET / HTTP/1.1\r\n"[..]),
        Err(WireError::NotDflash)
    ));
    let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
    assert!(matches!(
        read_msg(&mut &huge[..]),
        Err(WireError::TooLarge(_))
    ));
    let mut cut = encode(&msgs[0]);
    cut.truncate(cut.len() - 1);
    assert!(matches!(read_msg(&mut &cut[..]), Err(WireError::Truncated)));
    // An unknown kind from a newer peer is skipped, not fatal.
    let mut f = Vec::new();
    let body = br#"{"t":"flamegraph","x":1}"#;
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(body);
    assert_eq!(read_msg(&mut &f[..]).unwrap(), Some(Msg::Unknown));
}

#[test]
fn out_of_range_numbers_are_named_by_check() {
    let decl = |id| {
        Msg::Thread(ThreadDecl {
            id,
            name: "t".into(),
            stage: "drafter".into(),
            device: "cpu".into(),
            tid: 1,
        })
    };
    assert!(decl(MAX_THREADS - 1).check().is_ok());
    let e = decl(4_000_000_000).check().unwrap_err();
    assert!(e.contains("thread id 4000000000"), "{e}");
    let step = |wall, n| {
        Msg::Step(WireStep {
            th: 0,
            end: 1,
            wall,
            ph: vec![(0, 1); n],
            prof: true,
            timing: Timing::Host,
            steps: 1,
            idle: 0,
            tok: 0,
            m: None,
            n: Vec::new(),
            sy: Vec::new(),
            cu: None,
        })
    };
    assert!(step(MAX_SPAN_NS, MAX_PHASE_ENTRIES).check().is_ok());
    assert!(step(u64::MAX, 1).check().unwrap_err().contains("wall"));
    assert!(step(1, MAX_PHASE_ENTRIES + 1)
        .check()
        .unwrap_err()
        .contains("phase entries"));
    // Issue 28: a step's CUDA calls are bounded like its other counts and spans.
    let calls = |launches, launch_ns, sync_ns| {
        let Msg::Step(mut s) = step(1, 1) else {
            unreachable!()
        };
        s.cu = Some(CudaCalls {
            launches,
            launch_ns,
            sync_ns,
        });
        Msg::Step(s).check()
    };
    assert!(calls(MAX_COUNT, MAX_SPAN_NS, MAX_SPAN_NS).is_ok());
    assert!(calls(MAX_COUNT + 1, 0, 0).unwrap_err().contains("launches"));
    assert!(calls(1, 0, u64::MAX).unwrap_err().contains("sync ns"));
}

#[test]
fn cuda_calls_are_left_out_when_absent_and_old_frames_read_without_them() {
    let old = r#"{"t":"step","th":0,"end":1,"wall":2}"#;
    let Ok(Msg::Step(s)) = serde_json::from_str::<Msg>(old) else {
        panic!("an old step frame reads")
    };
    assert_eq!(s.cu, None);
    let back = serde_json::to_string(&Msg::Step(s.clone())).unwrap();
    assert!(!back.contains("\"cu\""), "{back}");
    let with = WireStep {
        cu: Some(CudaCalls {
            launches: 3,
            launch_ns: 4,
            sync_ns: 5,
        }),
        ..s
    };
    let text = serde_json::to_string(&Msg::Step(with.clone())).unwrap();
    assert!(
        text.contains(r#""cu":{"launches":3,"launch_ns":4,"sync_ns":5}"#),
        "{text}"
    );
    assert_eq!(serde_json::from_str::<Msg>(&text).unwrap(), Msg::Step(with));
}

/// Issue 30: a producer's GPU readings travel in its samples (for a viewer on another
/// host), convert both ways, are left out when there are none, and are bounded.
#[test]
fn a_samples_gpus_round_trip_and_are_bounded() {
    let g = WireGpu {
        index: 1,
        cuda: Some(0),
        name: "NVIDIA H200".into(),
        util: 97,
        bw: 41,
        used: 81_234,
        total: 143_771,
        ours: Some(80_000),
        w: 612.5,
        mhz: 1_980,
        temp: 61,
        throttle: vec!["sw-power".into()],
    };
    let with = |gpu: Vec<WireGpu>| match sample_with(Vec::new()) {
        Msg::Sample(s) => Msg::Sample(Sample { gpu, ..s }),
        _ => unreachable!(),
    };
    let m = with(vec![g.clone()]);
    let back = read_msg(&mut &encode(&m)[..]).unwrap().unwrap();
    assert_eq!(back, m);
    assert!(back.check().is_ok());
    assert_eq!(WireGpu::from(&GpuSample::from(&g)), g);
    let none = serde_json::to_string(&with(Vec::new())).unwrap();
    assert!(!none.contains("gpu"), "{none}");
    let e = with(vec![g.clone(); MAX_GPUS + 1]).check().unwrap_err();
    assert!(e.contains("GPUs in a sample 65"), "{e}");
    let e = with(vec![g.clone(), g.clone()]).check().unwrap_err();
    assert!(e.contains("GPU 1 listed twice"), "{e}");
    for (bad, what) in [
        (
            WireGpu {
                index: 64,
                ..g.clone()
            },
            "a GPU's index 64",
        ),
        (
            WireGpu {
                cuda: Some(64),
                ..g.clone()
            },
            "a GPU's device 64",
        ),
        (
            WireGpu {
                util: 101,
                ..g.clone()
            },
            "a GPU's utilisation 101",
        ),
    ] {
        let e = with(vec![bad]).check().unwrap_err();
        assert!(e.contains(what), "{e}");
    }
    let e = with(vec![WireGpu {
        w: f64::NAN,
        ..g.clone()
    }])
    .check()
    .unwrap_err();
    assert!(e.contains("power"), "{e}");
    let e = with(vec![WireGpu {
        name: "x".repeat(MAX_TEXT + 1),
        ..g
    }])
    .check()
    .unwrap_err();
    assert!(e.contains("GPU's name"), "{e}");
}

fn sample_with(alloc: Vec<WireAlloc>) -> Msg {
    Msg::Sample(Sample {
        now: 100,
        prof: true,
        timing: GpuTiming::Async,
        paused: false,
        dropped: 0,
        live: Vec::new(),
        q: Vec::new(),
        alloc,
        gpu: Vec::new(),
    })
}

#[test]
fn a_samples_allocator_figures_round_trip_and_are_bounded() {
    let a = WireAlloc {
        cuda: 1,
        reserved: 13 << 30,
        allocated: 3 << 30,
        segments: 42,
        allocs: 120,
        frees: 80,
        retries: 2,
        graphs: 3,
    };
    let m = sample_with(vec![a]);
    let back = read_msg(&mut &encode(&m)[..]).unwrap().unwrap();
    assert_eq!(back, m);
    assert!(back.check().is_ok());
    let json = serde_json::to_string(&m).unwrap();
    assert!(
        json.contains(r#""alloc":[{"cuda":1,"reserved":13958643712,"#),
        "{json}"
    );
    // None: the field is left out, and a sample without it (an older peer) reads as none.
    let none = serde_json::to_string(&sample_with(Vec::new())).unwrap();
    assert!(!none.contains("alloc"), "{none}");
    let old = r#"{"t":"sample","now":1,"prof":true,"timing":"Async","paused":false,"dropped":0,"live":[],"q":[]}"#;
    let Msg::Sample(s) = serde_json::from_str(old).unwrap() else {
        panic!("not a sample")
    };
    assert!(s.alloc.is_empty());
    // The figures and the sample that carries them convert both ways.
    assert_eq!(WireAlloc::from(&AllocatorSample::from(&a)), a);
    // Out of bounds: a device, a count, too many devices.
    let e = sample_with(vec![WireAlloc {
        cuda: MAX_CUDA_DEVICES,
        ..a
    }])
    .check()
    .unwrap_err();
    assert!(e.contains("allocator sample's device 64"), "{e}");
    let e = sample_with(vec![WireAlloc {
        allocs: u64::MAX,
        ..a
    }])
    .check()
    .unwrap_err();
    assert!(e.contains("allocator counter"), "{e}");
    let e = sample_with(vec![a; MAX_CUDA_DEVICES as usize + 1])
        .check()
        .unwrap_err();
    assert!(e.contains("allocator samples 65"), "{e}");
    assert!(sample_with(vec![a; MAX_CUDA_DEVICES as usize])
        .check()
        .is_ok());
}
