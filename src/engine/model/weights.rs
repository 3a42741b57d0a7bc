//! Loading Hugging Face safetensors (one file or a sharded index) into a VarStore, with errors
//! that name the file, the tensor and the fix.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use tch::{nn::VarStore, Tensor};

/// The safetensors files of a model directory.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index)
            .with_context(|| format!("cannot read {}", index.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", index.display()))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .with_context(|| format!("{} has no `weight_map` object", index.display()))?;
        let files: BTreeSet<&str> = map.values().filter_map(|f| f.as_str()).collect();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    bail!(
        "{} has neither model.safetensors nor model.safetensors.index.json: point the flag at a \
         Hugging Face model directory",
        dir.display()
    )
}

/// The path to name in messages about a directory's weights: its one file, or its index.
pub fn weights_label(dir: &Path) -> PathBuf {
    match safetensors_files(dir) {
        Ok(files) if files.len() == 1 => files[0].clone(),
        _ => dir.join("model.safetensors.index.json"),
    }
}

/// Every tensor of the directory's safetensors files, by name.
pub fn read_all(dir: &Path) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    let files = safetensors_files(dir)?;
    let mut ticker = crate::progress::Ticker::new();
    for (i, file) in files.iter().enumerate() {
        ticker.tick(|secs| {
            format!(
                "weights: reading file {}/{} of {} ({secs:.0}s)",
                i + 1,
                files.len(),
                dir.display()
            )
        });
        if !file.exists() {
            bail!(
                "{} is listed in the index but missing: download it again",
                file.display()
            );
        }
        let tensors = Tensor::read_safetensors(file).map_err(|e| {
            anyhow::anyhow!(
                "{} is not a readable safetensors file ({e}); it may be truncated: download or \
                 save it again",
                file.display()
            )
        })?;
        out.extend(tensors);
    }
    if ticker.took_long() {
        eprintln!(
            "weights: {} read in {:.1}s",
            dir.display(),
            ticker.seconds()
        );
    }
    Ok(out)
}

/// Copies `tensors` into every variable of `vs` (names must match, shapes too). Returns the
/// names in `tensors` that no variable took.
pub fn copy_into(
    vs: &VarStore,
    tensors: &HashMap<String, Tensor>,
    source: &Path,
) -> Result<Vec<String>> {
    copy_matching(vs, tensors, source, &|_| true)
}

/// `copy_into` for the variables whose names `wanted` takes (a target loaded a layer at a time);
/// the names returned are those no variable of `vs` takes, wanted or not.
pub fn copy_matching(
    vs: &VarStore,
    tensors: &HashMap<String, Tensor>,
    source: &Path,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>> {
    let all = vs.variables();
    let vars: HashMap<&String, &Tensor> = all.iter().filter(|(k, _)| wanted(k)).collect();
    let mut missing: Vec<&String> = vars
        .keys()
        .copied()
        .filter(|k| !tensors.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        missing.sort();
        let shown: Vec<_> = missing.iter().take(5).map(|s| s.as_str()).collect();
        bail!(
            "{} lacks {} tensor(s) the model needs, e.g. {}: is it the right kind of checkpoint?",
            source.display(),
            missing.len(),
            shown.join(", ")
        );
    }
    let _guard = tch::no_grad_guard();
    for (name, var) in &vars {
        let mut var = var.shallow_clone();
        let t = &tensors[*name];
        if t.size() != var.size() {
            bail!(
                "{}: tensor `{name}` has shape {:?} but the config asks for {:?}: the config.json \
                 and the weights do not belong together",
                source.display(),
                t.size(),
                var.size()
            );
        }
        var.copy_(t);
    }
    let mut unused: Vec<String> = tensors
        .keys()
        .filter(|k| !all.contains_key(*k))
        .cloned()
        .collect();
    unused.sort();
    Ok(unused)
}
