//! A replay steered by keys: seeking lands on the recorded time asked for (forward by running on,
//! backward by running again), the position bar and the end of the recording on screen, paused
//! and seeking as insta snapshots.

use super::tui::{screen, starved_snapshot};
use dflash_top::telemetry::snapshot::GpuPanel;
use dflash_top::telemetry::stages::StageTable;
use dflash_top::telemetry::switches::{GpuTiming, Timing};
use dflash_top::telemetry::{Snapshot, TrainMetrics};
use dflash_top::tui::app::App;
use dflash_top::tui::controls::Controls;
use dflash_top::tui::keys::Action;
use dflash_top::tui::panels::Badges;
use dflash_top::tui::theme::Theme;
use dflash_top::wire::protocol::*;
use dflash_top::wire::replay::{ReplayPos, Sim, Speed};
use std::cell::Cell;
use std::sync::Arc;

const T0: u64 = 5_000_000_000;
const MS: u64 = 1_000_000;

/// A recording of `secs` seconds: one drafter whose step k ends at k x 100 ms (the run's step
/// number k, its loss falling), a sample every 500 ms.
fn recording(secs: u64) -> Vec<Msg> {
    let mut msgs = vec![
        Msg::Hello(Hello {
            pid: 42,
            program: "dflash-top".into(),
            now_ns: T0,
            ns_per_mark: 12.0,
            stages: StageTable::builtin(),
            can_save: false,
            config: None,
            job: None,
            cupti: None,
            host: None,
        }),
        Msg::Thread(ThreadDecl {
            id: 0,
            name: "drafter-0".into(),
            stage: "drafter".into(),
            device: "cpu".into(),
            tid: 7,
        }),
    ];
    for k in 0..=secs * 10 {
        let now = T0 + k * 100 * MS;
        if k % 5 == 0 {
            msgs.push(Msg::Sample(Sample {
                now,
                prof: true,
                timing: GpuTiming::Async,
                paused: false,
                dropped: 0,
                live: Vec::new(),
                q: Vec::new(),
                alloc: Vec::new(),
                gpu: Vec::new(),
            }));
        }
        if k > 0 {
            msgs.push(Msg::Step(WireStep {
                th: 0,
                end: now,
                wall: 100 * MS,
                ph: vec![(2, 60 * MS), (5, 30 * MS)],
                prof: true,
                timing: Timing::Host,
                steps: 1,
                idle: 0,
                tok: 512,
                m: Some(TrainMetrics {
                    loss: Some(8.0 - k as f32 * 0.001),
                    step: k,
                    ..Default::default()
                }),
                n: Vec::new(),
                sy: Vec::new(),
                cu: None,
            }));
        }
    }
    msgs
}

fn last(v: &[Snapshot]) -> &Snapshot {
    v.last().expect("a snapshot at the place sought")
}

#[test]
fn seeking_lands_at_the_recorded_time_forward_and_back() {
    let mut sim = Sim::new(recording(60)).unwrap();
    assert_eq!(sim.duration_s(), 60.0);
    // Forward: at 30 s the 300th step (it ended at 30.0 s) has been counted, no later one.
    let got = sim.seek(30.0).unwrap();
    let s = last(&got);
    assert!((s.elapsed_s - 30.0).abs() < 1e-6, "{}", s.elapsed_s);
    assert_eq!(s.train.step, 300);
    assert_eq!(sim.position_s(), 30.0);
    // The 10 s before it come too (the timeline's span): 100 ticks.
    assert_eq!(got.len(), 100);
    assert!(
        (got[0].elapsed_s - 20.1).abs() < 1e-6,
        "{}",
        got[0].elapsed_s
    );
    let at_30 = s.now_ns;
    // Back: run again from the start, to 12 s; the snapshots' clock goes back too (the viewer
    // drops what it kept from later on).
    let s = sim.seek(12.0).unwrap();
    let s = last(&s);
    assert!((s.elapsed_s - 12.0).abs() < 1e-6, "{}", s.elapsed_s);
    assert_eq!(at_30 - s.now_ns, 18_000 * MS);
    assert_eq!(s.train.step, 120);
    // Playing on by a second: ten ticks, ten steps.
    let on = sim.play_to(13.0);
    assert_eq!(on.len(), 10);
    assert_eq!(last(&on).train.step, 130);
    // Past the end: the end.
    let end = sim.seek(600.0).unwrap();
    assert_eq!(last(&end).train.step, 600);
    assert!(sim.at_end());
    // A recording has no per-thread CPU: it says so rather than sample forever.
    let note = last(&end).cpu_note.clone().unwrap_or_default();
    assert!(note.contains("not in recordings"), "{note}");
}

