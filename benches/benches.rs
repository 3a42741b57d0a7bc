//! Benchmarks, one binary: `cargo bench --bench benches` (or `make bench`); one group:
//! `cargo bench --bench benches -- cpu_probe_refresh`.
//! Results go in docs/performance.md (the README's figures table links it) as ratios of side-by-side runs.

use criterion::{criterion_group, criterion_main, Criterion};
use dflash_top::telemetry::{Phase, Role, Telemetry};
use std::hint::black_box;

/// One phase mark, profiling on and off, beside puffin's scope and a tracing span.
fn phase_mark(c: &mut Criterion) {
    let t = Telemetry::with_capacity(1 << 16);
    let mut rec = t.sink().recorder(Role::Drafter, "cpu");
    let mut g = c.benchmark_group("phase_mark");
    let phases = [Phase::Forward, Phase::Backward];
    let mut i = 0usize;

    g.bench_function("loop_baseline", |b| {
        b.iter(|| {
            i ^= 1;
            black_box(phases[i]);
        })
    });
    t.switches().set_profiling(true);
    g.bench_function("dflash_top_on", |b| {
        b.iter(|| {
            i ^= 1;
            rec.mark(black_box(phases[i]));
        })
    });
    t.switches().set_profiling(false);
    g.bench_function("dflash_top_off", |b| {
        b.iter(|| {
            i ^= 1;
            rec.mark(black_box(phases[i]));
        })
    });
    rec.end_step(0, None);

    puffin::set_scopes_on(true);
    g.bench_function("puffin_scope_on", |b| {
        b.iter(|| {
            puffin::profile_scope!("phase");
            black_box(&i);
        })
    });
    puffin::GlobalProfiler::lock().new_frame();
    puffin::set_scopes_on(false);
    g.bench_function("puffin_scope_off", |b| {
        b.iter(|| {
            puffin::profile_scope!("phase");
            black_box(&i);
        })
    });

    let subscriber = tracing::subscriber::NoSubscriber::default();
    tracing::subscriber::with_default(subscriber, || {
        g.bench_function("tracing_span_noop_subscriber", |b| {
            b.iter(|| {
                let span = tracing::info_span!("phase");
                let _e = span.enter();
                black_box(&i);
            })
        });
    });
    g.finish();
}

criterion_group!(benches, phase_mark);

