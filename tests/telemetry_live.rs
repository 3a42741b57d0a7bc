//! Live time and the states around it, on scripted time: a long step lands where it happened, a
//! hung stage shows while it hangs, pause is neither work nor wait, tok/s is steady at any step
//! rate, unprofiled steps and other timing modes stay out of the bars; and the queues' clocks
//! under contention.

use super::telemetry_core::record;
use dflash_top::cancel::CancelToken;
use dflash_top::telemetry::assemble::Assembler;
use dflash_top::telemetry::phase_recorder::{LiveStep, ThreadInfo};
use dflash_top::telemetry::queue::monitored_queue;
use dflash_top::telemetry::switches::Timing;
use dflash_top::telemetry::verdict::Verdict;
use dflash_top::telemetry::window::{Windows, TICK_NS};
use dflash_top::telemetry::{GpuTiming, Phase, Role, Snapshot, Switches};
use std::sync::Arc;
use std::time::Duration;

const MS: u64 = 1_000_000;

/// An assembler fed on scripted time.
struct Rig {
    asm: Assembler,
    threads: Vec<ThreadInfo>,
    sw: Switches,
    now: u64,
}

impl Rig {
    fn new(threads: &[(&str, Role, &str)]) -> Rig {
        // Start well after the clock's base, so scripted times convert to ticks and back.
        let now = 10_000 * MS;
        Rig {
            asm: Assembler::new(now),
            threads: threads
                .iter()
                .enumerate()
                .map(|(i, (name, role, device))| ThreadInfo {
                    name: name.to_string(),
                    role: *role,
                    device: device.to_string(),
                    tid: i as i32,
                    live: Arc::new(LiveStep::default()),
                })
                .collect(),
            sw: Switches::default(),
            now,
        }
    }

    /// Now plus `ms`, as an absolute time in ms (for `record`).
    fn at(&self, ms: u64) -> u64 {
        self.now / MS + ms
    }

    fn live(&self, thread: usize, phase: Phase, step_start_ns: u64, phase_start_ns: u64) {
        self.threads[thread]
            .live
            .script(phase, step_start_ns, phase_start_ns);
    }

    fn tick(&mut self) -> Snapshot {
        self.now += TICK_NS;
        self.asm.tick(self.now, &self.threads, &[], &self.sw, 0)
    }
}

fn thread<'a>(s: &'a Snapshot, name: &str) -> &'a dflash_top::telemetry::snapshot::ThreadView {
    s.threads.iter().find(|t| t.name == name).unwrap()
}

#[test]
fn a_long_step_lands_in_the_ticks_it_covered_not_where_it_ended() {
    let mut w = Windows::new(0);
    for k in 1..=10 {
        w.close_tick(k * TICK_NS, 1, &[], false);
    }
    // A 1 s step that ended now: 100 ms of it in each of the last ten ticks.
    w.ingest(&record(0, 1000, 1000, 1000), true);
    w.close_tick(11 * TICK_NS, 1, &[], false);
    for ticks in [1, 2, 5] {
        let got = w.thread(0, ticks).phase_ns[Phase::Forward.index()];
        let want = (ticks as u64 - 1) * 100 * MS;
        assert_eq!(got, want, "newest {ticks} ticks");
    }
    assert_eq!(w.thread(0, 11).phase_ns[Phase::Forward.index()], 1000 * MS);
    assert_eq!(w.thread(0, 1).steps, 1, "the step counts where it ended");
}

#[test]
fn the_part_of_a_step_in_a_paused_tick_is_dropped() {
    let mut w = Windows::new(0);
    w.close_tick(TICK_NS, 1, &[], false);
    w.close_tick(2 * TICK_NS, 1, &[], true);
    w.ingest(&record(0, 300, 300, 300), true);
    w.close_tick(3 * TICK_NS, 1, &[], false);
    assert_eq!(w.thread(0, 3).phase_ns[Phase::Forward.index()], 200 * MS);
    assert_eq!(
        w.thread_run(0).phase_ns[Phase::Forward.index()],
        200 * MS,
        "the run total drops it too"
    );
}

