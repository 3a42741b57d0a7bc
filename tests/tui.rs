//! The front-end without a terminal: actions and state, panels in buffers, whole screens as
//! snapshots, the UI loop on a TestBackend. Everything renders from scripted snapshots.

use crossbeam_channel::unbounded;
use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use dflash_top::telemetry::names::Names;
use dflash_top::telemetry::snapshot::*;
use dflash_top::telemetry::verdict::Verdict;
use dflash_top::telemetry::{GpuTiming, Phase, Role, Telemetry, N_PHASES};
use dflash_top::tui::app::App;
use dflash_top::tui::choices::View;
use dflash_top::tui::keys::action_for;
use dflash_top::tui::keys::Action;
use dflash_top::tui::panels::phases::{bar_cells, phase_parts};
use dflash_top::tui::panels::Badges;
use dflash_top::tui::theme::Theme;
use dflash_top::tui::view::draw;
use dflash_top::tui::{badges, run_loop, EngineControls, ReplayControls};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn window(ms: &[(Phase, u64)], steps: u64) -> PhaseWindow {
    let mut phase_ns = [0u64; N_PHASES];
    for (p, v) in ms {
        phase_ns[p.index()] = v * 1_000_000 * steps;
    }
    PhaseWindow {
        steps,
        wall_ns: phase_ns.iter().sum(),
        phase_ns,
        phase_steps: steps as f64,
        tokens: (steps * 512) as f64,
        span_ns: 1_000_000_000,
        ..Default::default()
    }
}

fn thread(name: &str, role: Role, phase: Phase, w: PhaseWindow) -> ThreadView {
    ThreadView {
        name: name.into(),
        role,
        device: "cpu".into(),
        tid: 100,
        cpu_pct: Some(97.0),
        phase,
        phase_s: 0.2,
        state: if phase.is_wait() {
            ThreadState::Waiting
        } else {
            ThreadState::Working
        },
        os_state: Some(if phase.is_wait() { 'S' } else { 'R' }),
        w1: w,
        w10: w,
        run: w,
        sizes: None,
    }
}

/// The hub's clock in the scripted snapshots.
pub const NOW_NS: u64 = 83_000_000_000;

/// Drafters starved: targets are slow, the HS queue is empty.
pub fn starved_snapshot() -> Snapshot {
    let loader = window(&[(Phase::Pack, 2), (Phase::PushWait, 78)], 12);
    let target = window(
        &[(Phase::H2d, 1), (Phase::Forward, 75), (Phase::HsPack, 4)],
        12,
    );
    let drafter = window(
        &[
            (Phase::HsWait, 45),
            (Phase::Anchors, 2),
            (Phase::Forward, 12),
            (Phase::Loss, 5),
            (Phase::Backward, 14),
            (Phase::Optim, 2),
        ],
        12,
    );
    Snapshot {
        seq: 7,
        elapsed_s: 83.0,
        now_ns: NOW_NS,
        train: TrainView {
            step: 1200,
            loss: Some(3.25),
            tau: Some(2.4),
            lr: Some(5.5e-4),
            grad_norm: Some(0.8),
            skipped_nonfinite: 0,
            slot_acc: vec![0.0, 0.7, 0.5],
            tokens_total: 600_000,
            tok_per_s_1s: 6144.0,
            tok_per_s_10s: 6000.0,
        },
        profiling: true,
        gpu_timing: Some(GpuTiming::Async),
        paused: false,
        verdict: Verdict::TargetBound,
        stall: None,
        threads: vec![
            thread("loader", Role::Loader, Phase::PushWait, loader),
            thread("target-0", Role::Target, Phase::Forward, target),
            thread("drafter-0", Role::Drafter, Phase::HsWait, drafter),
        ],
        groups: vec![
            ThreadGroupView {
                name: "dflash-top".into(),
                count: 3,
                cpu_pct: 4.0,
                owner: None,
                states: vec![('S', 3)],
            },
            ThreadGroupView {
                name: "target-0".into(),
                count: 2,
                cpu_pct: 150.0,
                owner: Some("target-0".into()),
                states: vec![('R', 2)],
            },
        ],
        cpu_note: None,
        memory: Some(MemoryView {
            rss_mib: 1536,
            host_used_mib: 40 * 1024,
            host_total_mib: 128 * 1024,
        }),
        queues: vec![
            QueueView {
                name: "batch".into(),
                producers: "loader".into(),
                consumers: "target".into(),
                capacity: 4,
                depth: 4,
                min_depth: 3,
                max_depth: 4,
                mean_depth: 3.9,
                full_share: 0.95,
                push_per_s: 12.0,
                pop_per_s: 12.0,
                mean_age_ms: 300.0,
                producer_wait_share: 0.97,
                history: vec![4.0; 20],
                blocking: true,
                ..Default::default()
            },
            QueueView {
                name: "hs".into(),
                producers: "target".into(),
                consumers: "drafter".into(),
                capacity: 2,
                empty_share: 0.98,
                push_per_s: 12.0,
                pop_per_s: 12.0,
                mean_age_ms: 0.5,
                consumer_wait_share: 0.56,
                history: vec![0.0; 20],
                starving: true,
                ..Default::default()
            },
        ],
        gpus: GpuPanel::Absent("no NVIDIA GPU (NVML not found)".into()),
        cupti: None,
        allocator: Vec::new(),
        stage_ratio_flops: None,
        loss_history: (0..40).map(|i| (i as f64, 8.0 - i as f64 * 0.1)).collect(),
        tok_history: (0..40)
            .map(|i| (i as f64, 6000.0 + (i % 5) as f64 * 50.0))
            .collect(),
        self_cost: SelfCost {
            marks_per_s: 250.0,
            ns_per_mark: 12.0,
            snapshot_us: 40.0,
            dropped: 0,
            spans_dropped: 0,
        },
        status: None,
        alerts: Vec::new(),
        steps: Vec::new(),
        warnings: Vec::new(),
        ranks: Vec::new(),
        names: Default::default(),
        sync_sites: Vec::new(),
    }
}

