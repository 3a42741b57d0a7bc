//! The front-end's own settings, from a TOML file: key bindings on top of the defaults, the
//! light or dark palette, and a colour per phase (built in, or declared by the pipeline watched,
//! by the names it has when the file is read). Where: `$DFLASH_TOP_UI_CONFIG`, else
//! `$XDG_CONFIG_HOME/dflash-top/ui.toml`, else `~/.config/dflash-top/ui.toml`; no file is fine.
//!
//! ```toml
//! [keys]
//! quit = "x"                  # added to the defaults; a key bound here wins over its default
//! select-next = ["n", "ctrl-n"]
//! [colors]
//! theme = "light"             # or "dark" (the default)
//! forward = "#3060ff"         # a phase: a name (red, lightblue, …), #rrggbb or 0-255
//! ```

use super::keys::{parse_key, Action, KeyMap};
use super::theme::Theme;
use crate::telemetry::names::Names;
use crate::telemetry::Phase;
use anyhow::{bail, Context, Result};
use ratatui::style::Color;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Actions by the names the file uses.
pub const ACTIONS: [(&str, Action); 24] = [
    ("quit", Action::Quit),
    ("back", Action::Back),
    ("profiling", Action::ToggleProfiling),
    ("gpu-timing", Action::CycleGpuTiming),
    ("pause", Action::TogglePause),
    ("freeze", Action::ToggleFreeze),
    ("reset", Action::ResetWindows),
    ("checkpoint", Action::Checkpoint),
    ("next-view", Action::NextView),
    ("prev-view", Action::PrevView),
    ("help", Action::ToggleHelp),
    ("window", Action::CycleWindow),
    ("export", Action::ExportTrace),
    ("select-next", Action::SelectNext),
    ("select-prev", Action::SelectPrev),
    ("sort", Action::CycleSort),
    ("zoom-in", Action::ZoomIn),
    ("zoom-out", Action::ZoomOut),
    ("pan-back", Action::PanBack),
    ("pan-forward", Action::PanForward),
    ("seek-back", Action::SeekBack),
    ("seek-forward", Action::SeekForward),
    ("slower", Action::Slower),
    ("faster", Action::Faster),
];

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    keys: BTreeMap<String, OneOrMany>,
    #[serde(default)]
    colors: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a key in [keys] is given in quotes (\"x\", \"ctrl-n\") or as a list of them"
)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct UiConfig {
    pub keys: KeyMap,
    pub theme: Theme,
}

/// Reads the settings from `text` (the contents of `path`); `color` false (NO_COLOR) wins.
/// Phases are our pipeline's.
pub fn parse(text: &str, path: &Path, color: bool) -> Result<UiConfig> {
    parse_for(text, path, color, &Names::builtin())
}

/// `parse` for a pipeline of `names`: a colour may name one of its declared phases.
pub fn parse_for(text: &str, path: &Path, color: bool, names: &Names) -> Result<UiConfig> {
    let shown = path.display();
    let file: File = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or(String::new(), |r| {
            let before = text.get(..r.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!(" line {line}, column {col}:")
        });
        anyhow::anyhow!(
            "{shown}:{at} {}: fix the file (a UI config has sections [keys], action = \"key\", and [colors], phase = \"colour\")",
            e.message().trim_end().trim_end_matches('.')
        )
    })?;
    let mut keys = KeyMap::default();
    for (name, k) in &file.keys {
        let Some(action) = ACTIONS.iter().find(|a| a.0 == name).map(|a| a.1) else {
            let names: Vec<&str> = ACTIONS.iter().map(|a| a.0).collect();
            bail!(
                "{shown}: [keys] has no action '{name}'; the actions are {}",
                names.join(", ")
            );
        };
        let list = match k {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        };
        for key in list {
            let Some((code, ctrl)) = parse_key(&key) else {
                bail!("{shown}: [keys] {name} = '{key}' is not a key (one character, ctrl-x, esc, tab, space, enter, an arrow, pageup, pagedown, home, end)");
            };
            keys.bound.push((code, ctrl, action));
            keys.described.push((key, name.clone()));
        }
    }
    let mut theme = Theme::from_color(color);
    for (name, value) in &file.colors {
        if name == "theme" {
            theme.light = match value.as_str() {
                "light" => true,
                "dark" => false,
                _ => bail!("{shown}: [colors] theme = '{value}': use \"light\" or \"dark\""),
            };
            continue;
        }
        let Some(phase) = Phase::ALL.iter().find(|p| names.phase(**p) == name) else {
            bail!("{shown}: [colors] has no phase '{name}' (theme, or a phase name: forward, hs_wait, …)");
        };
        let Ok(c) = value.parse::<Color>() else {
            bail!("{shown}: [colors] {name} = '{value}' is not a colour (a name such as lightblue, #rrggbb, or 0-255)");
        };
        theme.phase[phase.index()] = Some(c);
    }
    Ok(UiConfig { keys, theme })
}

/// Where the settings are looked for.
pub fn path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DFLASH_TOP_UI_CONFIG").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("dflash-top").join("ui.toml"))
}

/// The settings for a pipeline of `names`: the file if there is one (one named by
/// DFLASH_TOP_UI_CONFIG must exist), else the defaults. NO_COLOR still turns colour off.
pub fn load(names: &Names) -> Result<UiConfig> {
    let color = Theme::from_env().color;
    let named = std::env::var_os("DFLASH_TOP_UI_CONFIG").is_some_and(|v| !v.is_empty());
    let defaults = UiConfig {
        theme: Theme::from_color(color),
        ..Default::default()
    };
    let Some(path) = path() else {
        return Ok(defaults);
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_for(&text, &path, color, names),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !named => Ok(defaults),
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot read the UI config {}: fix it or unset DFLASH_TOP_UI_CONFIG",
                path.display()
            )
        }),
    }
}
