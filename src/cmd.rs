//! The commands, one file each (train, bench, attach, replay, export, generate, doctor), and the
//! dispatch of a parsed command line to them; `session.rs` holds what they share, `job_screen.rs`
//! train's TUI when the ranks of a job share a terminal.

use crate::config::cli::Command;
use anyhow::Result;
use std::process::ExitCode;

pub mod attach;
pub mod bench;
pub mod doctor;
pub mod export;
pub mod generate;
pub mod job_screen;
pub mod replay;
pub mod session;
pub mod train;

pub fn run(command: Command) -> Result<ExitCode> {
    if matches!(
        command,
        Command::Train(_) | Command::Bench(_) | Command::Replay { .. } | Command::Attach(_)
    ) {
        crate::signals::install();
    }
    match command {
        Command::Doctor => {
            print!("{}", doctor::report());
            Ok(ExitCode::SUCCESS)
        }
        Command::Train(args) if args.headless => train::headless(&args),
        Command::Train(args) => train::tui(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Export {
            file,
            chrome,
            seconds,
        } => export::run(&file, &chrome, seconds),
        Command::Replay { file } => replay::run(&file),
        Command::Generate(args) => generate::run(&args),
        Command::Attach(args) => attach::run(&args),
    }
}