/// Issue 30: samples carry the producer host's GPUs, so a recording holds them and a replay
/// shows them under the host that recorded them, at the reading of the moment sought; a
/// recording without them says so.
#[test]
fn a_replay_shows_the_recorded_gpus_under_their_host() {
    let mut msgs = recording(20);
    if let Msg::Hello(h) = &mut msgs[0] {
        h.host = Some("gpu-node-7".into());
    }
    for m in &mut msgs {
        if let Msg::Sample(s) = m {
            // The reading of the moment: util = the second it was read at.
            let util = ((s.now - T0) / 1_000_000_000) as u32;
            s.alloc = vec![WireAlloc {
                cuda: 0,
                reserved: 6 << 30,
                ..Default::default()
            }];
            s.gpu = vec![WireGpu {
                index: 0,
                cuda: Some(0),
                name: "NVIDIA H200".into(),
                util,
                used: 70_000,
                total: 143_771,
                ..Default::default()
            }];
        }
    }
    let mut sim = Sim::new(msgs).unwrap();
    let at = |sim: &mut Sim, s: f64| last(&sim.seek(s).unwrap()).gpus.clone();
    let GpuPanel::Present(g) = at(&mut sim, 12.2) else {
        panic!("no recorded GPUs")
    };
    assert_eq!(
        (
            g[0].host.as_deref(),
            g[0].cuda,
            g[0].util_pct,
            g[0].mem_used_mib
        ),
        (Some("gpu-node-7"), Some(0), 12, 70_000)
    );
    let GpuPanel::Present(g) = at(&mut sim, 5.2) else {
        panic!("no recorded GPUs")
    };
    assert_eq!(g[0].util_pct, 5, "seeking back shows that moment's reading");
    // The recorded allocator goes with the recorded GPU (the GPU panel finds it there).
    let snap = last(&sim.seek(6.0).unwrap()).clone();
    let alloc = snap
        .allocator_of(Some("gpu-node-7"), 0)
        .expect("the recorded allocator");
    assert_eq!(alloc.reserved_bytes, 6 << 30);
    let mut plain = Sim::new(recording(5)).unwrap();
    let GpuPanel::Absent(why) = last(&plain.seek(3.0).unwrap()).gpus.clone() else {
        panic!("GPUs out of a recording without them")
    };
    assert!(why.contains("not in this recording"), "{why}");
}

/// A replay's controls with no player: what the keys asked for.
#[derive(Default)]
struct Steered {
    paused: Cell<bool>,
    at: Cell<f64>,
    speed: Cell<Option<Speed>>,
}

