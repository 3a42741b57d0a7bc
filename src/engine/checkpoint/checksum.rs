//! Checksums of a checkpoint's files (`checksums.json`, CRC-32 of each file's bytes), written
//! with the checkpoint and verified before it is loaded, so that a damaged file is named at
//! start instead of training on, or failing steps later.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

pub const CHECKSUM_FILE: &str = "checksums.json";

/// CRC-32 of a file, read in 1 MiB pieces.
fn crc_of(path: &Path) -> std::io::Result<u32> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hasher.finalize());
        }
        hasher.update(&buf[..n]);
    }
}

/// Writes `dir/checksums.json` for `files` (names inside `dir`).
pub fn write(dir: &Path, files: &[&str]) -> Result<()> {
    let mut sums = BTreeMap::new();
    for f in files {
        let crc = crc_of(&dir.join(f)).with_context(|| format!("cannot read back {f}"))?;
        sums.insert(f.to_string(), format!("{crc:08x}"));
    }
    let text = serde_json::to_string_pretty(&serde_json::json!({
        "algorithm": "crc32",
        "files": sums,
    }))?;
    std::fs::write(dir.join(CHECKSUM_FILE), text)?;
    Ok(())
}

/// Checks every file `dir/checksums.json` lists; a directory without one (a drafter of another
/// tool, a checkpoint of an earlier version) passes unchecked.
pub fn verify(dir: &Path) -> Result<()> {
    let path = dir.join(CHECKSUM_FILE);
    if !path.is_file() {
        return Ok(());
    }
    let damaged = |what: String| {
        anyhow::anyhow!(
            "{what}: the checkpoint {} is damaged; resume from an earlier checkpoint or restore \
             it from a copy (if you edited it on purpose, delete {})",
            dir.display(),
            path.display()
        )
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| damaged(format!("cannot read {} ({e})", path.display())))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|_| damaged(format!("{} is not valid JSON", path.display())))?;
    let Some(files) = v.get("files").and_then(|f| f.as_object()) else {
        bail!(damaged(format!("{} lists no `files`", path.display())));
    };
    for (name, want) in files {
        let file = dir.join(name);
        if name.contains('/') || name.starts_with('.') {
            bail!(damaged(format!("{} names `{name}`", path.display())));
        }
        let got =
            crc_of(&file).map_err(|e| damaged(format!("cannot read {} ({e})", file.display())))?;
        if want.as_str() != Some(format!("{got:08x}").as_str()) {
            bail!(damaged(format!(
                "{} does not match its checksum in {}",
                file.display(),
                path.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_bit_is_named_and_an_unlisted_directory_passes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.bin"), vec![7u8; 3000]).unwrap();
        verify(d).unwrap();
        write(d, &["a.bin"]).unwrap();
        verify(d).unwrap();
        let mut bytes = std::fs::read(d.join("a.bin")).unwrap();
        bytes[1234] ^= 0x10;
        std::fs::write(d.join("a.bin"), bytes).unwrap();
        let e = verify(d).unwrap_err().to_string();
        assert!(e.contains("a.bin does not match its checksum"), "{e}");
        assert!(e.contains("earlier checkpoint"), "{e}");
        std::fs::remove_file(d.join("a.bin")).unwrap();
        let e = verify(d).unwrap_err().to_string();
        assert!(e.contains("cannot read"), "{e}");
    }
}
