//! `dflash-top replay`: a recording in the TUI, driven (pause, seek, speed), ending in its summary.

use super::session::{run_front_end, signal_exit};
use crate::summary::{RunInfo, Summary};
use crate::tui::End;
use crate::wire::recording;
use anyhow::Result;
use std::process::ExitCode;

/// `dflash-top replay FILE`: the recorded run in the same TUI, steered: space pauses, `<` `>`
/// and the arrows seek by 10 s, `,` `.` set the speed; at the end of the recording, its summary
/// (on screen, and on exit as after a live run).
pub fn run(file: &std::path::Path) -> Result<ExitCode> {
    use crate::tui::{terminal, PlayerControls};
    use crate::wire::replay::{Player, Source};
    let msgs = recording::read(file)?;
    let model = match &msgs {
        recording::Recording::Frames(frames) => {
            recording::config_line(frames).and_then(crate::engine::spec::model_label)
        }
        _ => None,
    };
    let source = Source::new(msgs)?;
    terminal::install_panic_hook();
    let player = Player::start(source)?;
    let ctl = PlayerControls { player: &player };
    let finished = || {
        player.pos().at_end.then(|| End {
            note: "end of recording: < or ← seeks back, q leaves".into(),
            run_ended: true,
        })
    };
    let info = RunInfo {
        recording: Some(file.to_path_buf()),
        model,
        ..RunInfo::default()
    };
    let shown = run_front_end(&ctl, &player.snapshots, &finished, info.clone());
    let pos = player.pos();
    player.stop();
    let last = shown?;
    match last {
        Some(s) if pos.at_end => crate::signals::outln!("{}", Summary::of(&s, &info).line()),
        _ => crate::signals::outln!(
            "replay left at t={} / {}",
            crate::tui::app::fmt_clock(pos.position_s),
            crate::tui::app::fmt_clock(pos.duration_s)
        ),
    }
    Ok(signal_exit())
}