/// Presses `e` with the working directory in a new temporary one (where the trace goes), one
/// test at a time (the working directory is the process's).
pub fn export_in(app: &mut App) -> tempfile::TempDir {
    static CWD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = CWD.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let here = std::env::current_dir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    app.update(Action::ExportTrace, &ReplayControls);
    std::env::set_current_dir(here).unwrap();
    dir
}

pub fn controls(can_save: bool) -> (EngineControls, Telemetry) {
    let t = Telemetry::new();
    (EngineControls::new(&t, can_save), t)
}

fn key(c: KeyCode) -> KeyEvent {
    KeyEvent::new(c, KeyModifiers::NONE)
}

pub fn screen(app: &App, w: u16, h: u16, theme: Theme, badges: Badges) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| draw(f, app, theme, badges)).unwrap();
    let buf = term.backend().buffer().clone();
    (0..h)
        .map(|y| {
            (0..w)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub const LIVE: Badges = Badges {
    profiling: true,
    gpu_timing: GpuTiming::Async,
    paused: false,
    live: true,
    replay: None,
};

#[test]
fn keys_map_to_actions() {
    assert_eq!(
        action_for(key(KeyCode::Char('p'))),
        Some(Action::ToggleProfiling)
    );
    assert_eq!(
        action_for(key(KeyCode::Char(' '))),
        Some(Action::TogglePause)
    );
    assert_eq!(action_for(key(KeyCode::Tab)), Some(Action::NextView));
    assert_eq!(
        action_for(key(KeyCode::Char('3'))),
        Some(Action::ShowView(2))
    );
    assert_eq!(
        action_for(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
        Some(Action::QuitNow)
    );
    assert_eq!(action_for(key(KeyCode::Esc)), Some(Action::Back));
    assert_eq!(action_for(key(KeyCode::Char('q'))), Some(Action::Quit));
    assert_eq!(action_for(key(KeyCode::Char('l'))), Some(Action::NextView));
    assert_eq!(action_for(key(KeyCode::Left)), Some(Action::PrevView));
    assert_eq!(
        action_for(key(KeyCode::Char('c'))),
        Some(Action::Checkpoint)
    );
    assert_eq!(action_for(key(KeyCode::Char('z'))), None);
}

#[test]
fn actions_change_the_engine_switches_and_the_app() {
    let (ctl, t) = controls(false);
    let mut app = App::new();
    app.update(Action::ToggleProfiling, &ctl);
    // Every change goes through the one control path: the hub applies it.
    assert!(
        ctl.switches.profiling(),
        "not applied before the hub sees it"
    );
    t.apply_pending();
    assert!(!ctl.switches.profiling());
    assert_eq!(app.note.as_deref(), Some("profiling off"));
    for want in [GpuTiming::Events, GpuTiming::Sync, GpuTiming::Async] {
        app.update(Action::CycleGpuTiming, &ctl);
        t.apply_pending();
        assert_eq!(
            ctl.switches.gpu_timing(),
            want,
            "g cycles async/events/sync"
        );
    }
    app.update(Action::TogglePause, &ctl);
    t.apply_pending();
    assert!(ctl.switches.paused());
    app.update(Action::Checkpoint, &ctl);
    t.apply_pending();
    assert!(
        app.note.as_deref().unwrap().contains("--save-dir"),
        "no save dir: says so"
    );
    assert!(!t.requests().checkpoint_now.load(Ordering::SeqCst));
    let (ctl2, t2) = controls(true);
    app.update(Action::Checkpoint, &ctl2);
    t2.apply_pending();
    assert!(t2.requests().checkpoint_now.load(Ordering::SeqCst));

    app.update(Action::NextView, &ctl);
    assert_eq!(app.view, View::Threads);
    app.update(Action::PrevView, &ctl);
    app.update(Action::PrevView, &ctl);
    assert_eq!(app.view, View::Warnings, "the views wrap around");
    app.update(Action::ShowView(2), &ctl);
    assert_eq!(app.view, View::Phases);
    app.update(Action::ToggleHelp, &ctl);
    assert!(app.help);
    app.update(Action::Quit, &ctl);
    assert!(!app.quit, "a live run asks once");
    assert!(app.note.as_deref().unwrap().contains("q again"));
    app.update(Action::Quit, &ctl);
    assert!(app.quit);
}

/// A live run's question names the keys that quit: a key a UI config binds to quit, then `q`
/// (the defaults stay) unless the config gave `q` to another action.
#[test]
fn the_quit_question_names_the_configured_quit_key() {
    let ask = |toml: &str| {
        let cfg =
            dflash_top::tui::settings::parse(toml, std::path::Path::new("ui.toml"), false).unwrap();
        let mut app = App::new();
        app.keys = cfg.keys;
        let (ctl, _t) = controls(false);
        app.update(Action::Quit, &ctl);
        assert!(!app.quit, "a live run asks once");
        app.note.unwrap()
    };
    assert!(ask("").starts_with("q again to stop training"));
    assert!(ask("[keys]\nquit = \"x\"\n").starts_with("x or q again to stop training"));
    let taken = ask("[keys]\nquit = \"x\"\nprofiling = \"q\"\n");
    assert!(taken.starts_with("x again to stop training"), "{taken}");
}

#[test]
fn esc_closes_the_overlay_and_never_quits() {
    let (ctl, _t) = controls(false);
    let mut app = App::new();
    app.update(Action::ToggleHelp, &ctl);
    app.update(Action::Back, &ctl);
    assert!(!app.help, "esc closed the help");
    app.update(Action::Back, &ctl);
    assert!(!app.quit, "esc never quits");
    // Another key between two q's disarms the question.
    app.update(Action::Quit, &ctl);
    app.update(Action::NextView, &ctl);
    app.update(Action::Quit, &ctl);
    assert!(!app.quit);
    app.update(Action::QuitNow, &ctl);
    assert!(app.quit, "ctrl-c quits at once");
    // A replay, or a run that has finished, leaves on the first q.
    let mut replay = App::new();
    replay.update(Action::Quit, &ReplayControls);
    assert!(replay.quit);
    let mut done = App::new();
    done.finished = true;
    done.update(Action::Quit, &ctl);
    assert!(done.quit);
}

#[test]
fn freeze_keeps_the_shown_snapshot() {
    let (ctl, _) = controls(false);
    let mut app = App::new();
    let mut a = starved_snapshot();
    a.seq = 1;
    app.on_snapshot(Arc::new(a));
    app.update(Action::ToggleFreeze, &ctl);
    let mut b = starved_snapshot();
    b.seq = 2;
    app.on_snapshot(Arc::new(b));
    assert_eq!(app.shown().unwrap().seq, 1);
    app.update(Action::ToggleFreeze, &ctl);
    assert_eq!(app.shown().unwrap().seq, 2);
}

/// A frozen display keeps the history as it was: a thread's CPU samples (the detail's
/// sparkline) and the verdict marks stop with the snapshot, and come back live on unfreezing.
#[test]
fn freeze_keeps_the_cpu_history_and_verdicts_with_the_snapshot() {
    let (ctl, _) = controls(false);
    let mut app = App::new();
    let first = starved_snapshot();
    let name = first.threads[0].name.clone();
    app.on_snapshot(Arc::new(first));
    app.update(Action::ToggleFreeze, &ctl);
    let mut later = starved_snapshot();
    later.seq = 8;
    later.now_ns += 1_000_000_000;
    later.verdict = Verdict::Balanced;
    app.on_snapshot(Arc::new(later));
    let cpu_samples = |app: &App| app.shown_history().cpu.get(&name).map_or(0, |h| h.len());
    assert_eq!(
        cpu_samples(&app),
        1,
        "frozen: one sample, the first snapshot's"
    );
    assert_eq!(app.shown_history().verdicts.len(), 1);
    app.update(Action::ToggleFreeze, &ctl);
    assert_eq!(cpu_samples(&app), 2, "live again: both samples");
    assert_eq!(
        app.shown_history().verdicts.len(),
        2,
        "and the verdict change"
    );
}

#[test]
fn bar_cells_split_the_width_by_share() {
    let w = window(
        &[
            (Phase::HsWait, 50),
            (Phase::Forward, 25),
            (Phase::Backward, 25),
        ],
        1,
    );
    let cells = bar_cells(&w, Role::Drafter.phases(), 20);
    assert_eq!(
        cells,
        vec![
            (Phase::HsWait, 10),
            (Phase::Forward, 5),
            (Phase::Backward, 5)
        ]
    );
    let odd = window(
        &[(Phase::Forward, 1), (Phase::Backward, 1), (Phase::Optim, 1)],
        1,
    );
    let cells = bar_cells(&odd, Role::Drafter.phases(), 10);
    assert_eq!(
        cells.iter().map(|c| c.1).sum::<usize>(),
        10,
        "always fills the bar"
    );
    assert!(bar_cells(&PhaseWindow::default(), Role::Drafter.phases(), 10).is_empty());
}

#[test]
fn overview_shows_starvation_at_a_glance() {
    let mut app = App::new();
    app.on_snapshot(Arc::new(starved_snapshot()));
    let s = screen(&app, 120, 36, Theme::from_color(true), LIVE);
    assert!(s.contains("drafters starved: target-bound"), "{s}");
    assert!(s.contains("drafters starve: wait 56% on empty"), "{s}");
    assert!(s.contains("loaders blocked: wait 97% on full"), "{s}");
    assert!(s.contains("no NVIDIA GPU (NVML not found)"));
    assert!(s.contains("PROF on"));
    insta::assert_snapshot!("overview_starved", s);
}

#[test]
fn every_view_renders_at_the_minimum_size() {
    let mut app = App::new();
    app.on_snapshot(Arc::new(starved_snapshot()));
    let (ctl, _) = controls(false);
    for i in 0..5 {
        app.update(Action::ShowView(i), &ctl);
        let s = screen(&app, 80, 24, Theme::from_color(true), LIVE);
        assert!(s.starts_with("dflash-top step 1200"), "view {i}: {s}");
        assert!(!s.contains("too small"));
    }
    app.update(Action::ShowView(2), &ctl);
    insta::assert_snapshot!(
        "phases_80x24",
        screen(&app, 80, 24, Theme::from_color(true), LIVE)
    );
    app.update(Action::ToggleHelp, &ctl);
    // One column at 80x24: j scrolls it.
    let mut help = String::new();
    for _ in 0..40 {
        help.push_str(&screen(&app, 80, 24, Theme::from_color(true), LIVE));
        app.update(Action::SelectNext, &ctl);
    }
    for k in ["space", "ctrl-c", "checkpoint", "freeze", "GPU timing"] {
        assert!(help.contains(k), "help lists {k}: {help}");
    }
}

/// Issue 26: a phase the producer counts (zero-code mode's host syncs) shows its entries per
/// step beside its time.
#[test]
fn a_counted_phase_shows_its_entries_per_step() {
    let mut w = window(&[(Phase::Forward, 10), (Phase::Metrics, 2)], 4);
    w.phase_n[Phase::Metrics.index()] = 6.0;
    let parts = phase_parts(&w, Role::Drafter.phases(), &Names::builtin());
    assert!(
        parts.contains(&"metrics 2.0ms 17% x1.5".to_string()),
        "{parts:?}"
    );
    assert!(
        parts.contains(&"forward 10.0ms 83%".to_string()),
        "{parts:?}"
    );
}

/// Issue 28: a phase where our engine read the device back shows its host syncs per step.
#[test]
fn a_phase_with_counted_host_syncs_shows_them_per_step() {
    let mut w = window(&[(Phase::Forward, 10), (Phase::Metrics, 2)], 4);
    w.host_syncs[Phase::Metrics.index()] = 4;
    let parts = phase_parts(&w, Role::Drafter.phases(), &Names::builtin());
    assert!(
        parts.contains(&"metrics 2.0ms 17% 1.0 sync".to_string()),
        "{parts:?}"
    );
    assert!(
        parts.contains(&"forward 10.0ms 83%".to_string()),
        "{parts:?}"
    );
}

/// Issue 28: the thread pane shows the thread's CUDA launches and syncs per step where CUPTI
/// counts them, and why not where it does not (the CPU, the run's reason).
#[test]
fn the_thread_pane_shows_cuda_calls_or_why_there_are_none() {
    let line = |snap: Snapshot| {
        let mut app = App::new();
        app.on_snapshot(Arc::new(snap));
        app.update(Action::ShowView(1), &ReplayControls);
        let s = screen(&app, 120, 36, Theme::from_color(false), LIVE);
        s.lines()
            .map(|l| l.trim_matches(|c| c == '│' || c == ' '))
            .find(|l| l.starts_with("cuda: ") || l.starts_with("cuda 10s: "))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no cuda line: {s}"))
    };
    let cpu = starved_snapshot();
    assert_eq!(line(cpu.clone()), "cuda: n/a: cpu");
    let mut gpu = cpu;
    for t in &mut gpu.threads {
        t.device = "cuda:0".into();
    }
    gpu.cupti = Some("libcupti not found".into());
    assert_eq!(line(gpu.clone()), "cuda: n/a: libcupti not found");
    gpu.cupti = None;
    for t in &mut gpu.threads {
        t.w10.cuda_steps = 10;
        t.w10.cuda_calls = dflash_top::telemetry::CudaCalls {
            launches: 4120,
            launch_ns: 31_000_000,
            sync_ns: 4_000_000,
        };
    }
    assert_eq!(
        line(gpu),
        "cuda 10s: 412 launches/step · 3.1 ms launching · 0.4 ms in syncs"
    );
}

/// Issue 41: the thread pane lists the thread's host syncs by call site, costliest first, a step
/// each; a thread with none known shows no such list.
#[test]
fn the_thread_pane_lists_host_syncs_by_call_site_costliest_first() {
    let screen_of = |snap: Snapshot| {
        let mut app = App::new();
        app.on_snapshot(Arc::new(snap));
        app.update(Action::ShowView(1), &ReplayControls);
        screen(&app, 120, 44, Theme::from_color(false), LIVE)
    };
    let mut snap = starved_snapshot();
    assert!(!screen_of(snap.clone()).contains("host syncs by call site"));
    let focused = snap.threads[0].name.clone();
    let site =
        |at: &str, op: &str, count: u64, ms: u64| dflash_top::telemetry::snapshot::SyncSite {
            thread: focused.clone(),
            at: at.into(),
            op: op.into(),
            count,
            ns: ms * 1_000_000,
            steps: 10,
        };
    snap.sync_sites = vec![
        site("train.py:88", ".cpu()", 10, 2),
        site("train.py:42", ".item()", 20, 13),
    ];
    let s = screen_of(snap);
    let lines: Vec<&str> = s
        .lines()
        .map(|l| l.trim_matches(|c| c == '│' || c == ' '))
        .collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("host syncs by call site"))
        .unwrap_or_else(|| panic!("{s}"));
    assert_eq!(lines[at + 1], "train.py:42 .item() x2.0 1.3ms", "{s}");
    assert_eq!(lines[at + 2], "train.py:88 .cpu() x1.0 0.2ms", "{s}");
}

/// Issue 26: numbers a pipeline never reported are shown as absent, never as zeros.
#[test]
fn training_numbers_never_reported_are_shown_as_absent() {
    let mut snap = starved_snapshot();
    snap.train.tau = None;
    snap.train.lr = None;
    let mut app = App::new();
    app.on_snapshot(Arc::new(snap));
    let s = screen(&app, 120, 36, Theme::from_color(true), LIVE);
    let header = s.lines().next().unwrap();
    assert!(
        header.contains("loss 3.250  tau –  lr –"),
        "absent tau and lr: {header}"
    );
}

#[test]
fn below_the_minimum_size_one_line_says_so() {
    let mut app = App::new();
    app.on_snapshot(Arc::new(starved_snapshot()));
    let s = screen(&app, 70, 20, Theme::from_color(true), LIVE);
    let lines: Vec<&str> = s.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 1, "{s}");
    assert!(
        lines[0].contains("too small: 70x20, dflash-top needs 80x24; enlarge it (q quits)"),
        "{s}"
    );
    // Narrower than the sentence: wrapped, never cut.
    let s = screen(&app, 30, 10, Theme::from_color(true), LIVE);
    let words: Vec<&str> = s.split_whitespace().collect();
    assert_eq!(
        words.join(" "),
        "too small: 30x10, dflash-top needs 80x24; enlarge it (q quits)",
        "{s}"
    );
}

#[test]
fn without_colour_phases_differ_by_glyph() {
    let mut app = App::new();
    app.on_snapshot(Arc::new(starved_snapshot()));
    let s = screen(&app, 120, 36, Theme::from_color(false), LIVE);
    let drafter_row = s
        .lines()
        .find(|l| l.contains("│drafter-0") && l.contains('~'))
        .expect("a drafter bar");
    // hs_wait '~', forward 'F', backward 'B' in the drafter's bar.
    assert!(
        drafter_row.contains("~~~") && drafter_row.contains("FF") && drafter_row.contains("BB"),
        "{drafter_row}"
    );
}

#[test]
fn the_loop_applies_keys_and_quits() {
    let (ctl, _t) = controls(false);
    let mut app = App::new();
    let (snap_tx, snap_rx) = unbounded();
    let (key_tx, key_rx) = unbounded();
    snap_tx.send(Arc::new(starved_snapshot())).unwrap();
    key_tx.send(Event::Key(key(KeyCode::Char('p')))).unwrap();
    key_tx.send(Event::Key(key(KeyCode::Char('2')))).unwrap();
    // A live run asks once: q, q.
    key_tx.send(Event::Key(key(KeyCode::Char('q')))).unwrap();
    key_tx.send(Event::Key(key(KeyCode::Char('q')))).unwrap();
    let mut term = Terminal::new(TestBackend::new(100, 30)).unwrap();
    run_loop(
        &mut term,
        &mut app,
        &ctl,
        &snap_rx,
        &key_rx,
        &|| None,
        Theme::from_color(true),
    )
    .unwrap();
    assert!(app.quit);
    _t.apply_pending();
    assert!(!ctl.switches.profiling(), "p reached the engine's switch");
    assert_eq!(app.view, View::Threads);
    let buf = term.backend().buffer().clone();
    let badges: String = (0..100).map(|x| buf[(x, 1)].symbol().to_string()).collect();
    assert!(
        badges.contains("PROF off"),
        "the screen shows the change: {badges}"
    );
}

#[test]
fn a_replay_says_the_engine_cannot_change_and_e_writes_a_trace() {
    use dflash_top::telemetry::snapshot::StepSpan;
    use dflash_top::tui::ReplayControls;
    let mut app = App::new();
    let mut snap = starved_snapshot();
    snap.steps = vec![StepSpan {
        thread: "drafter-0".into(),
        role: Role::Drafter,
        // Inside the timeline's span, which `e` exports.
        end_ns: NOW_NS - 2_000_000,
        wall_ns: 1_000_000,
        phases: vec![(Phase::Forward, 600_000), (Phase::Backward, 400_000)],
    }];
    app.on_snapshot(Arc::new(snap));
    app.update(Action::ToggleProfiling, &ReplayControls);
    assert_eq!(
        app.note.as_deref(),
        Some("replay: the engine cannot be changed")
    );
    let dir = export_in(&mut app);
    assert!(
        app.note
            .as_deref()
            .unwrap()
            .starts_with("trace of the last 10 s"),
        "{:?}",
        app.note
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn a_replay_shows_the_modes_it_recorded() {
    let mut app = App::new();
    let mut s = starved_snapshot();
    s.profiling = false;
    s.gpu_timing = Some(GpuTiming::Events);
    s.paused = true;
    app.on_snapshot(Arc::new(s));
    let b = badges(&ReplayControls, &app);
    assert!(!b.profiling);
    assert_eq!(b.gpu_timing, GpuTiming::Events);
    assert!(b.paused);
    assert!(!b.live);
    let text = screen(&app, 120, 30, Theme::from_color(true), b);
    assert!(text.contains("PROF off"), "{text}");
    assert!(text.contains("GPU events"), "{text}");
}

#[test]
fn no_gpu_timing_badge_on_the_cpu_and_missed_snapshots_are_counted() {
    let (ctl, _t) = controls(false);
    let mut app = App::new();
    let mut a = starved_snapshot();
    a.gpu_timing = None;
    a.seq = 1;
    app.on_snapshot(Arc::new(a.clone()));
    a.seq = 5;
    app.on_snapshot(Arc::new(a));
    assert_eq!(app.missed_snapshots, 3);
    let text = screen(&app, 120, 30, Theme::from_color(true), badges(&ctl, &app));
    assert!(!text.contains("GPU async"), "{text}");
    assert!(text.contains("+3 snaps"), "{text}");
}

#[test]
fn skipped_non_finite_steps_show_in_the_header() {
    let (ctl, _t) = controls(false);
    let mut app = App::new();
    let mut s = starved_snapshot();
    s.train.skipped_nonfinite = 3;
    app.on_snapshot(Arc::new(s));
    let text = screen(&app, 160, 30, Theme::from_color(true), badges(&ctl, &app));
    assert!(text.contains("non-finite steps skipped 3"), "{text}");
}

/// Issue 27: keys say what they did, and do not pretend. `g` with no GPU worker changes nothing,
/// says why, and is not in the help; `[` / `]` say when there is nothing further; `r` names what
/// it reset (a replay resets nothing, and says so).
#[test]
fn keys_say_what_they_did_and_nothing_more() {
    let (ctl, t) = controls(false);
    let mut cpu = starved_snapshot();
    cpu.gpu_timing = None;
    let mut app = App::new();
    app.on_snapshot(Arc::new(cpu));
    app.update(Action::CycleGpuTiming, &ctl);
    t.apply_pending();
    assert_eq!(ctl.switches.gpu_timing(), GpuTiming::Async, "unchanged");
    assert_eq!(
        app.note.as_deref(),
        Some("no GPU worker here: GPU timing modes do not apply")
    );
    app.update(Action::ToggleHelp, &ctl);
    let help = screen(&app, 100, 40, Theme::from_color(false), LIVE);
    assert!(!help.contains("GPU timing: async"), "{help}");
    assert!(help.contains("ctrl-c"), "{help}");
    let mut gpu = App::new();
    gpu.on_snapshot(Arc::new(starved_snapshot()));
    gpu.help = true;
    let help = screen(&gpu, 100, 40, Theme::from_color(false), LIVE);
    assert!(help.contains("GPU timing: async"), "{help}");
    app.update(Action::ToggleHelp, &ctl);

    // No steps kept: nothing earlier to pan to, and the frozen time is the latest.
    app.update(Action::PanBack, &ctl);
    assert_eq!(
        app.note.as_deref(),
        Some("timeline: no earlier history (the last 10 s of steps are kept)")
    );
    app.update(Action::PanForward, &ctl);
    assert_eq!(
        app.note.as_deref(),
        Some("timeline: already at the frozen time (f: live)")
    );

    app.update(Action::ResetWindows, &ctl);
    let note = app.note.clone().unwrap();
    assert!(
        note.contains("1s and 10s windows") && note.contains("run window's phase times"),
        "{note}"
    );
    app.update(Action::ResetWindows, &ReplayControls);
    assert_eq!(
        app.note.as_deref(),
        Some("replay: the windows are the recording's; r resets none")
    );
}

/// Issue 27: the help lists the views and explains every word on screen; where it does not fit
/// (80x24) j/k scroll it to the end and no further.
#[test]
fn help_lists_the_views_and_a_glossary_of_every_word_on_screen() {
    use dflash_top::tui::glossary::GLOSSARY;
    let (ctl, _t) = controls(false);
    let mut app = App::new();
    app.on_snapshot(Arc::new(starved_snapshot()));
    let plain = screen(&app, 200, 60, Theme::from_color(false), LIVE);
    // Words the screens show, each explained.
    let terms: Vec<&str> = GLOSSARY
        .iter()
        .flat_map(|s| s.1.iter().map(|w| w.0))
        .collect();
    for w in [
        "tau", "lr", "prof", "snap", "dropped", "os", "age", "h2d", "to gain",
    ] {
        assert!(
            terms.iter().any(|t| t.contains(w)),
            "{w} not in the glossary"
        );
    }
    for w in ["tau", "lr", "prof", "snap", "dropped", " os ", "age"] {
        assert!(plain.contains(w), "{w} is not on the overview: {plain}");
    }
    app.update(Action::ToggleHelp, &ctl);
    let wide = screen(&app, 200, 60, Theme::from_color(false), LIVE);
    for v in View::ALL {
        assert!(wide.contains(v.title()), "{v:?}: {wide}");
    }
    // Two columns at 200x60, one at 80x24: scrolled through, every term shows.
    let mut last = String::new();
    for (w, h) in [(200, 60), (80, 24)] {
        let mut seen = String::new();
        for _ in 0..200 {
            let s = screen(&app, w, h, Theme::from_color(false), LIVE);
            if s == last {
                break;
            }
            seen.push_str(&s);
            last = s;
            app.update(Action::SelectNext, &ctl);
        }
        for t in terms.iter().filter(|t| !t.is_empty()) {
            assert!(seen.contains(t), "{t} at {w}x{h}");
        }
        if w == 200 {
            app.update(Action::ToggleHelp, &ctl);
            app.update(Action::ToggleHelp, &ctl);
        }
    }
    assert!(app.help_scroll < 200, "the scroll stops at the end");
    assert!(
        last.contains("of --steps") || last.contains("placement"),
        "{last}"
    );
    // One step back from the end shows a different screen at once.
    app.update(Action::SelectPrev, &ctl);
    assert_ne!(screen(&app, 80, 24, Theme::from_color(false), LIVE), last);
    // Closing and opening starts at the top again.
    app.update(Action::ToggleHelp, &ctl);
    app.update(Action::ToggleHelp, &ctl);
    assert!(screen(&app, 80, 24, Theme::from_color(false), LIVE).contains("views"));
}

/// Issue 27: a tab bar names the views with the current one highlighted; narrow, the others
/// are their digits.
#[test]
fn the_tab_bar_shows_the_views_and_highlights_the_current_one() {
    use ratatui::style::Modifier;
    let (ctl, _t) = controls(false);
    let mut app = App::new();
    app.on_snapshot(Arc::new(starved_snapshot()));
    app.update(Action::ShowView(2), &ctl);
    for (w, all) in [(200u16, true), (80, false)] {
        let mut term = Terminal::new(TestBackend::new(w, 24)).unwrap();
        term.draw(|f| draw(f, &app, Theme::from_color(true), LIVE))
            .unwrap();
        let buf = term.backend().buffer().clone();
        let row: String = (0..w).map(|x| buf[(x, 2)].symbol().to_string()).collect();
        assert!(row.starts_with(" 1"), "{row}");
        for v in View::ALL {
            assert_eq!(
                row.contains(v.title()),
                all || v == View::Phases,
                "{w}: {row}"
            );
        }
        assert!(!row.contains("[3 phases]"), "{row}");
        // The current tab reversed, the others not.
        let at = row.find("3 phases").unwrap();
        let x = row[..at].chars().count() as u16;
        assert!(buf[(x, 2)].modifier.contains(Modifier::REVERSED));
        assert!(!buf[(1, 2)].modifier.contains(Modifier::REVERSED), "{row}");
        assert!(
            row.contains("prof 12"),
            "the profiler's cost still shows: {row}"
        );
        assert!(row.trim_end().ends_with("? help"), "{row}");
    }
}
