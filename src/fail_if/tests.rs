use super::*;
use crate::telemetry::snapshot::GpuView;
use crate::telemetry::warnings::{Rule, Warning};

fn at(t: f64, edit: impl Fn(&mut Snapshot)) -> Snapshot {
    let mut s = Snapshot {
        elapsed_s: t,
        ..Snapshot::default()
    };
    edit(&mut s);
    s
}

/// The time (in 0.5 s ticks up to 100 s) the gate trips at, if it does.
fn trips_at(expr: &str, edit: impl Fn(&mut Snapshot)) -> Option<f64> {
    let mut g = Gate::parse(expr).unwrap();
    (0..=200)
        .map(|k| k as f64 * 0.5)
        .find(|t| g.check(&at(*t, &edit)).is_some())
}

#[test]
fn tok_s_below_after_a_warm_up() {
    let slow = |s: &mut Snapshot| s.train.tok_per_s_10s = 9_000.0;
    assert_eq!(trips_at("tok/s<12000 after 60s", slow), Some(60.0));
    assert_eq!(trips_at("tok/s < 12k after 1m", slow), Some(60.0));
    assert_eq!(trips_at("tok/s<8000", slow), None);
    let mut g = Gate::parse("tok/s<12000 after 60s").unwrap();
    let why = g.check(&at(61.0, slow)).unwrap();
    assert!(
        why.starts_with("fail-if: `tok/s<12000 after 60s` held at t=61.0s: tok/s=9000"),
        "{why}"
    );
}

#[test]
fn verdict_for_a_while_and_a_break_starts_over() {
    let stalled = |s: &mut Snapshot| {
        if s.elapsed_s >= 10.0 && s.elapsed_s != 20.0 {
            s.verdict = Verdict::Stalled;
            s.stall = Some("target-0 in forward for 12.0 s".into());
        }
    };
    // Held from 10 s, broken at 20 s, held again from 20.5 s.
    assert_eq!(trips_at("verdict=stalled for 30s", stalled), Some(50.5));
    assert_eq!(trips_at("verdict=stalled", stalled), Some(10.0));
    let starved = |s: &mut Snapshot| s.verdict = Verdict::TargetBound;
    assert_eq!(trips_at("verdict=starved for 5s", starved), Some(5.0));
    assert_eq!(trips_at("verdict=target-bound", starved), Some(0.0));
    assert_eq!(trips_at("verdict=blocked", starved), None);
    assert_eq!(trips_at("verdict!=balanced after 3s", starved), Some(3.0));
    let mut g = Gate::parse("verdict=stalled").unwrap();
    let why = g.check(&at(11.0, stalled)).unwrap();
    assert!(why.contains("target-0 in forward"), "{why}");
}

fn gpus(util: u32) -> GpuPanel {
    GpuPanel::Present(vec![GpuView {
        index: 0,
        name: "H200".into(),
        util_pct: util,
        mem_used_mib: 0,
        mem_total_mib: 0,
        power_w: 0.0,
        sm_clock_mhz: 0,
        temp_c: 0,
        util_history: vec![],
        cuda: Some(0),
        mem_bw_pct: 0,
        proc_mem_mib: None,
        throttle: vec![],
        host: None,
    }])
}

#[test]
fn gpu_idle_only_where_there_are_gpus() {
    assert_eq!(
        trips_at("gpu_idle>20% after 60s", |s| s.gpus = gpus(50)),
        Some(60.0)
    );
    assert_eq!(
        trips_at("gpu_idle>20% after 60s", |s| s.gpus = gpus(95)),
        None
    );
    // No GPU: the number does not exist, the gate never holds.
    assert_eq!(trips_at("gpu_idle>20%", |_| {}), None);
}

#[test]
fn warnings_at_or_above_a_severity() {
    let w = |severity| {
        move |s: &mut Snapshot| {
            s.warnings = vec![Warning {
                rule: Rule::Starved,
                subject: "drafter".into(),
                severity,
                evidence: "drafters wait".into(),
                fix: String::new(),
                for_s: 10.0,
            }]
        }
    };
    assert_eq!(trips_at("warn>=error", w(Severity::Warn)), None);
    assert_eq!(trips_at("warn>=warn", w(Severity::Warn)), Some(0.0));
    assert_eq!(trips_at("warn>=error", w(Severity::Error)), Some(0.0));
    let mut g = Gate::parse("warn>=warn").unwrap();
    let why = g.check(&at(1.0, w(Severity::Warn))).unwrap();
    assert!(why.contains("starved:drafter (drafters wait)"), "{why}");
}

#[test]
fn bad_expressions_name_themselves_and_the_forms() {
    for (e, why) in [
        ("", "no condition"),
        ("speed<3", "no known metric"),
        ("tok/s=3", "compared with <"),
        ("tok/s<fast", "`fast` is not a number"),
        ("verdict=sleepy", "`sleepy` is not a verdict"),
        ("warn>=fatal", "`fatal` is not info, warn or error"),
        ("warn=error", "compared with >="),
        ("tok/s<3 after soon", "`soon` is not a duration"),
    ] {
        let msg = Gate::parse(e).unwrap_err().to_string();
        assert!(msg.contains(&format!("--fail-if `{e}`")), "{msg}");
        assert!(msg.contains(why), "{e}: {msg}");
        assert!(msg.contains("verdict=stalled for 30s"), "{msg}");
    }
}
