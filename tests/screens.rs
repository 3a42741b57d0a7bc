//! Every view from scripted runs (starved, blocked, stalled, paused, replay) at 80x24 and
//! 200x60, as insta snapshots; the timeline's lanes, zoom, pan and export; sorting and selection.

use super::tui::{controls, export_in, screen, starved_snapshot, LIVE, NOW_NS};
use dflash_top::telemetry::snapshot::*;
use dflash_top::telemetry::verdict::Verdict;
use dflash_top::telemetry::{Phase, Role};
use dflash_top::tui::app::App;
use dflash_top::tui::choices::View;
use dflash_top::tui::keys::Action;
use dflash_top::tui::panels::Badges;
use dflash_top::tui::theme::Theme;
use std::sync::Arc;

const MS: u64 = 1_000_000;

/// Back-to-back steps of one thread with the same phases (ms), the last ending at `until_ms`
/// before `NOW_NS`, going back `secs` seconds.
fn steps(
    name: &str,
    role: Role,
    phases: &[(Phase, u64)],
    until_ms: u64,
    secs: u64,
) -> Vec<StepSpan> {
    let wall: u64 = phases.iter().map(|p| p.1).sum();
    let end = NOW_NS - until_ms * MS;
    let n = secs * 1000 / wall;
    (0..n)
        .rev()
        .map(|k| StepSpan {
            thread: name.into(),
            role,
            end_ns: end - k * wall * MS,
            wall_ns: wall * MS,
            phases: phases.iter().map(|(p, ms)| (*p, ms * MS)).collect(),
        })
        .collect()
}

fn by_end(mut v: Vec<StepSpan>) -> Vec<StepSpan> {
    v.sort_by_key(|s| s.end_ns);
    v
}

/// The drafters wait on an empty HS queue while the target runs forward.
fn starved() -> Vec<Snapshot> {
    let mut s = starved_snapshot();
    s.steps = by_end(
        [
            steps(
                "loader",
                Role::Loader,
                &[(Phase::Pack, 2), (Phase::PushWait, 78)],
                0,
                10,
            ),
            steps(
                "target-0",
                Role::Target,
                &[(Phase::H2d, 1), (Phase::Forward, 75), (Phase::HsPack, 4)],
                0,
                10,
            ),
            steps(
                "drafter-0",
                Role::Drafter,
                &[
                    (Phase::HsWait, 45),
                    (Phase::Anchors, 2),
                    (Phase::Forward, 12),
                    (Phase::Loss, 5),
                    (Phase::Backward, 14),
                    (Phase::Optim, 2),
                ],
                0,
                10,
            ),
        ]
        .concat(),
    );
    for q in &mut s.queues {
        q.history = vec![q.history[0]; 100];
    }
    // It was balanced until 4 s ago.
    let mut before = starved_snapshot();
    before.seq = 6;
    before.now_ns = NOW_NS - 4_000 * MS;
    before.verdict = Verdict::Balanced;
    vec![before, s]
}

/// The targets wait on a full HS queue: the drafter is the slow side.
fn blocked() -> Vec<Snapshot> {
    let mut s = starved_snapshot();
    s.verdict = Verdict::DrafterBound;
    s.threads[1].phase = Phase::HsPushWait;
    s.threads[1].state = ThreadState::Waiting;
    s.threads[2].phase = Phase::Backward;
    s.threads[2].state = ThreadState::Working;
    for q in &mut s.queues {
        q.starving = false;
        q.blocking = q.name == "hs";
        if q.name == "hs" {
            q.depth = 2;
            q.history = vec![2.0; 100];
            q.producer_wait_share = 0.6;
        }
    }
    s.steps = by_end(
        [
            steps(
                "target-0",
                Role::Target,
                &[(Phase::Forward, 40), (Phase::HsPushWait, 60)],
                0,
                10,
            ),
            steps(
                "drafter-0",
                Role::Drafter,
                &[
                    (Phase::Forward, 30),
                    (Phase::Loss, 20),
                    (Phase::Backward, 50),
                ],
                0,
                10,
            ),
        ]
        .concat(),
    );
    vec![s]
}

/// Nothing has ended for 6 s: target-0 is stuck in forward, the drafter waits.
fn stalled() -> Vec<Snapshot> {
    let mut s = starved_snapshot();
    s.verdict = Verdict::Stalled;
    s.stall = Some("target-0 in forward for 6.0 s".into());
    s.threads[1].phase_s = 6.0;
    s.threads[2].phase_s = 5.9;
    s.steps = by_end(
        [
            steps(
                "target-0",
                Role::Target,
                &[(Phase::Forward, 75), (Phase::HsPack, 5)],
                6_000,
                4,
            ),
            steps(
                "drafter-0",
                Role::Drafter,
                &[
                    (Phase::HsWait, 20),
                    (Phase::Forward, 30),
                    (Phase::Backward, 30),
                ],
                5_900,
                4,
            ),
        ]
        .concat(),
    );
    vec![s]
}

/// Paused 3 s ago: no step since.
fn paused() -> Vec<Snapshot> {
    let mut s = starved_snapshot();
    s.verdict = Verdict::Paused;
    s.paused = true;
    for t in &mut s.threads {
        t.phase = Phase::Other;
        t.phase_s = 3.0;
    }
    s.steps = by_end(
        [
            steps(
                "target-0",
                Role::Target,
                &[(Phase::Forward, 50), (Phase::HsPack, 10)],
                3_000,
                7,
            ),
            steps(
                "drafter-0",
                Role::Drafter,
                &[(Phase::Forward, 25), (Phase::Backward, 35)],
                3_000,
                7,
            ),
        ]
        .concat(),
    );
    vec![s]
}

