//! Dispatches a parsed command line to the part of the program that does it.

use crate::cli::Command;
use std::process::ExitCode;

/// Exit code for a part that a later issue fills in.
pub const NOT_BUILT: u8 = 2;

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Doctor => {
            print!("{}", crate::doctor::report());
            Ok(ExitCode::SUCCESS)
        }
        other => {
            let name = match other {
                Command::Train(_) => "train",
                Command::Replay { .. } => "replay",
                Command::Export { .. } => "export",
                Command::Bench(_) => "bench",
                Command::Doctor => unreachable!(),
            };
            eprintln!("dflash-top: `{name}` is not built yet");
            Ok(ExitCode::from(NOT_BUILT))
        }
    }
}
