//! A safetensors file read or written a tensor at a time. Read: its header is read and checked
//! when it is opened (every tensor's kind, shape and bytes inside the file), and a tensor's bytes
//! are read from disk only when it is asked for. Written: the header first, then each tensor made
//! (on any device), brought to the host and written before the next is made. A 65 GB target or a
//! large drafter's optimizer state thus never sits whole in host memory: one tensor at a time.

use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tch::{Kind, Tensor};

/// The largest header we read (the format's own limit is 100 MB).
const MAX_HEADER_BYTES: u64 = 100 << 20;

/// One tensor's place in its file.
#[derive(Debug, Clone)]
struct Entry {
    kind: Kind,
    shape: Vec<i64>,
    /// Byte offsets into the data that follows the header, end exclusive.
    start: u64,
    end: u64,
}

/// An open safetensors file whose header has been checked.
#[derive(Debug)]
pub struct TensorFile {
    path: PathBuf,
    file: File,
    data_start: u64,
    entries: BTreeMap<String, Entry>,
    bytes_read: AtomicU64,
}

impl TensorFile {
    /// Opens `path` and checks its header; the error is the reason alone (the caller names the
    /// file and says what to do, which depends on what the file is).
    pub fn open(path: &Path) -> std::result::Result<Self, String> {
        let file = File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
        let len = file
            .metadata()
            .map_err(|e| format!("cannot read its size: {e}"))?
            .len();
        let mut prefix = [0u8; 8];
        if len < 8 || file.read_exact_at(&mut prefix, 0).is_err() {
            return Err(format!("{len} bytes, too short for a header"));
        }
        let header_len = u64::from_le_bytes(prefix);
        if header_len > MAX_HEADER_BYTES || 8 + header_len > len {
            return Err(format!(
                "its header says {header_len} bytes but the file has {len}"
            ));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact_at(&mut header, 8)
            .map_err(|e| format!("cannot read its header: {e}"))?;
        let data_start = 8 + header_len;
        let entries = parse_header(&header, len - data_start)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            data_start,
            entries,
            bytes_read: AtomicU64::new(0),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.entries.keys()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    pub fn shape(&self, name: &str) -> Option<&[i64]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    /// The tensor `name`, read from disk now (on the CPU, in the file's kind).
    pub fn read(&self, name: &str) -> Result<Tensor> {
        let Some(e) = self.entries.get(name) else {
            bail!("{} has no tensor `{name}`", self.path.display());
        };
        let tensor = Tensor::f_empty(e.shape.as_slice(), (e.kind, tch::Device::Cpu))
            .map_err(|err| anyhow::anyhow!("{}: tensor `{name}`: {err}", self.path.display()))?;
        let len = (e.end - e.start) as usize;
        if len > 0 {
            // Read straight into the tensor's own storage: one host copy of it, not two.
            // SAFETY: a fresh contiguous CPU tensor of this kind and shape holds exactly `len`
            // bytes (the header's check: shape x element size = end - start), and nothing else
            // refers to it yet.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(tensor.data_ptr() as *mut u8, len) };
            self.file
                .read_exact_at(bytes, self.data_start + e.start)
                .map_err(|err| {
                    anyhow::anyhow!(
                        "cannot read tensor `{name}` from {} ({err})",
                        self.path.display()
                    )
                })?;
        }
        self.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
        Ok(tensor)
    }

    /// Where tensor `name`'s bytes start in the file (to read a file's tensors in their order).
    pub fn offset(&self, name: &str) -> Option<u64> {
        self.entries.get(name).map(|e| e.start)
    }

    /// The tensor bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }
}

/// The header's tensors, each checked against the `data_len` bytes after the header.
fn parse_header(
    header: &[u8],
    data_len: u64,
) -> std::result::Result<BTreeMap<String, Entry>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(header).map_err(|e| format!("its header is not JSON: {e}"))?;
    let map = value.as_object().ok_or("its header is not a JSON object")?;
    let mut entries = BTreeMap::new();
    for (name, v) in map {
        if name == "__metadata__" {
            continue;
        }
        let entry = parse_entry(v, data_len).map_err(|why| format!("tensor `{name}`: {why}"))?;
        entries.insert(name.clone(), entry);
    }
    // The tensors' bytes tile the data with no gap or overlap, as the format requires.
    let mut spans: Vec<(u64, u64)> = entries.values().map(|e| (e.start, e.end)).collect();
    spans.sort_unstable();
    let mut at = 0;
    for (start, end) in spans {
        if start != at {
            return Err(format!(
                "its tensors' bytes leave a gap or overlap at byte {at} of the data"
            ));
        }
        at = end;
    }
    if at != data_len {
        return Err(format!(
            "its tensors take {at} bytes but {data_len} follow the header"
        ));
    }
    Ok(entries)
}

fn parse_entry(v: &serde_json::Value, data_len: u64) -> std::result::Result<Entry, String> {
    let dtype = v
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or("no `dtype` string")?;
    let kind =
        kind_of(dtype).ok_or_else(|| format!("dtype {dtype} is not one dflash-top reads"))?;
    let dims = v
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or("no `shape` list")?;
    let mut shape = Vec::with_capacity(dims.len());
    for d in dims {
        let d = d
            .as_u64()
            .filter(|&d| d <= i64::MAX as u64)
            .ok_or("a dimension of its shape is not a count")?;
        shape.push(d as i64);
    }
    let offsets: Option<Vec<u64>> = v
        .get("data_offsets")
        .and_then(|o| o.as_array())
        .and_then(|o| o.iter().map(|x| x.as_u64()).collect());
    let Some([start, end]) = offsets.as_deref() else {
        return Err("no `data_offsets` pair of byte counts".into());
    };
    let (start, end) = (*start, *end);
    // Elements libtorch can index (a zero-length dimension does not excuse the others).
    let indexable = shape
        .iter()
        .filter(|&&d| d > 0)
        .try_fold(1i64, |n, &d| n.checked_mul(d));
    if indexable.is_none() {
        return Err(format!(
            "shape {shape:?} holds more elements than can be indexed"
        ));
    }
    if start > end || end > data_len {
        return Err(format!(
            "its bytes {start}..{end} are not within the file's {data_len}; it may be truncated"
        ));
    }
    let want = shape
        .iter()
        .try_fold(kind.elt_size_in_bytes() as u64, |n, &d| {
            n.checked_mul(d as u64)
        });
    if want != Some(end - start) {
        return Err(format!(
            "shape {shape:?} of {dtype} does not take its {} bytes",
            end - start
        ));
    }
    Ok(Entry {
        kind,
        shape,
        start,
        end,
    })
}

/// The safetensors dtypes and the libtorch kinds they are.
const DTYPES: [(&str, Kind); 12] = [
    ("F64", Kind::Double),
    ("F32", Kind::Float),
    ("F16", Kind::Half),
    ("BF16", Kind::BFloat16),
    ("F8_E4M3", Kind::Float8e4m3fn),
    ("F8_E5M2", Kind::Float8e5m2),
    ("I64", Kind::Int64),
    ("I32", Kind::Int),
    ("I16", Kind::Int16),
    ("I8", Kind::Int8),
    ("U8", Kind::Uint8),
    ("BOOL", Kind::Bool),
];

/// The libtorch kind of a safetensors dtype.
fn kind_of(dtype: &str) -> Option<Kind> {
    DTYPES.iter().find(|(d, _)| *d == dtype).map(|(_, k)| *k)
}

/// A tensor to write: its name, kind and shape (for the header), and how to make it when its
/// turn comes (on any device, in that kind and shape).
pub struct Pending<'a> {
    pub name: String,
    pub kind: Kind,
    pub shape: Vec<i64>,
    pub make: Box<dyn Fn() -> Tensor + 'a>,
}

