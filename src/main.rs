use clap::Parser;
use dflash_top::config::cli::{Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    // Before any thread starts or CUDA is used (libtorch reads it then).
    dflash_top::engine::gpu::alloc_conf::install_default();
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Train(Default::default()));
    match dflash_top::cmd::run(command) {
        // Output lost to a failing stdout (a full disk) is a failure, whatever the command.
        Ok(_) if dflash_top::signals::stdout_failed() => ExitCode::from(1),
        Ok(code) => code,
        Err(e) => {
            eprintln!("dflash-top: {e:#}");
            ExitCode::from(1)
        }
    }
}
