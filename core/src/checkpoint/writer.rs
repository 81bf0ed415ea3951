//! Writing checkpoints: streamed safetensors shards, the shard index, and a
//! staged output directory that appears under its final name only when it
//! is complete.
//!
//! Why streamed: a full-size checkpoint does not fit in memory, so a shard's
//! header (every tensor's dtype, shape and byte range) is computed from the
//! plan up front, and the tensor bytes are then appended in plan order, in
//! as many pieces as the producer likes. Nothing here holds more than the
//! piece it is given.
//!
//! Why staged: tools write into a sibling `DIR.tmp-<pid>` and rename it to
//! `DIR` at the very end, so an interrupted run never leaves a directory
//! that looks like a finished checkpoint. The next run removes temp
//! directories whose process is gone and starts over (it does not resume).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec::Vec;

pub use super::safetensors_file::Dtype;
use serde_json::{Map, Value};

/// File name of the shard index (Hugging Face layout).
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Why writing failed; every variant names the file or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} already exists (pass --force to replace it)")]
    Exists { path: PathBuf },
    #[error("{file}: {why}")]
    Plan { file: String, why: String },
    #[error("{file}: tensor `{tensor}`: {why}")]
    Tensor {
        file: String,
        tensor: String,
        why: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> WriteError + '_ {
    move |source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One tensor as the safetensors header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: Dtype,
    /// Empty for a scalar.
    pub shape: Vec<usize>,
}

impl TensorEntry {
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: &[usize]) -> Self {
        TensorEntry {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }
    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
    /// Stored size in bytes.
    pub fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.size() as u64
    }
}

/// The tensors of one shard file, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlan {
    /// File name relative to the checkpoint directory.
    pub file: String,
    pub tensors: Vec<TensorEntry>,
}

impl ShardPlan {
    pub fn nbytes(&self) -> u64 {
        self.tensors.iter().map(TensorEntry::nbytes).sum()
    }
}

/// `model-0000i-of-0000n.safetensors` (1-based, as Hugging Face names them).
pub fn shard_file_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
}

/// Split `groups` (each a set of tensors that must share a shard, e.g. a
/// weight and its scales) into shards of at most `budget` bytes each, in
/// order. A group larger than the budget gets a shard of its own.
pub fn plan_shards(groups: Vec<Vec<TensorEntry>>, budget: u64) -> Vec<ShardPlan> {
    let mut shards: Vec<Vec<TensorEntry>> = Vec::new();
    let mut cur: Vec<TensorEntry> = Vec::new();
    let mut cur_bytes = 0u64;
    for g in groups {
        let gb: u64 = g.iter().map(TensorEntry::nbytes).sum();
        if !cur.is_empty() && cur_bytes + gb > budget {
            shards.push(core::mem::take(&mut cur));
            cur_bytes = 0;
        }
        cur_bytes += gb;
        cur.extend(g);
    }
    if !cur.is_empty() {
        shards.push(cur);
    }
    let n = shards.len();
    shards
        .into_iter()
        .enumerate()
        .map(|(i, tensors)| ShardPlan {
            file: shard_file_name(i, n),
            tensors,
        })
        .collect()
}