/// A scripted run: the snapshots a front-end receives, in order.
type Script = fn() -> Vec<Snapshot>;

fn app_of(feed: Vec<Snapshot>) -> App {
    let mut app = App::new();
    for s in feed {
        app.on_snapshot(Arc::new(s));
    }
    app
}

const REPLAY: Badges = Badges {
    profiling: true,
    gpu_timing: dflash_top::telemetry::GpuTiming::Async,
    paused: false,
    live: false,
    replay: None,
};

#[test]
fn every_view_of_every_scripted_run_at_both_sizes() {
    let runs: [(&str, Script, Badges); 5] = [
        ("starved", starved, LIVE),
        ("blocked", blocked, LIVE),
        ("stalled", stalled, LIVE),
        (
            "paused",
            paused,
            Badges {
                paused: true,
                ..LIVE
            },
        ),
        ("replay", starved, REPLAY),
    ];
    let (ctl, _t) = controls(false);
    for (name, feed, badges) in runs {
        let mut app = app_of(feed());
        // The drafter selected: highlighted in the tables, in the threads view's detail.
        app.selected = Some("drafter-0".into());
        for (i, view) in View::ALL.iter().enumerate() {
            app.update(Action::ShowView(i), &ctl);
            for (w, h) in [(80u16, 24u16), (200, 60)] {
                let s = screen(&app, w, h, Theme::from_color(true), badges);
                assert!(
                    s.starts_with("dflash-top step 1200"),
                    "{name} {view:?}: {s}"
                );
                let title = view.title().replace(' ', "_");
                insta::assert_snapshot!(format!("{name}_{title}_{w}x{h}"), s);
            }
        }
    }
}

/// The lane of `thread` on a timeline screen.
fn lane<'a>(s: &'a str, thread: &str) -> &'a str {
    s.lines()
        .find(|l| l.starts_with(&format!("│{thread}")))
        .unwrap_or_else(|| panic!("no lane for {thread}:\n{s}"))
}

#[test]
fn the_timeline_shows_starvation_at_a_glance() {
    let (ctl, _t) = controls(false);
    let mut app = app_of(starved());
    app.update(Action::ShowView(View::Timeline as usize), &ctl);
    let s = screen(&app, 120, 30, Theme::from_color(true), LIVE);
    let target = lane(&s, "target-0");
    let drafter = lane(&s, "drafter-0");
    let count = |l: &str, ch: char| l.chars().filter(|c| *c == ch).count();
    // The target's lane is solid work; the drafter's is half hatched (waiting on the HS queue).
    assert!(count(target, '█') > 90, "{target}");
    assert!(count(drafter, '▒') > 40, "{drafter}");
    assert!(
        s.contains("▼balanced") && s.contains("target-bound▼"),
        "the verdict change is marked: {s}"
    );
    let hs = lane(&s, "q hs");
    assert!(count(hs, '·') > 90, "the empty HS queue: {hs}");
    assert!(s.contains("last 10 s"), "{s}");
    // Without colour each phase has its glyph: '~' is hs_wait, 'F' forward.
    let plain = screen(&app, 120, 30, Theme::from_color(false), LIVE);
    assert!(lane(&plain, "drafter-0").contains("~~~"), "{plain}");
    assert!(lane(&plain, "target-0").contains("FFF"), "{plain}");
}