/// Feeds a steady pipeline of `rate` steps/s for `secs` and returns the snapshots.
fn steady(rate: f64, secs: f64, tokens: u64) -> Vec<Snapshot> {
    let mut rig = Rig::new(&[("drafter-0", Role::Drafter, "cpu")]);
    let step = (1e9 / rate) as u64;
    let t0 = rig.now;
    let mut next_end = t0 + step;
    let mut out = Vec::new();
    while rig.now < t0 + (secs * 1e9) as u64 {
        let tick_end = rig.now + TICK_NS;
        while next_end <= tick_end {
            let mut r = record(0, 0, 0, 0);
            r.end_ns = next_end;
            r.wall_ns = step;
            r.phase_ns[Phase::Forward.index()] = step;
            r.tokens = tokens;
            rig.asm.ingest(&r);
            next_end += step;
        }
        let start = next_end - step;
        rig.live(0, Phase::Forward, start, start);
        out.push(rig.tick());
    }
    out
}

#[test]
fn tok_per_s_is_steady_at_any_step_rate() {
    for rate in [0.2, 1.0, 2.7, 7.3, 100.0, 1000.0] {
        let tokens = 3072;
        let want = rate * tokens as f64;
        let warm = (2.0 / rate).max(1.5);
        let snaps = steady(rate, warm + 12.0, tokens);
        let skip = (warm * 10.0) as usize;
        for s in &snaps[skip..] {
            let got = s.train.tok_per_s_1s;
            assert!(
                (got - want).abs() / want <= 0.05,
                "{rate} steps/s at {:.1} s: {got:.0} tok/s, want {want:.0}",
                s.elapsed_s
            );
        }
        let last = snaps.last().unwrap();
        let got10 = last.train.tok_per_s_10s;
        assert!((got10 - want).abs() / want <= 0.05, "10 s window {got10}");
        // The bars' ms/step are as steady: the step's own time.
        let ms = thread(last, "drafter-0").w1.ms_per_step(Phase::Forward);
        let want_ms = 1e3 / rate;
        assert!(
            (ms - want_ms).abs() / want_ms <= 0.05,
            "{rate} steps/s: forward {ms:.1} ms/step, want {want_ms:.1}"
        );
    }
}

#[test]
fn a_hung_stage_shows_live_and_is_named_once_stalled() {
    let mut rig = Rig::new(&[
        ("target-0", Role::Target, "cpu"),
        ("drafter-0", Role::Drafter, "cpu"),
    ]);
    // Two seconds of 10 ms steps.
    for _ in 0..20 {
        let base = rig.at(0);
        for k in 1..=10 {
            let mut t = record(0, base + 10 * k, 10, 8);
            t.tokens = 0;
            rig.asm.ingest(&t);
            let mut d = record(1, base + 10 * k, 10, 6);
            d.phase_ns[Phase::HsWait.index()] = 2 * MS;
            d.phase_ns[Phase::Other.index()] = 2 * MS;
            rig.asm.ingest(&d);
        }
        rig.live(0, Phase::Forward, rig.now + TICK_NS, rig.now + TICK_NS);
        rig.live(1, Phase::HsWait, rig.now + TICK_NS, rig.now + TICK_NS);
        let s = rig.tick();
        assert_ne!(s.verdict, Verdict::Stalled);
    }
    // Then the target hangs in forward; the drafter waits on the empty queue.
    let hang = rig.now;
    rig.live(0, Phase::Forward, hang, hang);
    rig.live(1, Phase::HsWait, hang, hang);
    let mut stalled_at = None;
    for k in 1..=15 {
        let s = rig.tick();
        let d = thread(&s, "drafter-0");
        if k >= 5 {
            assert!(
                d.w1.share(Phase::HsWait) > 0.5,
                "the waiting side's share grows live: {:.2} at {k}00 ms",
                d.w1.share(Phase::HsWait)
            );
            assert!(thread(&s, "target-0").w1.share(Phase::Forward) > 0.9);
        }
        if s.verdict == Verdict::Stalled && stalled_at.is_none() {
            stalled_at = Some(k);
        }
        if k == 15 {
            assert_eq!(s.verdict, Verdict::Stalled);
            assert_eq!(s.stall.as_deref(), Some("target-0 in forward for 1.5 s"));
            let t = thread(&s, "target-0");
            assert!((t.phase_s - 1.5).abs() < 0.01, "{}", t.phase_s);
        }
    }
    let k = stalled_at.expect("stalled while the hang lasts");
    assert!(k <= 12, "stalled shown {k}00 ms after the last step");
    // The step ends: no longer stalled.
    let end = rig.at(0);
    let mut t = record(0, end, end - hang / MS, end - hang / MS);
    t.tokens = 0;
    rig.asm.ingest(&t);
    rig.live(0, Phase::HsPushWait, rig.now, rig.now);
    assert_ne!(rig.tick().verdict, Verdict::Stalled);
}

