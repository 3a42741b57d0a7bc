use clap::CommandFactory;
use dflash_top::config::cli::Cli;

#[test]
fn cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn every_documented_train_flag_parses() {
    use clap::Parser;
    let cli = Cli::try_parse_from([
        "dflash-top",
        "train",
        "--headless",
        "--preset",
        "tiny",
        "--target",
        "t",
        "--drafter",
        "d",
        "--data",
        "synthetic",
        "--steps",
        "3",
        "--save-dir",
        "s",
        "--save-every",
        "2",
        "--resume",
        "r",
        "--target-devices",
        "cpu",
        "--drafter-devices",
        "cpu",
        "--record",
        "f.jsonl",
        "--config",
        "c.toml",
        "--seed",
        "7",
        "--slow",
        "target=20ms",
        "--batch",
        "1",
        "--seq-len",
        "128",
        "--anchors",
        "8",
        "--lr",
        "1e-3",
        "--drafter-layers",
        "3",
        "--block-size",
        "8",
        "--mask-token-id",
        "511",
    ])
    .expect("the documented flags parse");
    match cli.command {
        Some(dflash_top::config::cli::Command::Train(a)) => {
            assert!(a.headless);
            assert_eq!(a.steps, Some(3));
            assert_eq!(a.seed, Some(7));
            assert_eq!(a.slow, vec!["target=20ms".to_string()]);
            assert_eq!(
                (a.seq_len, a.anchors, a.mask_token_id),
                (Some(128), Some(8), Some(511))
            );
        }
        other => panic!("parsed as {other:?}"),
    }
}

/// Issue 28: `--cupti` is a flag of `train` and of `bench` (whose train flags are its own).
#[test]
fn cupti_parses_on_train_and_bench() {
    use clap::Parser;
    use dflash_top::config::cli::Command;
    for (args, want) in [
        (vec!["dflash-top", "train", "--cupti", "on"], Some("on")),
        (
            vec!["dflash-top", "bench", "engine", "--cupti", "off"],
            Some("off"),
        ),
        (vec!["dflash-top", "train"], None),
    ] {
        let cli = Cli::try_parse_from(&args).expect("parses");
        let got = match cli.command {
            Some(Command::Train(a)) => a.cupti,
            Some(Command::Bench(b)) => b.train.cupti,
            other => panic!("parsed as {other:?}"),
        };
        assert_eq!(got.as_deref(), want, "{args:?}");
    }
}

/// `bench --help` names every bench `bench` runs in its WHAT argument (it once left out
/// `drafter`).
#[test]
fn bench_help_names_every_bench() {
    let cmd = Cli::command();
    let bench = cmd.find_subcommand("bench").expect("a bench subcommand");
    let what = bench
        .get_arguments()
        .find(|a| a.get_id() == "what")
        .expect("bench's WHAT argument");
    let help = what
        .get_long_help()
        .or_else(|| what.get_help())
        .expect("WHAT's help")
        .to_string();
    for name in dflash_top::config::cli::BENCHES {
        assert!(
            help.contains(&format!("`{name}`")),
            "`{name}` missing: {help}"
        );
    }
}