/// A full overview frame on a TestBackend, for 8 and 64 threads.
fn render_frame(c: &mut Criterion) {
    use dflash_top::telemetry::snapshot::*;
    use dflash_top::telemetry::N_PHASES;
    use dflash_top::tui::app::App;
    use dflash_top::tui::panels::Badges;
    use dflash_top::tui::theme::Theme;
    use dflash_top::tui::view::draw;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use std::sync::Arc;

    fn snapshot(threads: usize) -> Snapshot {
        let roles = [Role::Loader, Role::Target, Role::Drafter];
        let mut s = Snapshot::default();
        for i in 0..threads {
            let role = roles[i % 3];
            let mut phase_ns = [0u64; N_PHASES];
            for (k, p) in role.phases().iter().enumerate() {
                phase_ns[p.index()] = (k as u64 + 1) * 1_000_000;
            }
            let w = PhaseWindow {
                steps: 10,
                wall_ns: phase_ns.iter().sum(),
                phase_ns,
                phase_steps: 10.0,
                tokens: 5120.0,
                span_ns: 1_000_000_000,
                ..Default::default()
            };
            s.threads.push(ThreadView {
                name: format!("{}-{i}", role.name()),
                role,
                device: "cuda:0".into(),
                tid: i as i32,
                cpu_pct: Some(50.0),
                phase: Phase::Forward,
                phase_s: 0.1,
                state: ThreadState::Working,
                os_state: Some('R'),
                w1: w,
                w10: w,
                run: w,
                sizes: None,
            });
        }
        for name in ["batch", "hs"] {
            s.queues.push(QueueView {
                name: name.into(),
                capacity: 4,
                history: vec![2.0; 100],
                ..Default::default()
            });
        }
        s.loss_history = (0..3000)
            .map(|i| (i as f64 * 0.1, 5.0 - i as f64 * 0.001))
            .collect();
        s.tok_history = (0..3000)
            .map(|i| (i as f64 * 0.1, 12000.0 + (i % 7) as f64))
            .collect();
        s
    }

    let badges = Badges {
        profiling: true,
        gpu_timing: dflash_top::telemetry::GpuTiming::Async,
        paused: false,
        live: true,
        replay: None,
    };
    let mut g = c.benchmark_group("render_frame");
    for n in [8usize, 64] {
        let mut app = App::new();
        app.on_snapshot(Arc::new(snapshot(n)));
        let mut term = Terminal::new(TestBackend::new(200, 60)).unwrap();
        g.bench_function(format!("overview_{n}_threads_200x60"), |b| {
            b.iter(|| {
                term.draw(|f| draw(f, &app, Theme::from_color(true), badges))
                    .unwrap();
            })
        });
    }
    // The timeline: 64 threads, each ending a 20 ms step of its role's phases back to back for
    // the last 10 s (32,000 spans), in a 200x60 frame.
    let mut s = snapshot(64);
    let now = 20_000_000_000u64;
    s.now_ns = now;
    for t in &s.threads {
        let phases: Vec<(Phase, u64)> = t
            .role
            .phases()
            .iter()
            .map(|p| (*p, 20_000_000 / t.role.phases().len() as u64))
            .collect();
        let wall: u64 = phases.iter().map(|p| p.1).sum();
        for k in 0..(10_000_000_000 / wall) {
            s.steps.push(StepSpan {
                thread: t.name.clone(),
                role: t.role,
                end_ns: now - k * wall,
                wall_ns: wall,
                phases: phases.clone(),
            });
        }
    }
    s.steps.sort_by_key(|x| x.end_ns);
    let spans = s.steps.len();
    let mut app = App::new();
    app.on_snapshot(Arc::new(s));
    app.view = dflash_top::tui::choices::View::Timeline;
    assert_eq!(app.history.spans.len(), spans, "all 10 s of spans are kept");
    let mut term = Terminal::new(TestBackend::new(200, 60)).unwrap();
    g.bench_function("timeline_64_threads_10s_200x60", |b| {
        b.iter(|| {
            term.draw(|f| draw(f, &app, Theme::from_color(true), badges))
                .unwrap();
        })
    });
    // The model alone: the 64 lanes of that frame, two half-columns a cell of 189.
    let snap = app.shown().cloned().unwrap();
    let threads: Vec<_> = snap.threads.iter().collect();
    g.bench_function("timeline_lanes_64_threads_10s_378_columns", |b| {
        b.iter(|| {
            black_box(dflash_top::tui::lanes::lanes(
                &threads,
                app.shown_segments(),
                app.time_span(),
                378,
                Some(snap.now_ns),
            ))
        })
    });
    g.finish();
}

criterion_group!(ui, render_frame);

/// One refresh of the per-thread CPU probe with 64 idle threads in the process: this process's
/// /proc task list (what the hub does), the same plus memory through sysinfo (this pid only), and
/// beside them sysinfo's refresh of every process of the host with their tasks (what it did
/// before, and what grows with the host's thread count).
fn cpu_probe_refresh(c: &mut Criterion) {
    use dflash_top::probe::cpu::CpuProbe;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    use sysinfo::{ProcessRefreshKind, ProcessesToUpdate, System, UpdateKind};

    let stop = Arc::new(AtomicBool::new(false));
    let idle: Vec<_> = (0..64)
        .map(|i| {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("idle-{i}"))
                .spawn(move || {
                    while !stop.load(Relaxed) {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                })
                .unwrap()
        })
        .collect();
    let mut g = c.benchmark_group("cpu_probe_refresh");
    let mut probe = CpuProbe::new();
    probe.sample();
    g.bench_function("proc_tasks_64_threads", |b| {
        b.iter(|| black_box(probe.sample_threads()))
    });
    g.bench_function("proc_tasks_and_memory_64_threads", |b| {
        b.iter(|| black_box(probe.sample()))
    });
    let mut sys = System::new();
    let kind = ProcessRefreshKind::nothing()
        .with_cpu()
        .with_tasks()
        .with_exe(UpdateKind::Never);
    g.bench_function("sysinfo_all_processes_64_threads", |b| {
        b.iter(|| black_box(sys.refresh_processes_specifics(ProcessesToUpdate::All, true, kind)))
    });
    g.finish();
    stop.store(true, Relaxed);
    for t in idle {
        let _ = t.join();
    }
}

criterion_group!(probes, cpu_probe_refresh);
criterion_main!(benches, ui, probes);