#[test]
fn paused_time_is_neither_work_nor_wait_and_lands_nowhere_after_resume() {
    let mut rig = Rig::new(&[("target-0", Role::Target, "cpu")]);
    for _ in 0..10 {
        let base = rig.at(0);
        for k in 1..=10 {
            rig.asm.ingest(&record(0, base + 10 * k, 10, 10));
        }
        rig.tick();
    }
    // Paused for a second while the target sat blocked on a full queue.
    let pause = rig.now;
    rig.sw.set_paused(true);
    rig.live(0, Phase::HsPushWait, pause, pause);
    for _ in 0..10 {
        let s = rig.tick();
        assert_eq!(s.verdict, Verdict::Paused);
        assert_eq!(s.verdict.text(), "paused");
    }
    rig.sw.set_paused(false);
    // The blocked push ends 50 ms after resume: its step carries the whole second.
    let end = rig.at(50);
    let mut r = record(0, end, end - pause / MS, 0);
    r.phase_ns[Phase::Other.index()] = 0;
    r.phase_ns[Phase::HsPushWait.index()] = r.wall_ns;
    rig.asm.ingest(&r);
    rig.live(0, Phase::Forward, end * MS, end * MS);
    let s = rig.tick();
    let w = &thread(&s, "target-0").w1;
    let waited = w.phase_ns[Phase::HsPushWait.index()];
    assert!(
        waited <= 100 * MS,
        "only the wait after resume counts, not the pause: {} ms",
        waited / MS
    );
    assert_ne!(s.verdict, Verdict::Paused);
}

#[test]
fn unprofiled_steps_count_but_stay_out_of_the_bars() {
    let mut rig = Rig::new(&[("drafter-0", Role::Drafter, "cpu")]);
    let base = rig.at(0);
    let mut off = record(0, base + 50, 40, 40);
    off.profiled = false;
    rig.asm.ingest(&off);
    rig.sw.set_profiling(false);
    let s = rig.tick();
    let w = &thread(&s, "drafter-0").w1;
    assert_eq!(w.steps, 1, "steps always count");
    assert_eq!(w.tokens, 100.0, "tokens always count");
    assert_eq!(w.wall_ns, 0, "no phase time from an unprofiled step");
    assert_eq!(w.share(Phase::Other), 0.0, "not 100% other");
}

#[test]
fn a_bar_never_mixes_timing_modes() {
    let mut rig = Rig::new(&[("drafter-0", Role::Drafter, "cuda:0")]);
    rig.sw.set_gpu_timing(GpuTiming::Events);
    rig.tick();
    let base = rig.at(0);
    let mut host = record(0, base + 50, 40, 40);
    host.timing = Timing::GpuAsync;
    rig.asm.ingest(&host);
    let mut device = record(0, base + 60, 30, 20);
    device.timing = Timing::GpuEvents;
    device.steps = 0;
    rig.asm.ingest(&device);
    rig.live(0, Phase::Other, rig.now + TICK_NS, rig.now + TICK_NS);
    let s = rig.tick();
    let w = &thread(&s, "drafter-0").w1;
    assert_eq!(w.phase_ns[Phase::Forward.index()], 20 * MS, "events only");
    assert_eq!(w.steps, 1);
    assert_eq!(s.gpu_timing, Some(GpuTiming::Events));
    // Switching mode starts the GPU threads' bars over.
    rig.sw.set_gpu_timing(GpuTiming::Sync);
    let s = rig.tick();
    let w = &thread(&s, "drafter-0").w10;
    assert_eq!(
        w.phase_ns[Phase::Forward.index()],
        0,
        "events times forgotten"
    );
    assert_eq!(w.wall_ns, w.live_ns, "only the step in progress is left");
    assert_eq!(w.steps, 1, "steps stay");
}