/// Writes `tensors` to `path` as safetensors, in the order given: the header, then each tensor
/// made, brought to the host and written before the next is made (host memory holds one tensor,
/// not the file). The caller makes the file durable (fsync) and atomic (a temporary place).
pub fn write_one_at_a_time(path: &Path, tensors: &[Pending]) -> Result<()> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0u64;
    for t in tensors {
        let Some((dtype, _)) = DTYPES.iter().find(|(_, k)| *k == t.kind) else {
            bail!(
                "tensor `{}`: kind {:?} has no safetensors dtype",
                t.name,
                t.kind
            );
        };
        let bytes = t.shape.iter().product::<i64>() as u64 * t.kind.elt_size_in_bytes() as u64;
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": dtype, "shape": t.shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_string(&header)?.into_bytes();
    // Padded with spaces to 8 bytes, as the format's own writer does (the data then aligned).
    text.resize(text.len().div_ceil(8) * 8, b' ');
    let mut file = File::create(path)?;
    file.write_all(&(text.len() as u64).to_le_bytes())?;
    file.write_all(&text)?;
    let _guard = tch::no_grad_guard();
    for t in tensors {
        let made = (t.make)().to_device(tch::Device::Cpu).contiguous();
        if made.kind() != t.kind || made.size() != t.shape {
            bail!(
                "tensor `{}` was made as {:?} {:?}, its header says {:?} {:?}",
                t.name,
                made.kind(),
                made.size(),
                t.kind,
                t.shape
            );
        }
        let len = made.numel() * t.kind.elt_size_in_bytes();
        if len > 0 {
            // Written from the tensor's own storage: one host copy of it, not two.
            // SAFETY: `made` is a contiguous CPU tensor of this kind and shape (checked above),
            // so its storage holds exactly `len` bytes, and it lives until the write returns.
            let bytes = unsafe { std::slice::from_raw_parts(made.data_ptr() as *const u8, len) };
            file.write_all(bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::TensorFile;
    use tch::{Device, Kind, Tensor};

    /// Every kind a checkpoint holds reads back as tch wrote it, and only the bytes of the
    /// tensors asked for are read.
    #[test]
    fn tensors_read_one_at_a_time_are_the_ones_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        tch::manual_seed(3);
        let named = [
            ("a.f32", Tensor::randn([3, 5], (Kind::Float, Device::Cpu))),
            ("b.bf16", Tensor::randn([7], (Kind::BFloat16, Device::Cpu))),
            ("c.i64", Tensor::from_slice(&[4i64, -9, 12])),
            ("d.f16", Tensor::randn([2, 2, 2], (Kind::Half, Device::Cpu))),
            ("e.empty", Tensor::zeros([0, 4], (Kind::Float, Device::Cpu))),
        ];
        Tensor::write_safetensors(&named, &path).unwrap();
        let file = TensorFile::open(&path).unwrap();
        let names: Vec<&String> = file.names().collect();
        assert_eq!(names, ["a.f32", "b.bf16", "c.i64", "d.f16", "e.empty"]);
        assert_eq!(file.bytes_read(), 0, "opening reads the header alone");
        let b = file.read("b.bf16").unwrap();
        assert_eq!(file.bytes_read(), 7 * 2, "one tensor's bytes, no more");
        for (name, t) in &named {
            let got = file.read(name).unwrap();
            assert_eq!(got.kind(), t.kind(), "{name}");
            assert_eq!(got.size(), t.size(), "{name}");
            assert!(got.equal(t), "{name}");
        }
        assert!(b.equal(&named[1].1));
        assert_eq!(file.shape("a.f32"), Some(&[3i64, 5][..]));
        assert!(!file.contains("z") && file.read("z").is_err());
    }

    /// A file written a tensor at a time reads back (by tch's own reader and by ours) as the
    /// tensors were; each tensor is made only after the one before it is on disk; a tensor made
    /// unlike its header is refused.
    #[test]
    fn a_file_written_one_tensor_at_a_time_is_safetensors_and_streams() {
        use super::{write_one_at_a_time, Pending};
        use std::cell::RefCell;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        tch::manual_seed(4);
        let named = [
            ("z.f32", Tensor::randn([3, 5], (Kind::Float, Device::Cpu))),
            ("a.bf16", Tensor::randn([9], (Kind::BFloat16, Device::Cpu))),
            ("m.i64", Tensor::from_slice(&[7i64])),
        ];
        let seen = RefCell::new(Vec::new());
        let pending: Vec<Pending> = named
            .iter()
            .map(|(name, t)| Pending {
                name: name.to_string(),
                kind: t.kind(),
                shape: t.size(),
                make: Box::new(|| {
                    seen.borrow_mut()
                        .push(std::fs::metadata(&path).unwrap().len());
                    t.shallow_clone()
                }),
            })
            .collect();
        write_one_at_a_time(&path, &pending).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        let data = 15 * 4 + 9 * 2 + 8;
        let header = len - data;
        assert_eq!(header % 8, 0, "the data starts aligned");
        assert_eq!(*seen.borrow(), [header, header + 60, header + 60 + 18]);
        let by_tch: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(&path)
            .unwrap()
            .into_iter()
            .collect();
        let ours = TensorFile::open(&path).unwrap();
        for (name, t) in &named {
            assert!(by_tch[*name].equal(t), "{name}");
            assert!(ours.read(name).unwrap().equal(t), "{name}");
        }
        let wrong = [Pending {
            name: "x".into(),
            kind: Kind::Float,
            shape: vec![2],
            make: Box::new(|| Tensor::zeros([3], (Kind::Float, Device::Cpu))),
        }];
        let err = write_one_at_a_time(&path, &wrong).unwrap_err().to_string();
        assert!(err.contains("`x` was made as"), "{err}");
    }

    /// A damaged file is refused when it is opened, with the reason.
    #[test]
    fn a_damaged_header_or_short_data_is_refused_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let t = Tensor::arange(64, (Kind::Float, Device::Cpu));
        Tensor::write_safetensors(&[("t", &t)], &path).unwrap();
        let whole = std::fs::read(&path).unwrap();
        let header_len = u64::from_le_bytes(whole[..8].try_into().unwrap()) as usize;
        let header = std::str::from_utf8(&whole[8..8 + header_len])
            .unwrap()
            .to_string();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (whole[..whole.len() - 4].to_vec(), "not within"),
            ([&whole[..], b"extra"].concat(), "follow the header"),
            (whole[..5].to_vec(), "too short"),
            (b"\xff\xff\xff\xff\0\0\0\0{}".to_vec(), "header says"),
            (
                {
                    let mut b = whole.clone();
                    b[8] = b'[';
                    b
                },
                "not JSON",
            ),
            (
                [
                    &whole[..8],
                    header.replace("F32", "F99").as_bytes(),
                    &whole[8 + header_len..],
                ]
                .concat(),
                "dtype F99",
            ),
            (
                [
                    &whole[..8],
                    header.replace("[64]", "[65]").as_bytes(),
                    &whole[8 + header_len..],
                ]
                .concat(),
                "does not take",
            ),
        ];
        let made = |header: &str, data: &[u8]| {
            [
                &(header.len() as u64).to_le_bytes()[..],
                header.as_bytes(),
                data,
            ]
            .concat()
        };
        let more: Vec<(Vec<u8>, &str)> = vec![
            (
                made(
                    r#"{"t":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}}"#,
                    b"",
                ),
                "more elements than can be indexed",
            ),
            (
                made(
                    r#"{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,"x",2]}}"#,
                    b"ab",
                ),
                "no `data_offsets` pair",
            ),
            (
                made(
                    r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
                    b"ab",
                ),
                "gap or overlap",
            ),
            (
                made(
                    r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#,
                    b"abc",
                ),
                "gap or overlap",
            ),
        ];
        for (bytes, why) in cases.into_iter().chain(more) {
            std::fs::write(&path, &bytes).unwrap();
            let err = TensorFile::open(&path).unwrap_err();
            assert!(err.contains(why), "{why}: {err}");
        }
    }
}
