//! Tests of the timeline's lanes (src/tui/lanes.rs).

use super::*;
use crate::telemetry::Role;
use crate::tui::segments::Segment;

fn step(end_ms: u64, phases: &[(Phase, u64)]) -> StepSpan {
    let wall = phases.iter().map(|p| p.1).sum::<u64>() * 1_000_000;
    StepSpan {
        thread: "drafter-0".into(),
        role: Role::Drafter,
        end_ns: end_ms * 1_000_000,
        wall_ns: wall,
        phases: phases.iter().map(|(p, ms)| (*p, ms * 1_000_000)).collect(),
    }
}

fn thread(phase: Phase, phase_s: f64) -> ThreadView {
    ThreadView {
        name: "drafter-0".into(),
        role: Role::Drafter,
        device: "cpu".into(),
        tid: 1,
        cpu_pct: None,
        phase,
        phase_s,
        state: ThreadState::Working,
        os_state: None,
        w1: Default::default(),
        w10: Default::default(),
        run: Default::default(),
        sizes: None,
    }
}

/// The span `[right - width, right)`, in ms.
fn span_ms(right_ms: u64, width_ms: u64) -> TimeSpan {
    TimeSpan {
        right_ns: right_ms * 1_000_000,
        width_ns: width_ms * 1_000_000,
    }
}

fn segments_of(s: &StepSpan) -> Segments {
    let mut segs = Segments::default();
    segs.push(s);
    segs
}

#[test]
fn columns_take_the_phase_with_most_time() {
    // 0..100 ms in 10 columns of 10 ms: hs_wait 0..40, forward 40..55, backward 55..100.
    let s = step(
        100,
        &[
            (Phase::HsWait, 40),
            (Phase::Forward, 15),
            (Phase::Backward, 45),
        ],
    );
    let span = span_ms(100, 100);
    let segs = segments_of(&s);
    let l = lanes(&[&thread(Phase::HsWait, 0.0)], &segs, span, 10, None);
    use Phase::*;
    let want = [
        HsWait, HsWait, HsWait, HsWait, Forward, Backward, Backward, Backward, Backward, Backward,
    ];
    assert_eq!(l[0].cells, want.map(Some).to_vec());
}

#[test]
fn the_phase_in_progress_reaches_now() {
    let s = step(20, &[(Phase::Forward, 20)]);
    let span = span_ms(100, 100);
    // In hs_wait for the last 50 ms; 20..50 ms is unknown.
    let segs = segments_of(&s);
    let l = lanes(
        &[&thread(Phase::HsWait, 0.05)],
        &segs,
        span,
        10,
        Some(100_000_000),
    );
    assert_eq!(l[0].cells[1], Some(Phase::Forward));
    assert_eq!(l[0].cells[3], None);
    assert!(l[0].cells[5..].iter().all(|c| *c == Some(Phase::HsWait)));
}

#[test]
fn in_the_first_seconds_of_a_run_now_is_at_the_right_edge() {
    // The clock reads 3 s, the span is 10 s wide: 0..3 s fill the right 3 of 10 columns.
    let s = step(3_000, &[(Phase::Forward, 3_000)]);
    let span = span_ms(3_000, 10_000);
    let segs = segments_of(&s);
    let l = lanes(&[&thread(Phase::Forward, 0.0)], &segs, span, 10, None);
    let mut want = vec![None; 7];
    want.extend([Some(Phase::Forward); 3]);
    assert_eq!(l[0].cells, want);
    assert_eq!(span.column(2_999_999_999, 10), Some(9));
    assert_eq!(span.column(0, 10), Some(7));
}

/// Brute force: each column's phase with most time, the later phase on a tie.
fn lane_by_brute_force(segs: &[Segment], span: TimeSpan, cols: usize) -> Vec<Option<Phase>> {
    let g = Grid::new(span, cols);
    (0..cols)
        .map(|c| {
            let (lo, hi) = (g.start(c), g.start(c + 1));
            let mut acc = [0u64; N_PHASES];
            for s in segs {
                let (a, b) = (s.start_ns.max(lo), s.end_ns.min(hi));
                if a < b {
                    acc[s.phase.index()] += b - a;
                }
            }
            let (i, ns) = acc.iter().enumerate().max_by_key(|x| *x.1).unwrap();
            (*ns > 0).then(|| Phase::ALL[i])
        })
        .collect()
}

#[test]
fn lanes_match_a_brute_force_count_per_column() {
    // Steps of random phases and lengths, back to back with random gaps, over random spans
    // and widths (columns narrower and wider than a segment, spans cutting steps).
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for case in 0..300 {
        let mut segs = Segments::default();
        let mut t = rnd(50_000_000);
        for _ in 0..rnd(60) {
            t += rnd(3) * rnd(10_000_000);
            let phases: Vec<(Phase, u64)> = (0..1 + rnd(6))
                .map(|_| {
                    // Half the cases in whole milliseconds (ties, empty phases).
                    let ns = if case % 2 == 0 {
                        rnd(8_000_000)
                    } else {
                        rnd(4) * 1_000_000
                    };
                    (Phase::ALL[rnd(N_PHASES as u64) as usize], ns)
                })
                .collect();
            let wall: u64 = phases.iter().map(|p| p.1).sum();
            t += wall;
            segs.push(&StepSpan {
                thread: "drafter-0".into(),
                role: Role::Drafter,
                end_ns: t,
                wall_ns: wall,
                phases,
            });
        }
        let span = TimeSpan {
            right_ns: rnd(t + 100_000_000),
            width_ns: 1 + rnd(400_000_000),
        };
        let cols = 1 + rnd(300) as usize;
        let all: Vec<Segment> = segs
            .of("drafter-0")
            .into_iter()
            .flatten()
            .copied()
            .collect();
        let l = lanes(&[&thread(Phase::Other, 0.0)], &segs, span, cols, None);
        let want = lane_by_brute_force(&all, span, cols);
        let g = Grid::new(span, cols);
        for (c, (got, want)) in l[0].cells.iter().zip(&want).enumerate() {
            let (lo, hi) = (g.start(c), g.start(c + 1));
            let near: Vec<_> = all
                .iter()
                .filter(|s| s.end_ns > lo && s.start_ns < hi)
                .collect();
            assert_eq!(
                got, want,
                "case {case}: {span:?}, {cols} columns, column {c} [{lo}, {hi}): {near:?}"
            );
        }
    }
}

#[test]
fn queue_strip_maps_ticks_to_columns() {
    let q = QueueView {
        capacity: 4,
        history: vec![0.0, 2.0, 4.0],
        ..Default::default()
    };
    let span = TimeSpan {
        right_ns: 1_000_000_000,
        width_ns: 500_000_000,
    };
    // Five columns of 100 ms: the last three ticks, oldest first; none before.
    let s = queue_strip(&q, span, 5, 1_000_000_000);
    assert_eq!(s, vec![None, None, Some(0.0), Some(0.5), Some(1.0)]);
}