#[test]
fn on_the_cpu_no_timing_mode_is_reported() {
    let mut rig = Rig::new(&[("drafter-0", Role::Drafter, "cpu")]);
    assert_eq!(rig.tick().gpu_timing, None);
}

#[test]
fn a_queue_wait_counts_live_and_reads_never_go_backwards() {
    let cancel = CancelToken::new();
    let (tx, rx, probe) = monitored_queue::<u64>("hs", 2, "target", "drafter", cancel.clone());
    let now = dflash_top::telemetry::clock::now_ns;
    // A pop blocked on the empty queue shows as consumer wait before it ends.
    let popper = std::thread::Builder::new()
        .name("popper".into())
        .spawn(move || rx.pop().map(|_| rx))
        .unwrap();
    std::thread::sleep(Duration::from_millis(250));
    let c = probe.read(now());
    assert!(
        c.pop_wait_ns >= 200 * MS,
        "live wait {} ms",
        c.pop_wait_ns / MS
    );
    tx.push(now()).unwrap();
    let rx = popper.join().unwrap().unwrap();
    let after = probe.read(now());
    assert!(after.pop_wait_ns >= c.pop_wait_ns, "never shrinks");

    // Many producers and consumers at once, read all the while: counters only grow, and an
    // item's age starts when it entered the queue (a blocked push does not age it).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        for i in 0..3 {
            let tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("p{i}"))
                .spawn_scoped(s, move || {
                    for _ in 0..300 {
                        tx.push(now()).unwrap();
                    }
                })
                .unwrap();
        }
        for i in 0..2 {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("c{i}"))
                .spawn_scoped(s, move || {
                    for _ in 0..450 {
                        rx.pop().unwrap();
                        std::thread::sleep(Duration::from_micros(200));
                    }
                })
                .unwrap();
        }
        let reader_stop = stop.clone();
        let reader_probe = probe.clone();
        std::thread::Builder::new()
            .name("reader".into())
            .spawn_scoped(s, move || {
                let probe = reader_probe;
                let mut prev = probe.read(now());
                while !reader_stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let c = probe.read(now());
                    assert!(c.at_ns >= prev.at_ns, "timestamps go forward");
                    assert!(c.push_wait_ns >= prev.push_wait_ns, "push wait grows");
                    assert!(c.pop_wait_ns >= prev.pop_wait_ns, "pop wait grows");
                    assert!(c.pushes >= prev.pushes && c.pops >= prev.pops);
                    assert!(c.depth_ns >= prev.depth_ns);
                    prev = c;
                }
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(10));
        // Producers and consumers end by themselves; then stop the reader.
        while probe.read(now()).pops < 901 {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let c = probe.read(now());
    assert_eq!(c.pushes, 901);
    assert_eq!(c.pops, 901);
    cancel.cancel();
}

#[test]
fn a_pop_taken_ahead_never_waits_and_is_counted() {
    let cancel = CancelToken::new();
    let (tx, rx, probe) = monitored_queue::<u32>("hs", 2, "target", "drafter", cancel.clone());
    assert_eq!(rx.try_pop(), None, "empty: nothing, no wait");
    tx.push(7).unwrap();
    assert_eq!(rx.try_pop(), Some(7));
    let c = probe.read(dflash_top::telemetry::clock::now_ns());
    assert_eq!((c.pushes, c.pops, c.pop_wait_ns), (1, 1, 0));
    tx.push(8).unwrap();
    cancel.cancel();
    assert_eq!(rx.try_pop(), None, "a stopped run takes nothing more");
}

