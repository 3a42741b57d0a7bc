//! Loading Hugging Face safetensors (one file or a sharded index) into a VarStore, a tensor
//! read from disk at a time (src/engine/model/tensor_file.rs), with errors that name the file,
//! the tensor and the fix.

use super::tensor_file::TensorFile;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
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

/// The tensors of a directory's safetensors files, each read from disk when it is asked for.
pub struct WeightFiles {
    dir: PathBuf,
    files: Vec<TensorFile>,
    /// Each tensor's file, by name.
    owner: HashMap<String, usize>,
    /// A progress line while a long load reads.
    ticker: Mutex<crate::progress::Ticker>,
}

impl WeightFiles {
    /// Opens the directory's files and checks their headers (a file missing, truncated or not
    /// safetensors is a sentence naming it); no tensor is read yet.
    pub fn open(dir: &Path) -> Result<Self> {
        let paths = safetensors_files(dir)?;
        let mut files = Vec::with_capacity(paths.len());
        let mut owner = HashMap::new();
        for path in &paths {
            if !path.exists() {
                bail!(
                    "{} is listed in the index but missing: download it again",
                    path.display()
                );
            }
            let file = TensorFile::open(path).map_err(|why| {
                anyhow::anyhow!(
                    "{} is not a readable safetensors file ({why}); download or save it again",
                    path.display()
                )
            })?;
            for name in file.names() {
                if let Some(&first) = owner.get(name) {
                    let first: &TensorFile = &files[first];
                    bail!(
                        "tensor `{name}` is in both {} and {}: the files are not one checkpoint; \
                         download it again",
                        first.path().display(),
                        path.display()
                    );
                }
                owner.insert(name.clone(), files.len());
            }
            files.push(file);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            files,
            owner,
            ticker: Mutex::new(crate::progress::Ticker::new()),
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.owner.contains_key(name)
    }

    fn file_of(&self, name: &str) -> Result<&TensorFile> {
        match self.owner.get(name) {
            Some(&i) => Ok(&self.files[i]),
            None => bail!("no file holds tensor `{name}`"),
        }
    }

    pub fn shape(&self, name: &str) -> Option<&[i64]> {
        self.owner
            .get(name)
            .and_then(|&i| self.files[i].shape(name))
    }

    /// The tensor `name`, read from its file now (on the CPU, in the file's kind).
    pub fn read(&self, name: &str) -> Result<Tensor> {
        let tensor = self.file_of(name)?.read(name).map_err(|e| {
            anyhow::anyhow!("{e:#}; the file may have changed or be damaged: download it again")
        })?;
        if let Ok(mut ticker) = self.ticker.lock() {
            ticker.tick(|secs| {
                format!(
                    "weights: {:.1} GiB read from {} ({secs:.0}s)",
                    self.bytes_read() as f64 / (1u64 << 30) as f64,
                    self.dir.display()
                )
            });
        }
        Ok(tensor)
    }

    /// Where tensor `name` lies: its file's place in the list and its bytes' offset there (a load
    /// reads in this order, each file from its start to its end); `None` for a name no file holds.
    pub fn position(&self, name: &str) -> Option<(usize, u64)> {
        let &i = self.owner.get(name)?;
        Some((i, self.files[i].offset(name)?))
    }

    /// A line saying how long the load took, where it took more than a second.
    pub fn report_done(&self) {
        if let Ok(ticker) = self.ticker.lock() {
            if ticker.took_long() {
                eprintln!(
                    "weights: {} read in {:.1}s",
                    self.dir.display(),
                    ticker.seconds()
                );
            }
        }
    }

    /// Every tensor's name, sorted.
    pub fn names(&self) -> Vec<&String> {
        let mut names: Vec<&String> = self.owner.keys().collect();
        names.sort();
        names
    }

    /// The tensor bytes read from disk so far, over all files.
    pub fn bytes_read(&self) -> u64 {
        self.files.iter().map(|f| f.bytes_read()).sum()
    }
}

/// Copies the tensors of `weights` into every variable of `vs` (names must match, shapes too), a
/// tensor read from disk at a time. Returns the names in `weights` that no variable took.
pub fn copy_into(vs: &VarStore, weights: &WeightFiles, source: &Path) -> Result<Vec<String>> {
    copy_matching(vs, weights, source, &|_| true)
}

/// `copy_into` for the variables whose names `wanted` takes (a target loaded a layer at a time);
/// the names returned are those no variable of `vs` takes, wanted or not.
pub fn copy_matching(
    vs: &VarStore,
    weights: &WeightFiles,
    source: &Path,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>> {
    let all = vs.variables();
    let vars: HashMap<&String, &Tensor> = all.iter().filter(|(k, _)| wanted(k)).collect();
    let mut missing: Vec<&String> = vars
        .keys()
        .copied()
        .filter(|k| !weights.contains(k))
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
    let mut order: Vec<(&String, &Tensor)> = vars.into_iter().collect();
    // Every name is held by some file (checked above), so none sorts as `None`.
    order.sort_by_key(|(name, _)| weights.position(name));
    for (name, var) in order {
        let mut var = var.shallow_clone();
        let shape = weights.shape(name).unwrap_or_default();
        if shape != var.size().as_slice() {
            bail!(
                "{}: tensor `{name}` has shape {shape:?} but the config asks for {:?}: the \
                 config.json and the weights do not belong together",
                source.display(),
                var.size()
            );
        }
        var.copy_(&weights.read(name)?);
    }
    Ok(weights
        .names()
        .into_iter()
        .filter(|k| !all.contains_key(*k))
        .cloned()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::{copy_matching, WeightFiles};
    use tch::{nn::VarStore, Device, Kind, Tensor};

    /// A load copies what it is asked for and reads from disk only those tensors' bytes: a layer
    /// loaded alone reads that layer, the rest reads the rest, and nothing is read twice. Across
    /// two shards of an index; the names no variable takes are returned.
    #[test]
    fn a_layer_loaded_alone_reads_only_its_own_bytes() {
        let dir = tempfile::tempdir().unwrap();
        tch::manual_seed(11);
        let t = |n: i64| Tensor::randn([n, 8], (Kind::Float, Device::Cpu));
        let first = [("layers.0.w", t(4)), ("layers.0.b", t(1))];
        let second = [("layers.1.w", t(6)), ("extra", t(2))];
        Tensor::write_safetensors(&first, dir.path().join("a.safetensors")).unwrap();
        Tensor::write_safetensors(&second, dir.path().join("b.safetensors")).unwrap();
        let index = serde_json::json!({"weight_map": {
            "layers.0.w": "a.safetensors", "layers.0.b": "a.safetensors",
            "layers.1.w": "b.safetensors", "extra": "b.safetensors"}});
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        let vs = VarStore::new(Device::Cpu);
        let root = vs.root();
        for (layer, name, rows) in [("0", "w", 4), ("0", "b", 1), ("1", "w", 6)] {
            let _ = (&root / "layers" / layer).zeros(name, &[rows, 8]);
        }
        let files = WeightFiles::open(dir.path()).unwrap();
        assert_eq!(files.bytes_read(), 0);
        let unused =
            copy_matching(&vs, &files, dir.path(), &|n| n.starts_with("layers.0.")).unwrap();
        assert_eq!(files.bytes_read(), (4 + 1) * 8 * 4);
        assert_eq!(unused, ["extra"]);
        copy_matching(&vs, &files, dir.path(), &|n| !n.starts_with("layers.0.")).unwrap();
        assert_eq!(files.bytes_read(), (4 + 1 + 6) * 8 * 4);
        let vars = vs.variables();
        for (name, want) in first.iter().chain(&second[..1]) {
            assert!(vars[*name].equal(want), "{name}");
        }
    }

    /// A tensor in two shards of an index is refused at open, naming both files.
    #[test]
    fn a_tensor_in_two_shards_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tensor::zeros([2], (Kind::Float, Device::Cpu));
        for f in ["a.safetensors", "b.safetensors"] {
            Tensor::write_safetensors(&[("w", &t)], dir.path().join(f)).unwrap();
        }
        let index = serde_json::json!({"weight_map": {"w": "a.safetensors", "v": "b.safetensors"}});
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        let err = format!("{:#}", WeightFiles::open(dir.path()).err().unwrap());
        assert!(
            err.contains("a.safetensors") && err.contains("b.safetensors"),
            "{err}"
        );
        assert!(err.contains("tensor `w` is in both"), "{err}");
    }
}
