//! The engine's environment switches (`DFLASH_TOP_NO_GRAPHS=1`, …): the fast paths turned off or
//! on for side-by-side measurements.

/// The switch `name`: `1` on, `0` off, unset `default`. Any other value is ignored, with a
/// sentence (once a process) that names the switch and the values it takes.
pub fn switch(name: &str, default: bool) -> bool {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let (on, complaint) = read(name, std::env::var(name).ok().as_deref(), default);
    if let Some(complaint) = complaint {
        let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
        if !said.iter().any(|n| n == name) {
            said.push(name.to_string());
            eprintln!("{complaint}");
        }
    }
    on
}

/// `switch` of the value `value`: whether it is on, and the sentence for a value it ignores.
fn read(name: &str, value: Option<&str>, default: bool) -> (bool, Option<String>) {
    match value {
        Some("1") => (true, None),
        Some("0") => (false, None),
        Some(v) => (
            default,
            Some(format!(
                "dflash-top: {name}={v} ignored (use 1 for on, 0 for off)"
            )),
        ),
        None => (default, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_on_zero_is_off_unset_is_the_default_and_anything_else_is_named() {
        assert_eq!(read("X", Some("1"), false), (true, None));
        assert_eq!(read("X", Some("0"), true), (false, None));
        assert_eq!(read("X", None, true), (true, None));
        let (on, complaint) = read("DFLASH_TOP_NO_GRAPHS", Some("yes"), false);
        assert!(!on);
        let complaint = complaint.unwrap();
        assert!(
            complaint.contains("DFLASH_TOP_NO_GRAPHS=yes") && complaint.contains("use 1"),
            "{complaint}"
        );
    }
}