#[test]
fn close_verdict_changes_stay_readable_on_the_timeline() {
    // Three changes within 100 ms (adjacent columns at 10 s over ~100 columns), then two far
    // apart: the close ones become one mark that counts them, not labels written over each
    // other.
    let changes = [
        (8_000, Verdict::Balanced),
        (7_950, Verdict::TargetBound),
        (7_900, Verdict::Stalled),
        (3_000, Verdict::Balanced),
        (0, Verdict::TargetBound),
    ];
    let feed = changes.iter().enumerate().map(|(i, (ms_ago, v))| {
        let mut s = starved_snapshot();
        s.seq = i as u64 + 1;
        s.now_ns = NOW_NS - ms_ago * MS;
        s.verdict = *v;
        s
    });
    let (ctl, _t) = controls(false);
    let mut app = app_of(feed.collect());
    app.update(Action::ShowView(View::Timeline as usize), &ctl);
    let s = screen(&app, 120, 30, Theme::from_color(false), LIVE);
    let row = s
        .lines()
        .find_map(|l| l.strip_prefix("│verdict"))
        .unwrap_or_else(|| panic!("no verdict row:\n{s}"));
    let words: Vec<&str> = row
        .trim_end_matches('│')
        .split(|c: char| c == '▼' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .collect();
    assert_eq!(
        words,
        ["×3", "stalled", "balanced", "target-bound"],
        "every word on the row is whole: {row}"
    );
}

#[test]
fn a_stall_reaches_the_right_edge() {
    let (ctl, _t) = controls(false);
    let mut app = app_of(stalled());
    app.update(Action::ShowView(View::Timeline as usize), &ctl);
    let s = screen(&app, 120, 30, Theme::from_color(false), LIVE);
    let target = lane(&s, "target-0");
    // The last 6 s of the 10 are one forward, up to now.
    let tail: String = target.chars().rev().skip(1).take(50).collect();
    assert!(tail.chars().all(|c| c == 'F'), "{target}");
}

#[test]
fn zoom_and_pan_change_the_span_and_e_exports_it() {
    let (ctl, _t) = controls(false);
    let mut app = app_of(starved());
    assert_eq!(app.time_span().width_ns, 10_000 * MS);
    app.update(Action::ZoomIn, &ctl);
    app.update(Action::ZoomIn, &ctl);
    assert_eq!(app.time_span().width_ns, 2_000 * MS);
    assert_eq!(app.time_span().right_ns, NOW_NS);
    app.update(Action::PanBack, &ctl);
    assert!(app.frozen.is_some(), "panning freezes the display");
    assert_eq!(app.time_span().right_ns, NOW_NS - 500 * MS);
    // New snapshots do not move a frozen timeline.
    let mut later = starved_snapshot();
    later.seq = 8;
    later.now_ns = NOW_NS + 1_000 * MS;
    app.on_snapshot(Arc::new(later));
    assert_eq!(app.time_span().right_ns, NOW_NS - 500 * MS);
    // Panning stops at the oldest span kept.
    for _ in 0..100 {
        app.update(Action::PanBack, &ctl);
    }
    assert!(app.time_span().left_ns() >= NOW_NS - 10_000 * MS - 100 * MS);
    for _ in 0..100 {
        app.update(Action::PanForward, &ctl);
    }
    assert_eq!(app.pan_ns, 0);
    app.update(Action::ZoomIn, &ctl);
    let dir = export_in(&mut app);
    assert!(
        app.note
            .as_deref()
            .unwrap()
            .starts_with("trace of the last 1 s"),
        "{:?}",
        app.note
    );
    let file = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(file.path()).unwrap()).unwrap();
    let slices: Vec<f64> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap())
        .collect();
    // Only steps with time in the last second: the target's ~13, the drafter's and loader's.
    let from_us = (NOW_NS - 1_100 * MS) as f64 / 1e3;
    assert!(!slices.is_empty());
    assert!(slices.iter().all(|end| *end >= from_us), "{slices:?}");
}

#[test]
fn sort_and_selection_follow_the_keys() {
    let (ctl, _t) = controls(false);
    let mut app = app_of(blocked());
    let names = |app: &App| -> Vec<String> {
        let snap = app.shown().unwrap().clone();
        app.ordered_threads(&snap)
            .iter()
            .map(|t| t.name.clone())
            .collect()
    };
    assert_eq!(names(&app), ["loader", "target-0", "drafter-0"]);
    app.update(Action::CycleSort, &ctl); // cpu: all equal, stable
    app.update(Action::CycleSort, &ctl); // state: waiting first
    assert_eq!(app.note.as_deref(), Some("threads sorted by state"));
    assert_eq!(names(&app), ["loader", "target-0", "drafter-0"]);
    app.update(Action::CycleSort, &ctl);
    app.update(Action::CycleSort, &ctl); // name
    assert_eq!(names(&app), ["drafter-0", "loader", "target-0"]);
    app.update(Action::SelectNext, &ctl);
    assert_eq!(app.selected.as_deref(), Some("drafter-0"));
    app.update(Action::SelectNext, &ctl);
    app.update(Action::SelectNext, &ctl);
    app.update(Action::SelectNext, &ctl);
    assert_eq!(
        app.selected.as_deref(),
        Some("target-0"),
        "stops at the end"
    );
    app.update(Action::SelectPrev, &ctl);
    assert_eq!(app.selected.as_deref(), Some("loader"));
    // Esc clears the selection before anything else; it never quits.
    app.update(Action::Back, &ctl);
    assert_eq!(app.selected, None);
    assert!(!app.quit);
}

#[test]
fn the_ui_config_binds_keys_and_colours_and_names_the_file_when_wrong() {
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use dflash_top::tui::settings::parse;
    use ratatui::style::Color;
    let path = std::path::Path::new("/home/u/.config/dflash-top/ui.toml");
    let ui = parse(
        "[keys]\nquit = \"x\"\nselect-next = [\"n\", \"ctrl-n\"]\n[colors]\ntheme = \"light\"\nforward = \"#3060ff\"\n",
        path,
        true,
    )
    .unwrap();
    let key = |c: char, m: KeyModifiers| KeyEvent::new(KeyCode::Char(c), m);
    assert_eq!(
        ui.keys.action(key('x', KeyModifiers::NONE)),
        Some(Action::Quit)
    );
    assert_eq!(
        ui.keys.action(key('n', KeyModifiers::CONTROL)),
        Some(Action::SelectNext)
    );
    assert_eq!(
        ui.keys.action(key('q', KeyModifiers::NONE)),
        Some(Action::Quit),
        "the defaults stay"
    );
    assert!(ui.theme.light);
    assert_eq!(
        ui.theme.phase_color(Phase::Forward),
        Color::Rgb(0x30, 0x60, 0xff)
    );
    // The light palette has no white phase (metrics is white on a dark terminal).
    assert_ne!(ui.theme.phase_color(Phase::Metrics), Color::White);
    // The help overlay lists the bound keys.
    let mut app = app_of(starved());
    app.keys = ui.keys.clone();
    app.help = true;
    let help = screen(&app, 100, 48, ui.theme, LIVE);
    assert!(help.contains("x  quit (ui.toml)"), "{help}");

    for (text, says) in [
        ("[keys]\nquitt = \"x\"\n", "[keys] has no action 'quitt'"),
        ("[keys]\nquit = \"xy\"\n", "quit = 'xy' is not a key"),
        (
            "[colors]\nforward = \"blurple\"\n",
            "forward = 'blurple' is not a colour",
        ),
        ("[colors]\ntheme = \"sepia\"\n", "use \"light\" or \"dark\""),
        ("[keys\n", "ui.toml: line 1, column 6: "),
        ("[colours]\n", "unknown field `colours`"),
        (
            "[keys]\nquit = 5\n",
            "ui.toml: line 2, column 8: a key in [keys] is given in quotes",
        ),
    ] {
        let e = format!("{:#}", parse(text, path, true).unwrap_err());
        assert!(!e.contains("OneOrMany"), "a type name leaked: {e}");
        assert!(
            e.contains("/home/u/.config/dflash-top/ui.toml") && e.contains(says),
            "{e}"
        );
    }
    // NO_COLOR wins over the file.
    assert!(
        !parse("[colors]\ntheme = \"light\"\n", path, false)
            .unwrap()
            .theme
            .color
    );
}

