//! Warnings as data: the TUI's count and view, the headless `warn=` fields; `--fail-if` gates and
//! the flight recorder on the real binary.

use super::tui::{controls, screen, starved_snapshot, LIVE};
use dflash_top::telemetry::warnings::{Rule, Severity, Warning};
use dflash_top::tui::app::{Action, App, View};
use dflash_top::tui::theme::Theme;
use std::sync::Arc;

fn warned() -> dflash_top::telemetry::Snapshot {
    let mut s = starved_snapshot();
    s.warnings = vec![
        Warning {
            rule: Rule::Stalled,
            subject: "target-0".into(),
            severity: Severity::Error,
            evidence: "no step has ended: target-0 in forward for 12.0 s".into(),
            fix: "see where target-0 hangs".into(),
            for_s: 2.0,
        },
        Warning {
            rule: Rule::Starved,
            subject: "drafter".into(),
            severity: Severity::Warn,
            evidence: "drafters wait on empty queue `hs` 92% of the time (depth 0/2)".into(),
            fix: "the target side is the bottleneck".into(),
            for_s: 14.0,
        },
    ];
    s
}

#[test]
fn the_header_counts_warnings_by_severity_and_view_7_lists_them() {
    let (ctl, _t) = controls(false);
    let mut app = App::new();
    app.on_snapshot(Arc::new(warned()));
    let s = screen(&app, 120, 30, Theme::from_color(false), LIVE);
    assert!(s.contains("⚠ 1 error 1 warn (7)"), "{s}");
    app.update(Action::ShowView(6), &ctl);
    assert_eq!(app.view, View::Warnings);
    let s = screen(&app, 120, 30, Theme::from_color(false), LIVE);
    for m in [
        "warnings: 1 error · 1 warn · 0 info",
        "ERROR stalled:target-0",
        "WARN  starved:drafter",
        "`hs` 92% of the time",
        "fix: the target side is the bottleneck",
    ] {
        assert!(s.contains(m), "no {m} in\n{s}");
    }
    // Errors come first.
    assert!(s.find("stalled:target-0") < s.find("starved:drafter"));
    // None in force: no count, and the view says every rule is quiet.
    let mut app = App::new();
    app.on_snapshot(Arc::new(starved_snapshot()));
    app.update(Action::ShowView(6), &ctl);
    let s = screen(&app, 120, 30, Theme::from_color(false), LIVE);
    assert!(!s.contains('⚠'), "{s}");
    assert!(s.contains("no warning in force"), "{s}");
}

#[test]
fn headless_lines_list_warnings_as_rule_subject_with_counts() {
    let line = dflash_top::headless::interval_line(&warned());
    assert!(
        line.contains(
            " warn=stalled:target-0,starved:drafter warn.error=1 warn.warn=1 warn.info=0"
        ),
        "{line}"
    );
    let quiet = dflash_top::headless::interval_line(&starved_snapshot());
    assert!(!quiet.contains("warn="), "{quiet}");
}