/// The safetensors header of `tensors` (laid out back to back in order),
/// padded with spaces to a multiple of 8 bytes, with its 8-byte length
/// prefix.
fn header_bytes(file: &str, tensors: &[TensorEntry]) -> Result<Vec<u8>, WriteError> {
    let mut map = Map::new();
    let mut meta = Map::new();
    meta.insert("format".into(), Value::from("pt"));
    map.insert("__metadata__".into(), Value::Object(meta));
    let mut offset = 0u64;
    for t in tensors {
        let end = offset + t.nbytes();
        let dtype = Value::from(t.dtype.name());
        let mut info = Map::new();
        info.insert("dtype".into(), dtype);
        info.insert(
            "shape".into(),
            Value::Array(t.shape.iter().map(|&d| Value::from(d)).collect()),
        );
        info.insert(
            "data_offsets".into(),
            Value::Array(vec![Value::from(offset), Value::from(end)]),
        );
        if map.insert(t.name.clone(), Value::Object(info)).is_some() || t.name == "__metadata__" {
            return Err(WriteError::Tensor {
                file: file.into(),
                tensor: t.name.clone(),
                why: "appears twice in one shard".into(),
            });
        }
        offset = end;
    }
    let mut json = serde_json::to_string(&Value::Object(map))
        .map_err(|e| WriteError::Plan {
            file: file.into(),
            why: format!("header: {e}"),
        })?
        .into_bytes();
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Writes one shard: the header at creation, then each tensor's bytes in
/// plan order through [`ShardWriter::write`], checked against the plan.
pub struct ShardWriter {
    path: PathBuf,
    file_label: String,
    out: BufWriter<File>,
    tensors: Vec<TensorEntry>,
    /// Index of the tensor being written.
    current: usize,
    /// Bytes of `tensors[current]` written so far.
    written: u64,
}

impl ShardWriter {
    /// Create `path` and write the header of `plan`.
    pub fn create(path: &Path, plan: &ShardPlan) -> Result<Self, WriteError> {
        let header = header_bytes(&plan.file, &plan.tensors)?;
        let file = File::create(path).map_err(io_err(path))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&header).map_err(io_err(path))?;
        let mut w = ShardWriter {
            path: path.to_path_buf(),
            file_label: plan.file.clone(),
            out,
            tensors: plan.tensors.clone(),
            current: 0,
            written: 0,
        };
        w.skip_empty();
        Ok(w)
    }

    fn skip_empty(&mut self) {
        while self.current < self.tensors.len()
            && self.written == self.tensors[self.current].nbytes()
        {
            self.current += 1;
            self.written = 0;
        }
    }

    /// The tensor the next bytes belong to (None when all are written).
    pub fn current(&self) -> Option<&TensorEntry> {
        self.tensors.get(self.current)
    }

    /// Append `bytes` to tensor `name`, which must be the current tensor;
    /// a tensor may be written in any number of pieces, never past its size.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<(), WriteError> {
        let err = |why: String| WriteError::Tensor {
            file: self.file_label.clone(),
            tensor: name.into(),
            why,
        };
        let Some(t) = self.tensors.get(self.current) else {
            return Err(err(
                "not in the plan, or written after the shard was full".into()
            ));
        };
        if t.name != name {
            return Err(err(format!(
                "written out of order (expected `{}` next)",
                t.name
            )));
        }
        let room = t.nbytes() - self.written;
        if bytes.len() as u64 > room {
            return Err(err(format!(
                "{} bytes written past its size of {} bytes",
                self.written + bytes.len() as u64,
                t.nbytes()
            )));
        }
        self.out.write_all(bytes).map_err(io_err(&self.path))?;
        self.written += bytes.len() as u64;
        self.skip_empty();
        Ok(())
    }

    /// Check every tensor was written in full, flush and sync to disk.
    pub fn finish(mut self) -> Result<(), WriteError> {
        if let Some(t) = self.tensors.get(self.current) {
            return Err(WriteError::Tensor {
                file: self.file_label.clone(),
                tensor: t.name.clone(),
                why: format!("only {} of {} bytes written", self.written, t.nbytes()),
            });
        }
        self.out.flush().map_err(io_err(&self.path))?;
        let file = self.out.into_inner().map_err(|e| WriteError::Io {
            path: self.path.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(io_err(&self.path))
    }
}

/// The `model.safetensors.index.json` text for `shards`: `metadata.total_size`
/// (bytes of tensor data) and the `weight_map` from tensor name to file.
pub fn index_json(shards: &[ShardPlan]) -> Result<String, WriteError> {
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for s in shards {
        for t in &s.tensors {
            total += t.nbytes();
            if let Some(prev) = weight_map.insert(t.name.clone(), Value::from(s.file.as_str())) {
                return Err(WriteError::Tensor {
                    file: INDEX_FILE.into(),
                    tensor: t.name.clone(),
                    why: format!("planned in both {prev} and {}", s.file),
                });
            }
        }
    }
    let mut meta = Map::new();
    meta.insert("total_size".into(), Value::from(total));
    let mut root = Map::new();
    root.insert("metadata".into(), Value::Object(meta));
    root.insert(
        "weight_map".into(),
        Value::Object(weight_map.into_iter().collect()),
    );
    serde_json::to_string_pretty(&Value::Object(root)).map_err(|e| WriteError::Plan {
        file: INDEX_FILE.into(),
        why: e.to_string(),
    })
}

/// An output directory built under a temp name (`DIR.tmp-<pid>`) and renamed
/// to `DIR` by [`StagedDir::commit`]. Dropped without a commit, the temp
/// directory is removed.
pub struct StagedDir {
    dest: PathBuf,
    tmp: PathBuf,
    committed: bool,
}

/// True when a directory exists at `p` and holds anything.
fn non_empty_dir(p: &Path) -> bool {
    fs::read_dir(p)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

impl StagedDir {
    /// Start writing `dest`. Refuses an existing `dest` that is a file or a
    /// non-empty directory unless `force` (then it is replaced at commit).
    /// Removes stale `DIR.tmp-<pid>` directories left by dead processes.
    pub fn create(dest: &Path, force: bool) -> Result<Self, WriteError> {
        if dest.exists() && !force && (dest.is_file() || non_empty_dir(dest)) {
            return Err(WriteError::Exists {
                path: dest.to_path_buf(),
            });
        }
        let Some(name) = dest.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            return Err(WriteError::Plan {
                file: dest.display().to_string(),
                why: "output path has no directory name".into(),
            });
        };
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(io_err(&parent))?;
        remove_stale_temps(&parent, &name);
        let tmp = parent.join(format!("{name}.tmp-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
        }
        fs::create_dir(&tmp).map_err(io_err(&tmp))?;
        Ok(StagedDir {
            dest: dest.to_path_buf(),
            tmp,
            committed: false,
        })
    }

    /// Where to write the files now.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// The final directory.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Move the finished directory to its final name (replacing an old one
    /// that `create` was allowed to replace).
    pub fn commit(mut self) -> Result<(), WriteError> {
        if self.dest.exists() {
            let old = self.dest.with_file_name(format!(
                "{}.old-{}",
                self.dest
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                std::process::id()
            ));
            fs::rename(&self.dest, &old).map_err(io_err(&self.dest))?;
            fs::rename(&self.tmp, &self.dest).map_err(io_err(&self.dest))?;
            if old.is_dir() {
                fs::remove_dir_all(&old).map_err(io_err(&old))?;
            } else {
                fs::remove_file(&old).map_err(io_err(&old))?;
            }
        } else {
            fs::rename(&self.tmp, &self.dest).map_err(io_err(&self.dest))?;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: a leftover temp dir is removed by the next run.
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Remove `parent/name.tmp-<pid>` (and `.old-<pid>`) directories whose
/// process no longer runs (checked through `/proc`; where `/proc` is
/// absent nothing is removed).
fn remove_stale_temps(parent: &Path, name: &str) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let file_name = e.file_name().to_string_lossy().into_owned();
        let pid = file_name
            .strip_prefix(name)
            .and_then(|r| r.strip_prefix(".tmp-").or_else(|| r.strip_prefix(".old-")))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, dtype: Dtype, shape: &[usize]) -> TensorEntry {
        TensorEntry::new(name, dtype, shape)
    }

    #[test]
    fn streamed_shard_reads_back_through_safetensors() {
        let dir = tempfile::tempdir().unwrap();
        let plan = ShardPlan {
            file: "s.safetensors".into(),
            tensors: vec![
                entry("a", Dtype::F32, &[2, 3]),
                entry("b", Dtype::U8, &[5]),
                entry("s", Dtype::F32, &[]),
            ],
        };
        let path = dir.path().join(&plan.file);
        let mut w = ShardWriter::create(&path, &plan).unwrap();
        let a: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        w.write("a", &a[..10]).unwrap();
        w.write("a", &a[10..]).unwrap();
        w.write("b", &[1, 2, 3, 4, 5]).unwrap();
        w.write("s", &7.5f32.to_le_bytes()).unwrap();
        w.finish().unwrap();
        let bytes = fs::read(&path).unwrap();
        assert_eq!((u64::from_le_bytes(bytes[..8].try_into().unwrap())) % 8, 0);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("a").unwrap().data(), &a[..]);
        assert_eq!(st.tensor("a").unwrap().shape(), &[2, 3]);
        assert_eq!(st.tensor("b").unwrap().data(), &[1, 2, 3, 4, 5]);
        assert_eq!(st.tensor("s").unwrap().shape(), &[] as &[usize]);
        assert_eq!(st.tensor("s").unwrap().data(), &7.5f32.to_le_bytes());
    }

    #[test]
    fn writer_refuses_wrong_order_overflow_and_short_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let plan = ShardPlan {
            file: "s.safetensors".into(),
            tensors: vec![entry("a", Dtype::U8, &[4]), entry("b", Dtype::U8, &[2])],
        };
        let mut w = ShardWriter::create(&dir.path().join("x"), &plan).unwrap();
        assert!(w
            .write("b", &[1])
            .unwrap_err()
            .to_string()
            .contains("out of order"));
        assert!(w
            .write("a", &[0; 5])
            .unwrap_err()
            .to_string()
            .contains("past its size"));
        w.write("a", &[0; 4]).unwrap();
        w.write("b", &[0]).unwrap();
        let e = w.finish().unwrap_err().to_string();
        assert!(e.contains("`b`") && e.contains("only 1 of 2"), "{e}");
        let dup = ShardPlan {
            file: "d".into(),
            tensors: vec![entry("a", Dtype::U8, &[1]), entry("a", Dtype::U8, &[1])],
        };
        assert!(ShardWriter::create(&dir.path().join("y"), &dup).is_err());
    }

    #[test]
    fn shards_respect_budget_and_keep_groups_together() {
        let g = |n: &str, b: usize| {
            vec![
                entry(n, Dtype::U8, &[b]),
                entry(&format!("{n}.s"), Dtype::U8, &[1]),
            ]
        };
        let plan = plan_shards(vec![g("a", 40), g("b", 40), g("c", 200), g("d", 10)], 100);
        let files: Vec<Vec<&str>> = plan
            .iter()
            .map(|s| s.tensors.iter().map(|t| t.name.as_str()).collect())
            .collect();
        assert_eq!(
            files,
            vec![
                vec!["a", "a.s", "b", "b.s"],
                vec!["c", "c.s"],
                vec!["d", "d.s"]
            ]
        );
        assert_eq!(plan[0].file, "model-00001-of-00003.safetensors");
        let idx: Value = serde_json::from_str(&index_json(&plan).unwrap()).unwrap();
        assert_eq!(idx["metadata"]["total_size"], 294);
        assert_eq!(idx["weight_map"]["c.s"], "model-00002-of-00003.safetensors");
    }

    #[test]
    fn staged_dir_appears_only_on_commit_and_refuses_overwrite() {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("out");
        let s = StagedDir::create(&dest, false).unwrap();
        fs::write(s.path().join("f"), b"1").unwrap();
        assert!(!dest.exists());
        let tmp = s.path().to_path_buf();
        drop(s);
        assert!(!tmp.exists() && !dest.exists(), "dropped stage must vanish");
        let s = StagedDir::create(&dest, false).unwrap();
        fs::write(s.path().join("f"), b"1").unwrap();
        s.commit().unwrap();
        assert_eq!(fs::read(dest.join("f")).unwrap(), b"1");
        assert!(matches!(
            StagedDir::create(&dest, false),
            Err(WriteError::Exists { .. })
        ));
        let s = StagedDir::create(&dest, true).unwrap();
        fs::write(s.path().join("g"), b"2").unwrap();
        s.commit().unwrap();
        assert!(dest.join("g").exists() && !dest.join("f").exists());
        // A stale temp dir of a dead process is cleaned up by the next run.
        let stale = root.path().join("out.tmp-4000000000");
        fs::create_dir(&stale).unwrap();
        drop(StagedDir::create(&root.path().join("out"), true).unwrap());
        assert!(!stale.exists());
        let left: Vec<_> = fs::read_dir(root.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }
}

/// Write `bytes` to `path` so that it appears complete or not at all: into
/// a hidden temp file in the same directory (synced), then renamed over
/// `path`. On any error the temp file is removed and `path` is untouched.
/// Every tool that writes an output file goes through here.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| WriteError::Io { path: p, source }
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| WriteError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"),
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let r = (|| {
        let mut f = File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        drop(f);
        fs::rename(&tmp, path).map_err(io(path))
    })();
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod atomic_tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_whole_or_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out.jsonl");
        write_file_atomic(&p, b"one\n").unwrap();
        write_file_atomic(&p, b"two\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two\n");
        // A target whose directory does not exist: an error, no file.
        let bad = d.path().join("missing").join("out");
        assert!(write_file_atomic(&bad, b"x").is_err());
        assert!(!bad.exists());
        // No temp files left behind.
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