#[test]
fn a_click_selects_the_thread_under_it_and_the_wheel_moves_the_selection() {
    use crossterm::event::{MouseButton, MouseEvent, MouseEventKind};
    let (ctl, _t) = controls(false);
    let mut app = app_of(starved());
    let mouse = |kind, row| MouseEvent {
        kind,
        column: 5,
        row,
        modifiers: crossterm::event::KeyModifiers::NONE,
    };
    for view in [View::Threads, View::Timeline] {
        app.update(Action::ShowView(view as usize), &ctl);
        let s = screen(&app, 120, 30, Theme::from_color(true), LIVE);
        let row = s.lines().position(|l| l.starts_with("│target-0")).unwrap() as u16;
        app.on_mouse(mouse(MouseEventKind::Down(MouseButton::Left), row), &ctl);
        assert_eq!(app.selected.as_deref(), Some("target-0"), "{view:?}: {s}");
        app.on_mouse(mouse(MouseEventKind::ScrollDown, row), &ctl);
        assert_eq!(app.selected.as_deref(), Some("drafter-0"));
        // A click on no thread keeps the selection.
        app.on_mouse(mouse(MouseEventKind::Down(MouseButton::Left), 0), &ctl);
        assert_eq!(app.selected.as_deref(), Some("drafter-0"));
        app.update(Action::Back, &ctl);
    }
}

#[test]
fn a_lane_cell_holds_both_half_columns_colours_in_each_theme() {
    use dflash_top::tui::panels::timeline::{draw_lane, Palette};
    use ratatui::buffer::Buffer;
    use ratatui::layout::Rect;
    use ratatui::style::Style;
    use Phase::*;
    // Eight half-columns: forward|backward, hs_wait|hs_wait, nothing|loss, nothing|nothing.
    let columns = [
        Some(Forward),
        Some(Backward),
        Some(HsWait),
        Some(HsWait),
        None,
        Some(Loss),
        None,
        None,
    ];
    for light in [false, true] {
        let theme = Theme {
            light,
            ..Theme::from_color(true)
        };
        let mut buf = Buffer::empty(Rect::new(0, 0, 6, 2));
        draw_lane(&mut buf, 1, 0, 2, &columns, &Palette::new(theme));
        let c = |p| theme.phase_color(p);
        let mut want = Buffer::with_lines([" ▌▒▐  ", " ▌▒▐  "]);
        for y in 0..2 {
            want[(1, y)].set_style(Style::default().fg(c(Forward)).bg(c(Backward)));
            want[(2, y)].set_style(Style::default().fg(c(HsWait)));
            want[(3, y)].set_style(Style::default().fg(c(Loss)));
        }
        assert_eq!(buf, want, "light {light}");
    }
    // The light palette's own colours where the dark one washes out on white.
    let light = Theme {
        light: true,
        ..Theme::from_color(true)
    };
    use ratatui::style::Color;
    assert_eq!(light.phase_color(Anchors), Color::Indexed(130));
    assert_eq!(light.phase_color(HsWait), Color::Indexed(166));
    assert_eq!(light.phase_color(Metrics), Color::Black);
    // Without colour: one column a cell, the phase's glyph, no style.
    let mut buf = Buffer::empty(Rect::new(0, 0, 3, 1));
    let plain = Theme::from_color(false);
    draw_lane(&mut buf, 0, 0, 1, &columns[..3], &Palette::new(plain));
    assert_eq!(buf, Buffer::with_lines(["FB~"]));
}

