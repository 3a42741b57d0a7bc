//! The telemetry core: phase accounting, windows, dropped records, the verdict, profiling toggles,
//! many threads at once, and queue statistics.

use dflash_top::cancel::CancelToken;
use dflash_top::telemetry::assemble::Assembler;
use dflash_top::telemetry::names::Names;
use dflash_top::telemetry::queue::monitored_queue;
use dflash_top::telemetry::queue_view::verdict_inputs;
use dflash_top::telemetry::snapshot::QueueView;
use dflash_top::telemetry::switches::Timing;
use dflash_top::telemetry::verdict::{Verdict, VerdictTracker, WaitShares, DWELL_NS};
use dflash_top::telemetry::window::{Windows, RING_TICKS, TICK_NS};
use dflash_top::telemetry::{Phase, Role, StepRecord, Telemetry, N_PHASES};
use std::time::Duration;

fn spin(d: Duration) {
    let t = std::time::Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn drain(t: &Telemetry) -> Vec<StepRecord> {
    t.records().try_iter().collect()
}

#[test]
fn phases_sum_to_wall_time_and_land_where_marked() {
    let t = Telemetry::new();
    let mut rec = t.sink().recorder(Role::Drafter, "cpu");
    for _ in 0..3 {
        spin(Duration::from_millis(2)); // before any mark: `other`
        rec.mark(Phase::Forward);
        spin(Duration::from_millis(6));
        rec.mark(Phase::Backward);
        spin(Duration::from_millis(3));
        rec.end_step(10, None);
    }
    let records = drain(&t);
    assert_eq!(records.len(), 3);
    for r in &records {
        assert!(r.profiled);
        assert_eq!(
            r.phase_ns.iter().sum::<u64>(),
            r.wall_ns,
            "phases must sum to wall"
        );
        let ms = |p: Phase| r.phase_ns[p.index()] as f64 / 1e6;
        // Spins last at least as long as asked (upper bounds would depend on machine load).
        assert!(ms(Phase::Forward) >= 5.9, "forward {}", ms(Phase::Forward));
        assert!(
            ms(Phase::Backward) >= 2.9,
            "backward {}",
            ms(Phase::Backward)
        );
        assert!(ms(Phase::Other) >= 1.9, "other {}", ms(Phase::Other));
        for p in [Phase::Read, Phase::HsWait, Phase::Optim] {
            assert_eq!(r.phase_ns[p.index()], 0, "{} was never marked", p.name());
        }
        assert_eq!(r.tokens, 10);
    }
}

#[test]
fn a_full_channel_counts_dropped_records() {
    let t = Telemetry::with_capacity(4);
    let mut rec = t.sink().recorder(Role::Loader, "cpu");
    for _ in 0..10 {
        rec.mark(Phase::Read);
        rec.end_step(1, None);
    }
    assert_eq!(drain(&t).len(), 4);
    assert_eq!(t.dropped(), 6);
    rec.end_step(1, None);
    assert_eq!(drain(&t).len(), 1, "space frees up after the hub drains");
    assert_eq!(t.dropped(), 6);
}

#[test]
fn profiling_off_records_no_phases_but_keeps_steps_and_tokens() {
    let t = Telemetry::new();
    let mut rec = t.sink().recorder(Role::Target, "cpu");
    rec.mark(Phase::Forward);
    spin(Duration::from_millis(2));
    rec.end_step(5, None);

    t.switches().set_profiling(false);
    rec.mark(Phase::Forward);
    spin(Duration::from_millis(2));
    rec.end_step(7, None);

    // Turned back on in the middle of a step: the step is marked as partly profiled.
    rec.mark(Phase::Forward);
    t.switches().set_profiling(true);
    rec.mark(Phase::HsPack);
    spin(Duration::from_millis(2));
    rec.end_step(9, None);
    rec.mark(Phase::Forward);
    spin(Duration::from_millis(1));
    rec.end_step(11, None);

    let r = drain(&t);
    assert_eq!(r.len(), 4, "steps are always reported");
    assert_eq!(
        r.iter().map(|r| r.tokens).collect::<Vec<_>>(),
        vec![5, 7, 9, 11]
    );
    assert!(r[0].profiled && r[0].phase_ns[Phase::Forward.index()] > 1_000_000);
    assert!(!r[1].profiled);
    assert_eq!(
        r[1].phase_ns[Phase::Forward.index()],
        0,
        "off records no phase"
    );
    assert_eq!(r[1].phase_ns[Phase::Other.index()], r[1].wall_ns);
    assert!(
        !r[2].profiled,
        "a step with profiling off for part of it is not fully profiled"
    );
    assert!(r[2].phase_ns[Phase::HsPack.index()] > 1_000_000);
    assert!(r[3].profiled);
    for x in &r {
        assert_eq!(x.phase_ns.iter().sum::<u64>(), x.wall_ns);
    }
}

#[test]
fn many_threads_lose_no_time_and_count_none_twice() {
    let t = Telemetry::new();
    let threads = 8;
    let steps = 200;
    std::thread::scope(|s| {
        for i in 0..threads {
            let sink = t.sink().clone();
            std::thread::Builder::new()
                .name(format!("w-{i}"))
                .spawn_scoped(s, move || {
                    let mut rec = sink.recorder(Role::Drafter, "cpu");
                    for k in 0..steps {
                        rec.mark(Phase::ALL[1 + (k % (N_PHASES - 1))]);
                        spin(Duration::from_micros(20));
                        rec.mark(Phase::Optim);
                        rec.end_step(1, None);
                    }
                })
                .unwrap();
        }
    });
    let records = drain(&t);
    assert_eq!(records.len(), threads * steps);
    assert_eq!(t.dropped(), 0);
    let names: Vec<_> = t.registry().threads().into_iter().map(|i| i.name).collect();
    assert_eq!(names.len(), threads);
    let mut windows = Windows::new(0);
    let end = records.iter().map(|r| r.end_ns).max().unwrap();
    for r in &records {
        assert_eq!(r.phase_ns.iter().sum::<u64>(), r.wall_ns);
        windows.ingest(r, true);
    }
    windows.close_tick(end + 1, threads, &[], false);
    for i in 0..threads {
        let mine: Vec<_> = records.iter().filter(|r| r.thread == i).collect();
        assert_eq!(mine.len(), steps, "thread {i}");
        let w = windows.thread(i, 1);
        assert_eq!(w.steps as usize, steps);
        assert_eq!(w.wall_ns, mine.iter().map(|r| r.wall_ns).sum::<u64>());
        assert_eq!(w.phase_ns.iter().sum::<u64>(), w.wall_ns);
    }
}

/// A step record of `wall_ms` (`forward_ms` of it in forward) ending at `end_ms`.
pub fn record(thread: usize, end_ms: u64, wall_ms: u64, forward_ms: u64) -> StepRecord {
    let mut phase_ns = [0; N_PHASES];
    phase_ns[Phase::Forward.index()] = forward_ms * 1_000_000;
    phase_ns[Phase::Other.index()] = (wall_ms - forward_ms) * 1_000_000;
    StepRecord {
        thread,
        end_ns: end_ms * 1_000_000,
        wall_ns: wall_ms * 1_000_000,
        phase_ns,
        profiled: true,
        timing: Timing::Host,
        steps: 1,
        gpu_idle_ns: 0,
        tokens: 100,
        metrics: None,
        phase_n: [0; N_PHASES],
        host_syncs: [0; N_PHASES],
        cuda_calls: None,
    }
}

/// Issue 28: CUDA calls count with the steps that carry them, per counted step; a thread with
/// none says why (the CPU, the run's reason, no steps yet, or a producer that does not count).
#[test]
fn cuda_calls_average_over_the_steps_that_carry_them_or_say_why_not() {
    use dflash_top::telemetry::snapshot::{PhaseWindow, ThreadView};
    use dflash_top::telemetry::CudaCalls;
    use dflash_top::telemetry::Snapshot;
    let mut w = Windows::new(0);
    for k in 0..4u64 {
        let mut r = record(0, 20 + 10 * k, 10, 4);
        // Three steps counted (400, 410, 420 launches), one not (CUPTI was not on for it).
        r.cuda_calls = (k < 3).then_some(CudaCalls {
            launches: 400 + 10 * k,
            launch_ns: 3_000_000,
            sync_ns: 500_000,
        });
        w.ingest(&r, true);
    }
    // A device record (steps 0) carries none and changes nothing.
    let mut dev = record(0, 60, 10, 4);
    dev.steps = 0;
    w.ingest(&dev, true);
    w.close_tick(TICK_NS, 2, &[], false);
    let win = w.thread(0, 10);
    assert_eq!((win.steps, win.cuda_steps), (4, 3));
    let (launches, launch_ms, sync_ms) = win.cuda_calls_per_step().unwrap();
    assert!((launches - 410.0).abs() < 1e-9, "{launches}");
    assert!((launch_ms - 3.0).abs() < 1e-9 && (sync_ms - 0.5).abs() < 1e-9);
    assert_eq!(w.thread_run(0).cuda_calls.launches, 1230);
    assert_eq!(w.thread(1, 10).cuda_calls_per_step(), None);

    let view = |device: &str, w: PhaseWindow| ThreadView {
        name: "drafter-0".into(),
        role: Role::Drafter,
        device: device.into(),
        tid: 1,
        cpu_pct: None,
        phase: Phase::Forward,
        phase_s: 0.0,
        state: dflash_top::telemetry::snapshot::ThreadState::Working,
        os_state: None,
        w1: w,
        w10: w,
        run: w,
        sizes: None,
    };
    let mut s = Snapshot::default();
    let counted = view("cuda:0", win);
    assert_eq!(s.cuda_calls(&counted, &counted.w10).unwrap().0, launches);
    let none = PhaseWindow {
        steps: 2,
        ..PhaseWindow::default()
    };
    assert_eq!(s.cuda_calls(&view("cpu", none), &none), Err("cpu"));
    assert_eq!(
        s.cuda_calls(&view("cuda:0", none), &none),
        Err("not counted")
    );
    let empty = PhaseWindow::default();
    assert_eq!(
        s.cuda_calls(&view("cuda:0", empty), &empty),
        Err("no steps")
    );
    s.cupti = Some("no libcupti".into());
    assert_eq!(
        s.cuda_calls(&view("cuda:0", none), &none),
        Err("no libcupti")
    );
}

#[test]
fn windows_roll_over_after_their_ticks() {
    let mut w = Windows::new(0);
    let now = std::cell::Cell::new(0);
    let close = |w: &mut Windows| {
        now.set(now.get() + TICK_NS);
        w.close_tick(now.get(), 1, &[], false);
    };
    // Tick 0: three steps; then 9 empty ticks; the 1 s window still holds them.
    for k in 0..3 {
        w.ingest(&record(0, 20 + 10 * k, 10, 4), true);
    }
    close(&mut w);
    for _ in 0..9 {
        close(&mut w);
    }
    assert_eq!(w.thread(0, 10).steps, 3);
    assert_eq!(w.thread(0, 10).phase_ns[Phase::Forward.index()], 12_000_000);
    assert!((w.thread(0, 10).steps_per_s() - 3.0).abs() < 1e-9);
    // One more tick: out of the 1 s window, still in the 10 s window and the run.
    close(&mut w);
    assert_eq!(w.thread(0, 10).steps, 0);
    assert_eq!(w.thread(0, RING_TICKS).steps, 3);
    // Past 10 s: out of the ring, still in the run total.
    for _ in 0..RING_TICKS {
        close(&mut w);
    }
    assert_eq!(w.thread(0, RING_TICKS).steps, 0);
    assert_eq!(w.thread_run(0).steps, 3);
    assert_eq!(w.thread_run(0).tokens, 300.0);
    // Reset forgets the windows and the run's phase times, keeps the run's steps and tokens.
    let t = now.get() / 1_000_000;
    w.ingest(&record(0, t + 50, 10, 4), true);
    close(&mut w);
    assert!(w.thread_run(0).wall_ns > 0);
    w.reset();
    assert_eq!(w.thread(0, 10).steps, 0);
    assert_eq!(w.thread_run(0).steps, 4);
    assert_eq!(w.thread_run(0).tokens, 400.0);
    assert_eq!(w.thread_run(0).wall_ns, 0);
    assert_eq!(w.thread_run(0).phase_ns, [0; N_PHASES]);
    // What comes after the reset is all the run window's phases hold.
    w.ingest(&record(0, t + 150, 10, 6), true);
    close(&mut w);
    assert_eq!(w.thread_run(0).phase_ns[Phase::Forward.index()], 6_000_000);
}

fn shares(loader: f64, starved: f64, blocked: f64) -> WaitShares {
    WaitShares::dflash(loader, starved, blocked)
}

#[test]
fn verdict_names_the_starving_stage() {
    let scenarios = [
        (shares(0.0, 0.8, 0.0), Verdict::TargetBound),
        (shares(0.0, 0.0, 0.7), Verdict::DrafterBound),
        (shares(0.6, 0.9, 0.0), Verdict::LoaderBound),
        (shares(0.05, 0.1, 0.1), Verdict::Balanced),
    ];
    for (s, want) in scenarios {
        let mut v = VerdictTracker::default();
        for k in 0..40 {
            v.update(&s, k * TICK_NS);
        }
        assert_eq!(v.shown(), want, "{s:?}");
    }
}

/// The shown verdict after feeding `script` ((shares, ticks of 100 ms), in order) from `t0`.
fn feed(v: &mut VerdictTracker, t0: u64, script: &[(WaitShares, u64)]) -> (Vec<Verdict>, u64) {
    let mut t = t0;
    let mut shown = Vec::new();
    for (s, ticks) in script {
        for _ in 0..*ticks {
            shown.push(v.update(s, t));
            t += TICK_NS;
        }
    }
    (shown, t)
}

#[test]
fn verdict_has_hysteresis() {
    let mut v = VerdictTracker::default();
    assert_eq!(v.dwell_ns(), DWELL_NS);
    assert_eq!(
        v.update(&shares(0.0, 0.1, 0.0), 0),
        Verdict::Balanced,
        "first verdict is immediate"
    );
    // A sustained starvation shows once it has held for the dwell (3 s: 30 ticks), not before.
    let (shown, t) = feed(&mut v, TICK_NS, &[(shares(0.0, 0.9, 0.0), 31)]);
    let first = shown
        .iter()
        .position(|s| *s == Verdict::TargetBound)
        .unwrap();
    assert_eq!(first, 30, "{shown:?}");
    // Between EXIT and ENTER it stays starved: hovering does not flicker.
    let (shown, t) = feed(&mut v, t, &[(shares(0.0, 0.2, 0.0), 100)]);
    assert!(shown.iter().all(|s| *s == Verdict::TargetBound));
    // Below EXIT for the dwell: back to balanced.
    let (shown, t) = feed(&mut v, t, &[(shares(0.0, 0.05, 0.0), 31)]);
    assert_eq!(shown.last(), Some(&Verdict::Balanced));
    // And from balanced, 0.2 is not enough to enter.
    let (shown, _) = feed(&mut v, t, &[(shares(0.0, 0.2, 0.0), 100)]);
    assert!(shown.iter().all(|s| *s == Verdict::Balanced));
}

/// Issue 27: on a loaded host the waits wobble; the verdict holds for the dwell, so the header
/// does not flip between target-bound and balanced. A shorter dwell (the TOML's
/// `verdict_dwell`) follows the same evidence sooner; 0 follows every tick.
#[test]
fn a_wobbling_host_keeps_its_verdict_for_the_dwell() {
    let starved = shares(0.0, 0.6, 0.0);
    let calm = shares(0.0, 0.02, 0.0);
    // 2 s starved, 1 s calm, over and over: neither lasts 3 s.
    let wobble: Vec<(WaitShares, u64)> = (0..10)
        .flat_map(|_| [(starved.clone(), 20), (calm.clone(), 10)])
        .collect();
    let mut v = VerdictTracker::default();
    v.update(&calm, 0);
    let (shown, t) = feed(&mut v, TICK_NS, &wobble);
    assert!(
        shown.iter().all(|s| *s == Verdict::Balanced),
        "it flickered: {shown:?}"
    );
    // Starved for 3 s unbroken: now it changes, once.
    let (shown, _) = feed(&mut v, t, &[(starved.clone(), 31)]);
    assert_eq!(shown.last(), Some(&Verdict::TargetBound));
    assert_eq!(
        shown.windows(2).filter(|w| w[0] != w[1]).count(),
        1,
        "{shown:?}"
    );

    // A 1 s dwell: the same wobble shows target-bound within the first 2 s starved, and
    // then balanced never lasts long enough (1 s calm is just under the 10 ticks needed).
    let mut v = VerdictTracker::with_dwell(1_000_000_000);
    v.update(&calm, 0);
    let (shown, _) = feed(&mut v, TICK_NS, &wobble);
    assert!(shown.contains(&Verdict::TargetBound), "{shown:?}");
    // A 0 dwell follows every tick: it flips as often as the evidence does.
    let mut v = VerdictTracker::with_dwell(0);
    v.update(&calm, 0);
    let (shown, _) = feed(&mut v, TICK_NS, &wobble);
    let flips = shown.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(flips, 19, "{shown:?}");
    // A pause (or a stall) in between: evidence before it does not count after it.
    let mut v = VerdictTracker::default();
    v.update(&calm, 0);
    let (_, t) = feed(&mut v, TICK_NS, &[(starved.clone(), 25)]);
    v.interrupt();
    let (shown, _) = feed(&mut v, t + 50 * TICK_NS, &[(starved.clone(), 10)]);
    assert!(shown.iter().all(|s| *s == Verdict::Balanced), "{shown:?}");
}

#[test]
fn verdict_inputs_come_from_the_queue_between_each_pair() {
    let q = |p: &str, c: &str, cw: f64, pw: f64| QueueView {
        name: format!("{p}->{c}"),
        producers: p.into(),
        consumers: c.into(),
        consumer_wait_share: cw,
        producer_wait_share: pw,
        ..Default::default()
    };
    let s = verdict_inputs(
        &[
            q("loader", "target", 0.4, 0.0),
            q("target", "drafter", 0.7, 0.2),
        ],
        &Names::builtin(),
    );
    assert_eq!(s, shares(0.4, 0.7, 0.2));
}

#[test]
fn queue_statistics_match_a_scripted_producer_and_consumer() {
    let cancel = CancelToken::new();
    let (tx, rx, probe) = monitored_queue::<u32>("hs", 2, "target", "drafter", cancel.clone());
    let base = probe.read(dflash_top::telemetry::clock::now_ns());
    assert_eq!(base.depth, 0);
    // Fill to capacity: the third push must wait for a pop ~40 ms later.
    tx.push(1).unwrap();
    tx.push(2).unwrap();
    let blocked = probe.clone();
    let consumer = std::thread::Builder::new()
        .name("consumer".into())
        .spawn(move || {
            // The 40 ms start once the producer is blocked on the full queue (its wait is counted
            // while in flight), however late a loaded machine schedules either thread.
            while blocked
                .read(dflash_top::telemetry::clock::now_ns())
                .push_wait_ns
                == 0
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(40));
            let a = rx.pop().unwrap();
            std::thread::sleep(Duration::from_millis(10));
            let b = rx.pop().unwrap();
            let c = rx.pop().unwrap();
            // Empty now: this pop waits ~30 ms for the last push.
            let d = rx.pop().unwrap();
            (vec![a, b, c, d], rx)
        })
        .unwrap();
    tx.push(3).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    assert!(!consumer.is_finished());
    tx.push(4).unwrap();
    let (got, rx) = consumer.join().unwrap();
    assert_eq!(got, vec![1, 2, 3, 4], "FIFO");
    let c = probe.read(dflash_top::telemetry::clock::now_ns());
    assert_eq!(c.pushes, 4);
    assert_eq!(c.pops, 4);
    assert_eq!(c.depth, 0);
    let ms = |ns: u64| ns as f64 / 1e6;
    assert!(
        ms(c.push_wait_ns) >= 35.0,
        "producer waited on full: {} ms",
        ms(c.push_wait_ns)
    );
    assert!(
        ms(c.pop_wait_ns) >= 5.0,
        "consumer waited on empty: {} ms",
        ms(c.pop_wait_ns)
    );
    assert!(
        ms(c.full_ns) >= 35.0,
        "time at capacity: {} ms",
        ms(c.full_ns)
    );
    assert!(c.empty_ns > 0);
    assert_eq!(c.max_depth, 2);
    assert!(
        c.age_ns_sum > 40_000_000,
        "items 1 and 2 waited ~40 ms each"
    );
    // Time-weighted mean depth lies between 0 and capacity.
    let span = c.at_ns - base.at_ns;
    let mean = c.depth_ns as f64 / span as f64;
    assert!(mean > 0.5 && mean < 2.0, "mean depth {mean}");
    // A cancelled pop returns instead of blocking forever.
    cancel.cancel();
    assert!(rx.pop().is_err());
}

