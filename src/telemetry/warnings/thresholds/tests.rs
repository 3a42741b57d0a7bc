//! `[warnings]` values out of range end in a sentence naming the key and the range.

use super::WarnConfig;

#[test]
fn bad_settings_are_sentences_naming_the_key() {
    let bad = [
        (
            WarnConfig {
                starved_share: 1.5,
                ..WarnConfig::default()
            },
            "`warnings.starved_share` 1.5",
        ),
        (
            WarnConfig {
                gpu_idle_s: -1.0,
                ..WarnConfig::default()
            },
            "`warnings.gpu_idle_s`",
        ),
        (
            WarnConfig {
                host_syncs_per_step: -1.0,
                ..WarnConfig::default()
            },
            "`warnings.host_syncs_per_step` -1 is not a count",
        ),
        (
            WarnConfig {
                alloc_window_s: f64::NAN,
                ..WarnConfig::default()
            },
            "`warnings.alloc_window_s` NaN is not a duration",
        ),
        (
            WarnConfig {
                alloc_churn_per_step: -2.0,
                ..WarnConfig::default()
            },
            "`warnings.alloc_churn_per_step` -2 is not a count",
        ),
        (
            WarnConfig {
                off: vec!["stravred".into()],
                ..WarnConfig::default()
            },
            "unknown rule `stravred`",
        ),
    ];
    for (c, want) in bad {
        let e = c.check().unwrap_err();
        assert!(e.contains(want), "{e}");
    }
    let mut c = WarnConfig::default();
    c.severity.insert("stalled".into(), "fatal".into());
    assert!(c.check().unwrap_err().contains("use info, warn or error"));
    assert_eq!(WarnConfig::default().check(), Ok(()));
}