#[test]
fn an_item_ages_from_when_it_entered_the_queue() {
    let cancel = CancelToken::new();
    let (tx, rx, probe) = monitored_queue::<u32>("batch", 1, "loader", "target", cancel);
    tx.push(1).unwrap();
    let consumer = std::thread::Builder::new()
        .name("consumer".into())
        .spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let a = rx.pop().unwrap();
            let b = rx.pop().unwrap();
            (a, b)
        })
        .unwrap();
    // Blocks ~200 ms on the full queue; the item enters only then and is taken at once.
    tx.push(2).unwrap();
    assert_eq!(consumer.join().unwrap(), (1, 2));
    let c = probe.read(dflash_top::telemetry::clock::now_ns());
    assert!(c.push_wait_ns >= 150 * MS, "the push waited");
    assert!(
        c.age_ns_sum < 320 * MS,
        "item 1 aged ~200 ms, item 2 ~0: {} ms in all (a blocked push must not age its item)",
        c.age_ns_sum / MS
    );
}

#[test]
fn a_real_hang_flips_the_verdict_within_two_seconds_and_is_named() {
    use dflash_top::telemetry::Telemetry;
    let mut t = Telemetry::new();
    t.probes = false;
    let cancel = CancelToken::new();
    let (tx, rx, probe) = monitored_queue::<u32>("hs", 2, "target", "drafter", cancel.clone());
    t.add_queue(probe);
    let snaps = t.subscribe_with(1000);
    let hub_stop = CancelToken::new();
    let hub = t.spawn_hub(hub_stop.clone()).unwrap();
    let hang_at = std::time::Instant::now() + Duration::from_millis(1500);
    let hang = Duration::from_millis(3000);
    std::thread::scope(|s| {
        let sink = t.sink().clone();
        let c = cancel.clone();
        std::thread::Builder::new()
            .name("target-0".into())
            .spawn_scoped(s, move || {
                let mut rec = sink.recorder(Role::Target, "cpu");
                let mut hung = false;
                while !c.is_cancelled() {
                    rec.mark(Phase::Forward);
                    if !hung && std::time::Instant::now() >= hang_at {
                        hung = true;
                        std::thread::sleep(hang);
                    }
                    std::thread::sleep(Duration::from_millis(4));
                    rec.mark(Phase::HsPushWait);
                    if tx.push(1).is_err() {
                        break;
                    }
                    rec.end_step(0, None);
                }
            })
            .unwrap();
        let sink = t.sink().clone();
        let c = cancel.clone();
        std::thread::Builder::new()
            .name("drafter-0".into())
            .spawn_scoped(s, move || {
                let mut rec = sink.recorder(Role::Drafter, "cpu");
                while !c.is_cancelled() {
                    rec.mark(Phase::HsWait);
                    if rx.pop().is_err() {
                        break;
                    }
                    rec.mark(Phase::Forward);
                    std::thread::sleep(Duration::from_millis(6));
                    rec.end_step(64, Some(Default::default()));
                }
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500 + 2800));
        cancel.cancel();
    });
    hub_stop.cancel();
    hub.join().unwrap();
    let all: Vec<_> = snaps.try_iter().collect();
    let hang_s = 1.5;
    let in_hang = |s: &Snapshot| s.elapsed_s > hang_s + 0.05 && s.elapsed_s < hang_s + 2.8;
    let flipped = all
        .iter()
        .filter(|s| in_hang(s) && s.elapsed_s < hang_s + 2.0)
        .any(|s| matches!(s.verdict, Verdict::TargetBound | Verdict::Stalled));
    assert!(flipped, "the verdict changes within 2 s of the hang");
    let named = all
        .iter()
        .rev()
        .filter(|s| in_hang(s))
        .find_map(|s| s.stall.clone())
        .expect("stalled while the hang lasts");
    assert!(named.starts_with("target-0 in forward for "), "{named}");
}