impl Controls for Steered {
    fn profiling(&self) -> bool {
        true
    }
    fn set_profiling(&self, _: bool) {}
    fn gpu_timing(&self) -> GpuTiming {
        GpuTiming::Async
    }
    fn set_gpu_timing(&self, _: GpuTiming) {}
    fn paused(&self) -> bool {
        self.paused.get()
    }
    fn set_paused(&self, p: bool) {
        self.paused.set(p)
    }
    fn reset_windows(&self) {}
    fn checkpoint(&self) -> Result<(), String> {
        Err("replay".into())
    }
    fn live(&self) -> bool {
        false
    }
    fn replay(&self) -> Option<ReplayPos> {
        Some(ReplayPos {
            position_s: self.at.get(),
            duration_s: 300.0,
            paused: self.paused.get(),
            speed: self.speed.get().unwrap_or(Speed::X1),
            at_end: false,
        })
    }
    fn seek(&self, delta_s: f64) -> Option<f64> {
        self.at.set((self.at.get() + delta_s).clamp(0.0, 300.0));
        Some(self.at.get())
    }
    fn set_speed(&self, s: Speed) {
        self.speed.set(Some(s))
    }
}

fn badges(ctl: &Steered) -> Badges {
    Badges {
        profiling: true,
        gpu_timing: GpuTiming::Async,
        paused: false,
        live: false,
        replay: ctl.replay(),
    }
}

#[test]
fn the_replay_keys_pause_seek_and_set_the_speed_and_the_bar_shows_where() {
    let ctl = Steered::default();
    ctl.at.set(72.0);
    let mut app = App::new();
    app.replay = true;
    app.on_snapshot(Arc::new(starved_snapshot()));
    app.update(Action::TogglePause, &ctl);
    assert!(ctl.paused.get());
    assert_eq!(app.note.as_deref(), Some("replay paused"));
    app.update(Action::Faster, &ctl);
    assert_eq!(ctl.speed.get(), Some(Speed::X2));
    let paused = screen(&app, 100, 30, Theme::from_color(false), badges(&ctl));
    assert!(paused.contains("‖ paused 2x  t=1:12 / 5:00"), "{paused}");
    insta::assert_snapshot!("replay_paused_100x30", paused);
    // `>` seeks 10 s on; the note and the bar say where to.
    app.update(Action::SeekForward, &ctl);
    assert_eq!(ctl.at.get(), 82.0);
    assert_eq!(app.note.as_deref(), Some("seeking to t=1:22"));
    app.update(Action::SeekBack, &ctl);
    app.update(Action::SeekBack, &ctl);
    assert_eq!(ctl.at.get(), 62.0);
    let seeking = screen(&app, 100, 30, Theme::from_color(false), badges(&ctl));
    assert!(seeking.contains("t=1:02 / 5:00"), "{seeking}");
    insta::assert_snapshot!("replay_seeking_100x30", seeking);
    // The arrows seek in a replay, and change the view elsewhere.
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use dflash_top::tui::keys::{action_for, in_replay};
    let left = KeyEvent::new(KeyCode::Left, KeyModifiers::NONE);
    let a = action_for(left).unwrap();
    assert_eq!(in_replay(left, a, true), Action::SeekBack);
    assert_eq!(in_replay(left, a, false), Action::PrevView);
    // A seek back from the end leaves the end: no summary, not finished.
    app.finished = true;
    app.end_run();
    assert!(app.summary.is_some());
    app.update(Action::SeekBack, &ctl);
    assert!(app.summary.is_none() && !app.finished);
}

#[test]
fn a_replay_at_its_end_says_so_and_shows_the_run_summary() {
    let mut app = App::new();
    app.replay = true;
    app.run_info.recording = Some("runs/tiny.rec".into());
    app.on_snapshot(Arc::new(starved_snapshot()));
    app.finished = true;
    app.end_run();
    let b = Badges {
        replay: Some(ReplayPos {
            position_s: 300.0,
            duration_s: 300.0,
            paused: false,
            speed: Speed::X1,
            at_end: true,
        }),
        ..badges(&Steered::default())
    };
    let s = screen(&app, 160, 45, Theme::from_color(false), b);
    assert!(s.contains("■ end of recording  t=5:00 / 5:00"), "{s}");
    assert!(s.contains("run finished"), "the summary panel: {s}");
    assert!(s.contains("runs/tiny.rec"), "{s}");
}