/// A run that ended while its last snapshot read `stalled`: the screen says `finished`, every
/// thread `exited`, the summary panel names the files; a later snapshot with no new step (the
/// hub goes on until the front-end quits) moves nothing.
#[test]
fn a_finished_run_says_so_and_stays_at_its_last_window() {
    use dflash_top::summary::RunInfo;
    let mut last = stalled().remove(0);
    last.train.tokens_total = 2_400_000;
    last.elapsed_s = 120.0;
    let mut app = app_of(vec![last.clone()]);
    app.run_info = RunInfo {
        start_step: 200,
        save_dir: None,
        recording: Some("runs/tiny.rec".into()),
        steps: None,
        model: Some("qwen3-32b · target fp8 · moments bf16".into()),
    };
    app.finished = true;
    app.end_run();
    let summary = app.summary.clone().expect("a summary once the run ended");
    assert_eq!(summary.steps(), 1000);
    let before = screen(&app, 160, 45, Theme::from_color(true), LIVE);
    // The hub's next snapshot: same step, the bars a window later, a stall named.
    let mut later = last;
    later.elapsed_s += 20.0;
    later.seq += 1;
    for t in &mut later.threads {
        t.w1.wall_ns *= 2;
    }
    app.on_snapshot(Arc::new(later));
    let after = screen(&app, 160, 45, Theme::from_color(true), LIVE);
    assert_eq!(before, after, "the screen stays at the run's last window");
    assert!(before.contains(" FINISHED "), "{before}");
    assert!(before.contains("  finished"), "{before}");
    assert!(!before.contains("stalled"), "{before}");
    assert!(!before.contains("RUNNING"), "{before}");
    for name in ["loader", "target-0", "drafter-0"] {
        let row = before
            .lines()
            .find(|l| l.starts_with(&format!("│{name}")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{before}"));
        assert!(row.contains("exited"), "{row}");
    }
    assert!(before.contains("run finished"), "{before}");
    assert!(before.contains("1000 (step 200 → 1200)"), "{before}");
    assert!(before.contains("runs/tiny.rec"), "{before}");
    assert!(before.contains("none (no --save-dir)"), "{before}");
    let second = before.lines().nth(1).unwrap();
    assert!(
        second.ends_with("qwen3-32b · target fp8 · moments bf16"),
        "what trains, on the header's second line: {second}"
    );
    insta::assert_snapshot!("finished_1_overview_160x45", before);
    insta::assert_snapshot!(
        "finished_1_overview_80x24",
        screen(&app, 80, 24, Theme::from_color(true), LIVE)
    );
}

/// Profiling went off at 01:11 (run clock) and stayed off: the 1 s and 10 s windows hold no
/// phase time, steps go on; the threads keep their CPU and the kernel's state (the loader is
/// asleep on its full queue, not "working in other").
fn profiling_off() -> Vec<Snapshot> {
    let mut on = starved_snapshot();
    on.seq = 6;
    on.elapsed_s = 71.0;
    let mut s = starved_snapshot();
    s.profiling = false;
    for t in &mut s.threads {
        // No mark moves the phase: it reads `other`, the thread `working`.
        t.phase = Phase::Other;
        t.state = ThreadState::Working;
        t.w1.clear_phases();
        t.w10.clear_phases();
    }
    vec![on, s]
}

#[test]
fn profiling_off_shows_kernel_states_and_says_since_when_instead_of_zeros() {
    let (ctl, _t) = controls(false);
    let mut app = app_of(profiling_off());
    assert_eq!(
        app.profiling_off_since,
        Some(83.0),
        "first seen off at 83 s"
    );
    // Seen off since an earlier snapshot: the time it went off stays.
    let mut later = profiling_off().remove(1);
    later.seq = 8;
    later.elapsed_s = 84.0;
    app.on_snapshot(Arc::new(later));
    assert_eq!(app.profiling_off_since, Some(83.0));
    let badges = Badges {
        profiling: false,
        ..LIVE
    };
    app.update(Action::ShowView(View::Threads as usize), &ctl);
    let threads = screen(&app, 120, 30, Theme::from_color(false), badges);
    let row = |s: &str, name: &str| -> String {
        s.lines()
            .find(|l| l.starts_with(&format!("│{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{s}"))
            .to_string()
    };
    let loader = row(&threads, "loader");
    assert!(
        loader.contains(" off ") && loader.contains("asleep"),
        "{loader}"
    );
    assert!(
        !loader.contains("working") && !loader.contains("other"),
        "{loader}"
    );
    assert!(row(&threads, "target-0").contains("running"), "{threads}");
    assert!(loader.contains(" 97 "), "CPU still measured: {loader}");
    assert!(!loader.contains("0.0 "), "no zero ms/step: {loader}");
    assert!(
        threads.contains("profiling off since 00:01:23"),
        "{threads}"
    );
    app.update(Action::ShowView(View::Overview as usize), &ctl);
    let over = screen(&app, 120, 30, Theme::from_color(false), badges);
    assert!(!over.contains("no steps"), "{over}");
    assert!(
        row(&over, "loader").contains("profiling off since 00:01:23 · 12.0 step/s"),
        "{over}"
    );
    assert!(
        over.contains("target-bound (queues only)"),
        "the verdict says what it rests on: {over}"
    );
    // No queue between known stages: nothing to judge by.
    let mut bare = profiling_off().remove(1);
    bare.queues.clear();
    let none = screen(
        &app_of(vec![bare]),
        120,
        30,
        Theme::from_color(false),
        badges,
    );
    assert!(
        none.contains("verdict unknown: profiling off, no queues to judge by"),
        "{none}"
    );
    assert!(!none.contains("target-bound"), "{none}");
    for view in [View::Overview, View::Threads, View::Phases] {
        app.update(Action::ShowView(view as usize), &ctl);
        for (w, h) in [(80u16, 24u16), (160, 40)] {
            let title = view.title().replace(' ', "_");
            let s = screen(&app, w, h, Theme::from_color(true), badges);
            insta::assert_snapshot!(format!("profiling_off_{title}_{w}x{h}"), s);
        }
    }
}

/// An attached viewer: a fourth header row names the watched process, since when, and that `q`
/// only detaches.
#[test]
fn an_attached_viewer_says_whom_it_watches_and_that_q_detaches() {
    let mut app = app_of(vec![starved_snapshot()]);
    app.attached = Some("attached to PID 4242 (python) since 14:03:12".into());
    let s = screen(&app, 100, 30, Theme::from_color(false), LIVE);
    let row = s.lines().nth(3).unwrap();
    assert_eq!(
        row,
        "⇄ attached to PID 4242 (python) since 14:03:12; q detaches (the run goes on)"
    );
    insta::assert_snapshot!("attached_1_overview_100x30", s);
    // Once the watched run ended, q only leaves.
    app.finished = true;
    let s = screen(&app, 100, 30, Theme::from_color(false), LIVE);
    assert!(s.lines().nth(3).unwrap().ends_with("; q leaves"), "{s}");
}

/// `app` drawn in colour on a `w` x `h` terminal: the cells with their styles.
fn drawn(app: &App, badges: Badges, w: u16, h: u16) -> ratatui::buffer::Buffer {
    let backend = ratatui::backend::TestBackend::new(w, h);
    let mut term = ratatui::Terminal::new(backend).unwrap();
    term.draw(|f| dflash_top::tui::view::draw(f, app, Theme::from_color(true), badges))
        .unwrap();
    term.backend().buffer().clone()
}

/// The foreground of the first cell of `text` on the screen (and its row), as drawn.
fn fg_of(
    app: &App,
    badges: Badges,
    w: u16,
    h: u16,
    text: &str,
    from_x: u16,
) -> ratatui::style::Style {
    let buf = drawn(app, badges, w, h);
    for y in 0..h {
        let row: Vec<String> = (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect();
        let line: String = row.concat();
        if let Some(at) = line.find(text) {
            let x = line[..at].chars().count() as u16;
            if x < from_x {
                continue;
            }
            return buf[(x, y)].style();
        }
    }
    panic!("{text} not on screen");
}

/// Issue 27: colour means state. Red is for faults only: a stall (and the stalled thread's own
/// label, wherever it shows), dropped records. A bound verdict is the pipeline's normal state
/// (not red); waiting threads are yellow; PAUSED, FROZEN and REPLAY are not red.
#[test]
fn red_means_a_fault_and_nothing_else() {
    use ratatui::style::Color;
    let (ctl, _t) = controls(false);
    // Drafter-bound, the default run's state: the verdict is not red, nor is a waiting thread.
    let app = app_of(blocked());
    let v = fg_of(&app, LIVE, 120, 36, "targets blocked on HS queue", 0);
    assert_ne!(v.fg, Some(Color::Red), "{v:?}");
    let waiting = fg_of(&app, LIVE, 200, 60, "waiting", 0);
    assert_eq!(waiting.fg, Some(Color::Yellow), "{waiting:?}");
    assert_eq!(
        fg_of(&app, LIVE, 120, 36, "dropped 0", 0).fg,
        Some(Color::DarkGray)
    );
    // PAUSED, FROZEN, REPLAY: states, not faults.
    let paused = app_of(paused());
    let p = Badges {
        paused: true,
        ..LIVE
    };
    assert_eq!(
        fg_of(&paused, p, 120, 36, "PAUSED", 0).fg,
        Some(Color::Yellow)
    );
    assert_eq!(
        fg_of(&app, REPLAY, 120, 36, "REPLAY", 0).fg,
        Some(Color::Cyan)
    );
    let mut frozen = app_of(blocked());
    frozen.update(Action::ToggleFreeze, &ctl);
    assert_eq!(
        fg_of(&frozen, LIVE, 120, 36, "FROZEN", 0).fg,
        Some(Color::Yellow)
    );
    // A stall: the verdict red, and the stalled thread's name red in every view that shows
    // it; the thread waiting on it yellow.
    let mut stuck = app_of(stalled());
    assert_eq!(
        fg_of(&stuck, LIVE, 120, 36, "stalled: target-0", 0).fg,
        Some(Color::Red)
    );
    for view in [0, 1, 2, 5] {
        stuck.update(Action::ShowView(view), &ctl);
        let buf = drawn(&stuck, LIVE, 160, 45);
        // The first cell of each "target-0" / "drafter-0" label below the header.
        let label = |who: &str| {
            (4..45u16)
                .find_map(|y| {
                    let line: String = (0..160).map(|x| buf[(x, y)].symbol().to_string()).collect();
                    line.find(who)
                        .map(|at| buf[(line[..at].chars().count() as u16, y)].style())
                })
                .unwrap()
        };
        assert_eq!(label("target-0").fg, Some(Color::Red), "view {view}");
        assert_ne!(label("drafter-0").fg, Some(Color::Red), "view {view}");
    }
    // Records dropped: red.
    let mut lost = stalled();
    lost[0].self_cost.dropped = 3;
    let lost = app_of(lost);
    assert_eq!(
        fg_of(&lost, LIVE, 120, 36, "dropped 3", 0).fg,
        Some(Color::Red)
    );
}

/// A queue's depth history reads as a line along its tops: each column's top cell a cyan bar,
/// the cells under it a dim shade (a queue full all window was a solid cyan wall).
#[test]
fn a_queue_history_draws_its_tops_bright_and_the_fill_under_them_dim() {
    use ratatui::style::Color;
    let (ctl, _t) = controls(false);
    let mut app = app_of(blocked());
    app.update(Action::ShowView(3), &ctl);
    let (w, h) = (120u16, 36u16);
    let buf = drawn(&app, LIVE, w, h);
    let bar = |x: u16, y: u16| "▁▂▃▄▅▆▇█".contains(buf[(x, y)].symbol());
    let shade = |x: u16, y: u16| buf[(x, y)].symbol() == "░";
    let (mut tops, mut unders) = (Vec::new(), Vec::new());
    for x in 0..w {
        for y in 0..h - 2 {
            // The top of a column of the history at least three cells tall.
            if bar(x, y) && shade(x, y + 1) && shade(x, y + 2) {
                tops.push(buf[(x, y)].fg);
                unders.push(buf[(x, y + 1)].fg);
                unders.push(buf[(x, y + 2)].fg);
            }
        }
    }
    assert!(
        tops.len() > 20,
        "columns of the depth history: {}",
        tops.len()
    );
    assert!(tops.iter().all(|c| *c == Color::Cyan), "{tops:?}");
    assert!(unders.iter().all(|c| *c == Color::DarkGray), "{unders:?}");
}

/// Issue 27: the queue gauge's label reads dark on its bright fill; the timeline's queue strips
/// have a legend in their own colours; optim and clip are not the light kin of forward and
/// backward.
#[test]
fn gauge_labels_read_on_their_fill_strips_have_a_legend_and_twin_colours_are_gone() {
    use ratatui::style::Color;
    let (ctl, _t) = controls(false);
    let mut app = app_of(blocked());
    let draw = |app: &App| drawn(app, LIVE, 120, 36);
    let find = |buf: &ratatui::buffer::Buffer, text: &str| {
        (0..36u16)
            .find_map(|y| {
                let line: String = (0..120).map(|x| buf[(x, y)].symbol().to_string()).collect();
                line.find(text)
                    .map(|at| (line[..at].chars().count() as u16, y))
            })
            .unwrap_or_else(|| panic!("{text} not drawn"))
    };
    // A full queue: its label lies on the fill, dark on yellow.
    app.update(Action::ShowView(3), &ctl);
    let buf = draw(&app);
    let (x, y) = find(&buf, "depth 4/4");
    let cell = &buf[(x, y)];
    assert_eq!(cell.fg, Color::Black, "{cell:?}");
    assert_ne!(cell.bg, Color::Reset, "{cell:?}");
    // The timeline's legend: the strips' glyphs in the strips' colours.
    app.update(Action::ShowView(5), &ctl);
    let buf = draw(&app);
    let (x, y) = find(&buf, "queue ·empty ▄depth █full");
    assert_eq!(buf[(x + 13, y)].fg, Color::Cyan, "the level");
    assert_eq!(buf[(x + 20, y)].fg, Color::Yellow, "full");
    // No twin colours among the drafter's working phases.
    let t = Theme::from_color(true);
    let working: Vec<Phase> = Role::Drafter
        .phases()
        .iter()
        .copied()
        .filter(|p| !p.is_wait())
        .collect();
    for p in &working {
        for q in &working {
            if p != q {
                assert_ne!(t.phase_color(*p), t.phase_color(*q), "{p:?} {q:?}");
            }
        }
    }
    let kin = |c: Color| match c {
        Color::LightBlue => Color::Blue,
        Color::LightGreen => Color::Green,
        Color::LightYellow => Color::Yellow,
        c => c,
    };
    assert_ne!(
        kin(t.phase_color(Phase::Optim)),
        kin(t.phase_color(Phase::Forward))
    );
    assert_ne!(
        kin(t.phase_color(Phase::Clip)),
        kin(t.phase_color(Phase::Backward))
    );
    assert_ne!(
        kin(t.phase_color(Phase::Loss)),
        kin(t.phase_color(Phase::Anchors))
    );
    // Red means a fault: no phase is drawn in it, waits included (they are orange), on either
    // background; a wait on a full queue and one on an empty queue are told apart.
    for light in [false, true] {
        let th = Theme {
            light,
            ..Theme::from_color(true)
        };
        for p in Phase::ALL {
            let c = th.phase_color(p);
            assert!(!matches!(c, Color::Red | Color::LightRed), "{p:?} is {c:?}");
        }
        assert_ne!(
            th.phase_color(Phase::HsWait),
            th.phase_color(Phase::HsPushWait)
        );
        assert_ne!(
            th.phase_color(Phase::GradSync),
            th.phase_color(Phase::PushWait)
        );
    }
}

/// Rows of a screen with nothing in them: blank, or only borders and spaces.
fn empty_rows(s: &str) -> usize {
    s.lines()
        .skip(3)
        .filter(|l| l.chars().all(|c| matches!(c, ' ' | '│')))
        .count()
}

/// Issue 27: every view uses its room at 120x36, 160x45 and 200x60 (no blank quarter beside
/// the queues, no rows of nothing under the queues, the timeline or the shares); at 80x24 a
/// view drops whole panels and columns rather than cut a label.
#[test]
fn every_view_uses_its_space_and_degrades_by_whole_panels() {
    let (ctl, _t) = controls(false);
    for (i, view) in View::ALL.iter().enumerate() {
        // The queues view where both queues hold items (an empty queue's depth history is
        // rightly blank), the others where every thread has steps to show.
        let mut app = app_of(if *view == View::Queues {
            blocked()
        } else {
            starved()
        });
        app.update(Action::ShowView(i), &ctl);
        for (w, h) in [(120u16, 36u16), (160, 45), (200, 60)] {
            let s = screen(&app, w, h, Theme::from_color(true), LIVE);
            // The warnings view is a list (the warnings in force, then the rules): its length
            // is its content, as a log's is.
            if *view == View::Warnings {
                assert!(s.contains("queue_jitter") && s.contains("quiet"), "{s}");
                continue;
            }
            assert!(
                empty_rows(&s) <= 3,
                "{view:?} at {w}x{h}: {} empty rows\n{s}",
                empty_rows(&s)
            );
        }
        let s = screen(&app, 80, 24, Theme::from_color(true), LIVE);
        // A table's header is whole words; the queue numbers end with the item age.
        if let Some(head) = s.lines().find(|l| l.starts_with("│thread")) {
            let words: Vec<&str> = head.split(['│', ' ']).filter(|w| !w.is_empty()).collect();
            for word in words.iter().take_while(|w| **w != "loader") {
                let known = [
                    "thread", "role", "dev", "cpu%", "phase", "state", "os", "step/s", "ms/step",
                ];
                assert!(
                    known.contains(&word.trim_end_matches('▼')),
                    "{view:?}: cut header {word}: {head}"
                );
            }
        }
        if *view == View::Queues || *view == View::Overview {
            assert!(s.matches(" age ").count() >= 2, "{view:?}: {s}");
        }
        if *view == View::Phases {
            assert!(
                s.contains("  hs_wait 45.0ms 56%"),
                "the drafter's detail: {s}"
            );
        }
    }
}

/// Issue 27: numbers keep their width and one unit: a 20 s step fits where an 80 ms one does,
/// the timeline's axis is in one unit, the tok/s axis has no decimals, lane labels are whole
/// words, and a run with --steps shows `step 150/300` with its ETA.
#[test]
fn units_fit_their_columns_and_a_run_with_steps_shows_its_eta() {
    use dflash_top::summary::RunInfo;
    use dflash_top::tui::panels::phases::fmt_ms;
    use dflash_top::tui::panels::timeline::fmt_offset;
    for (ms, want) in [
        (80.04, "80.0ms"),
        (999.9, "999.9ms"),
        (20391.5, "20.39s"),
        (125_000.0, "2.1m"),
    ] {
        assert_eq!(fmt_ms(ms), want);
        assert!(fmt_ms(ms).len() <= 7);
    }
    // Each zoom's axis marks in one unit, with the decimals its quarters need.
    for (width, marks) in [
        (0.25, ["-250ms", "-188ms", "-125ms", "-62ms"]),
        (2.0, ["-2.0s", "-1.5s", "-1.0s", "-0.5s"]),
        (5.0, ["-5.00s", "-3.75s", "-2.50s", "-1.25s"]),
        (10.0, ["-10.0s", "-7.5s", "-5.0s", "-2.5s"]),
    ] {
        let got: Vec<String> = (0..4)
            .map(|k| fmt_offset(width * (4 - k) as f64 / 4.0, width))
            .collect();
        assert_eq!(got, marks, "{width}");
    }
    let (ctl, _t) = controls(false);
    let mut app = app_of(starved());
    app.update(Action::ShowView(4), &ctl);
    let s = screen(&app, 120, 36, Theme::from_color(true), LIVE);
    assert!(s.contains("│6210│") || s.contains("│6210 "), "{s}");
    assert!(!s.contains("6210.00"), "{s}");
    // Lane labels whole at both widths.
    app.update(Action::ShowView(5), &ctl);
    for w in [80, 200] {
        let s = screen(&app, w, 30, Theme::from_color(true), LIVE);
        assert!(s.contains("│push_wait"), "{s}");
        assert!(!s.contains("│push_ ") && !s.contains("│hs_w "), "{s}");
    }
    // --steps 300: 50 steps in the last 10 s leave 150 at 5 a second.
    let mut app = App::new();
    app.run_info = RunInfo {
        steps: Some(300),
        ..RunInfo::default()
    };
    for k in 0..=10u64 {
        let mut s = starved_snapshot();
        s.elapsed_s = 20.0 + k as f64;
        s.train.step = 100 + 5 * k;
        app.on_snapshot(Arc::new(s));
    }
    assert_eq!(app.progress(), Some((150, 300, Some(30.0))));
    let s = screen(&app, 120, 36, Theme::from_color(true), LIVE);
    assert!(
        s.starts_with("dflash-top step 150/300 ETA 0:30  tok/s"),
        "{s}"
    );
    let s = screen(&app, 80, 24, Theme::from_color(true), LIVE);
    assert!(s.starts_with("step 150/300 ETA 0:30  tok/s"), "{s}");
    assert!(s.lines().next().unwrap().ends_with("00:00:30"), "{s}");
}