#[test]
fn assembler_builds_a_snapshot_with_windows_and_verdict() {
    let t = Telemetry::new();
    let cancel = CancelToken::new();
    let (_tx, rx, probe) = monitored_queue::<u32>("hs", 4, "target", "drafter", cancel);
    t.add_queue(probe);
    let sink = t.sink().clone();
    // A drafter that waits on an empty queue: its pops time out only when cancelled, so script
    // the wait by popping with a short-lived producer instead.
    let drafter = std::thread::Builder::new()
        .name("drafter-0".into())
        .spawn(move || {
            let mut rec = sink.recorder(Role::Drafter, "cpu");
            for step in 1..=5 {
                rec.mark(Phase::HsWait);
                let _ = rx.pop();
                rec.mark(Phase::Forward);
                spin(Duration::from_millis(2));
                let m = dflash_top::telemetry::TrainMetrics {
                    loss: Some(2.5),
                    tau: Some(1.5),
                    step,
                    ..Default::default()
                };
                rec.end_step(64, Some(m));
            }
        })
        .unwrap();
    let tx = _tx;
    for i in 0..5 {
        std::thread::sleep(Duration::from_millis(30));
        tx.push(i).unwrap();
    }
    drafter.join().unwrap();
    let mut asm = Assembler::new(0);
    for r in drain(&t) {
        asm.ingest(&r);
    }
    let now = dflash_top::telemetry::clock::now_ns();
    let mut snap = None;
    for k in 0..5 {
        snap = Some(asm.tick(
            now + k * TICK_NS,
            &t.registry().threads(),
            &t.queue_probes(),
            t.switches(),
            0,
        ));
    }
    let s = snap.unwrap();
    assert_eq!(s.train.step, 5);
    assert_eq!(s.train.loss, Some(2.5));
    assert_eq!(s.threads.len(), 1);
    assert_eq!(s.threads[0].name, "drafter-0");
    assert_eq!(s.threads[0].run.steps, 5);
    assert_eq!(s.threads[0].run.tokens, 320.0);
    let q = s.queue("hs").unwrap();
    assert_eq!(q.capacity, 4);
    assert!(!s.loss_history.is_empty());
}
