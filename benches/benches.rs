//! Benchmarks, one binary: `cargo bench --bench benches` (or `make bench`).
//! Results go in the README as ratios of side-by-side runs.

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
criterion_main!(benches);
