//! The safetensors container, validated before it is trusted.
//!
//! Layout: 8 bytes little-endian `n`, then `n` bytes of JSON header (an
//! object mapping tensor name -> `{dtype, shape, data_offsets: [begin, end]}`
//! plus an optional `__metadata__` string map), then the data area; offsets
//! are relative to the start of the data area.
//!
//! [`parse_header`] checks everything a reader relies on (header inside the
//! file, JSON well formed, each tensor's byte range inside the data area with
//! `end - begin == product(shape) * dtype size`, ranges non-overlapping)
//! before any tensor is read, so a hostile or truncated file yields an error
//! naming the file and tensor, never a panic or an out-of-bounds read. It is
//! also the fuzz target's entry point.

use std::collections::BTreeMap;
use std::string::{String, ToString};
use std::vec::Vec;

use serde_json::Value;

use super::CheckpointError;

/// Largest header accepted (the reference implementation's limit): 100 MB.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Element types of safetensors (those this project reads plus the common
/// others, so a header naming them is reported by name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    F8E4M3,
    F8E5M2,
    /// E8M0 scale bytes (newer exporters; read like U8 scales).
    F8E8M0,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
}

impl Dtype {
    /// Parse the header spelling (`"F8_E4M3"`, `"BF16"`, ...).
    pub fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "BOOL" => Dtype::Bool,
            "U8" => Dtype::U8,
            "I8" => Dtype::I8,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E5M2" => Dtype::F8E5M2,
            "F8_E8M0" => Dtype::F8E8M0,
            "I16" => Dtype::I16,
            "U16" => Dtype::U16,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "I32" => Dtype::I32,
            "U32" => Dtype::U32,
            "F32" => Dtype::F32,
            "F64" => Dtype::F64,
            "I64" => Dtype::I64,
            "U64" => Dtype::U64,
            _ => return None,
        })
    }
    /// The header spelling.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::F8E8M0 => {
                1
            }
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }
}

impl core::fmt::Display for Dtype {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor's header entry, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range inside the data area (relative to its start).
    pub begin: usize,
    pub end: usize,
}

impl TensorInfo {
    /// Number of elements (1 for a scalar of shape `[]`).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Bytes of data.
    pub fn nbytes(&self) -> usize {
        self.end - self.begin
    }
}

/// A validated header: its length and the tensors sorted by data offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// `n`, the JSON length; the data area starts at byte `8 + n`.
    pub header_len: usize,
    /// Bytes in the data area (file length - 8 - n).
    pub data_len: usize,
    /// Tensors in data order.
    pub tensors: Vec<TensorInfo>,
    /// `__metadata__`, if any.
    pub metadata: BTreeMap<String, String>,
    /// Bytes of the data area no tensor covers (a warning, not an error).
    pub unused_bytes: usize,
}

impl Header {
    /// Offset of the data area in the file.
    pub fn data_start(&self) -> usize {
        8 + self.header_len
    }
}

/// Parse and validate the header of a safetensors file whose complete bytes
/// are `file_bytes` (usually a memory map). `file` names it in errors.
pub fn parse_header(file: &str, file_bytes: &[u8]) -> Result<Header, CheckpointError> {
    let file_len = file_bytes.len();
    if file_len < 8 {
        return Err(CheckpointError::file(
            file,
            format!("{file_len} bytes: too short for a safetensors file (needs an 8-byte header length)"),
        ));
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&file_bytes[..8]);
    let n = u64::from_le_bytes(len8);
    if n > MAX_HEADER_LEN {
        return Err(CheckpointError::file(
            file,
            format!("header length {n} exceeds the {MAX_HEADER_LEN}-byte limit"),
        ));
    }
    if n > (file_len - 8) as u64 {
        return Err(CheckpointError::file(
            file,
            format!("header length {n} runs past the end of the file ({file_len} bytes): truncated or not safetensors"),
        ));
    }
    let n = n as usize;
    let json = &file_bytes[8..8 + n];
    let value: Value = serde_json::from_slice(json)
        .map_err(|e| CheckpointError::file(file, format!("header is not valid JSON: {e}")))?;
    let data_len = file_len - 8 - n;
    let mut header = parse_header_json(file, &value, data_len)?;
    header.header_len = n;
    Ok(header)
}

/// Validate a parsed header object against a data area of `data_len` bytes.
pub fn parse_header_json(
    file: &str,
    value: &Value,
    data_len: usize,
) -> Result<Header, CheckpointError> {
    let obj = value
        .as_object()
        .ok_or_else(|| CheckpointError::file(file, "header JSON is not an object"))?;
    let mut tensors = Vec::with_capacity(obj.len());
    let mut metadata = BTreeMap::new();
    for (name, entry) in obj {
        if name == "__metadata__" {
            let m = entry
                .as_object()
                .ok_or_else(|| CheckpointError::file(file, "__metadata__ is not an object"))?;
            for (k, v) in m {
                let s = v.as_str().ok_or_else(|| {
                    CheckpointError::file(file, format!("__metadata__ value `{k}` is not a string"))
                })?;
                metadata.insert(k.clone(), s.to_string());
            }
            continue;
        }
        let bad = |why: String| CheckpointError::tensor(file, name.as_str(), why);
        let e = entry
            .as_object()
            .ok_or_else(|| bad("header entry is not an object".into()))?;
        let dtype_s = e
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("header entry has no string `dtype`".into()))?;
        let dtype =
            Dtype::parse(dtype_s).ok_or_else(|| bad(format!("unsupported dtype `{dtype_s}`")))?;
        let shape_v = e
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("header entry has no `shape` list".into()))?;
        let mut shape = Vec::with_capacity(shape_v.len());
        for d in shape_v {
            let d = d
                .as_u64()
                .filter(|d| *d <= u32::MAX as u64 * 16)
                .ok_or_else(|| bad(format!("shape entry {d} is not a non-negative integer")))?;
            shape.push(d as usize);
        }
        let offs = e
            .get("data_offsets")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad("header entry has no `data_offsets` pair".into()))?;
        let (Some(begin), Some(end)) = (offs[0].as_u64(), offs[1].as_u64()) else {
            return Err(bad("data_offsets are not non-negative integers".into()));
        };
        if begin > end {
            return Err(bad(format!("data_offsets [{begin}, {end}] are reversed")));
        }
        if end > data_len as u64 {
            return Err(bad(format!(
                "data_offsets [{begin}, {end}] run past the data area ({data_len} bytes): file truncated or header lies"
            )));
        }
        let want = shape
            .iter()
            .try_fold(dtype.size() as u64, |acc, d| acc.checked_mul(*d as u64))
            .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
        if end - begin != want {
            return Err(bad(format!(
                "data_offsets [{begin}, {end}] hold {} bytes but {dtype} {shape:?} needs {want}",
                end - begin
            )));
        }
        tensors.push(TensorInfo {
            name: name.clone(),
            dtype,
            shape,
            begin: begin as usize,
            end: end as usize,
        });
    }
    tensors.sort_by_key(|t| (t.begin, t.end));
    let mut covered = 0usize;
    let mut prev: Option<&TensorInfo> = None;
    for t in &tensors {
        if let Some(p) = prev {
            if t.begin < p.end {
                return Err(CheckpointError::tensor(
                    file,
                    t.name.as_str(),
                    format!(
                        "data_offsets [{}, {}] overlap tensor `{}` [{}, {}]",
                        t.begin, t.end, p.name, p.begin, p.end
                    ),
                ));
            }
        }
        covered += t.nbytes();
        prev = Some(t);
    }
    Ok(Header {
        header_len: 0,
        data_len,
        tensors,
        metadata,
        unused_bytes: data_len - covered,
    })
}

/// A memory-mapped, validated safetensors file.
pub struct SafetensorsFile {
    /// Display name used in errors (the file name relative to the checkpoint).
    pub name: String,
    pub path: std::path::PathBuf,
    map: memmap2::Mmap,
    pub header: Header,
    /// Name -> index into `header.tensors`.
    by_name: BTreeMap<String, usize>,
}

impl SafetensorsFile {
    /// Open, map and validate `path`; `name` is how errors call it.
    pub fn open(path: &std::path::Path, name: &str) -> Result<Self, CheckpointError> {
        let f = std::fs::File::open(path).map_err(|e| CheckpointError::io(path, e))?;
        let len = f
            .metadata()
            .map_err(|e| CheckpointError::io(path, e))?
            .len();
        if len < 8 {
            return Err(CheckpointError::file(
                name,
                format!("{len} bytes: too short for a safetensors file"),
            ));
        }
        // SAFETY: the map is read-only and private to this process; the
        // checkpoint files must not be truncated while loaded (as with every
        // mmap-based loader). Every access is bounds-checked against the
        // validated header.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| CheckpointError::io(path, e))?;
        let header = parse_header(name, &map)?;
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(SafetensorsFile {
            name: name.to_string(),
            path: path.to_path_buf(),
            map,
            header,
            by_name,
        })
    }

    /// The validated entry of `tensor`, if the file has it.
    pub fn info(&self, tensor: &str) -> Option<&TensorInfo> {
        self.by_name.get(tensor).map(|i| &self.header.tensors[*i])
    }

    /// Position of `tensor` in `header.tensors`, if the file has it.
    pub fn position(&self, tensor: &str) -> Option<usize> {
        self.by_name.get(tensor).copied()
    }

    /// The raw little-endian bytes of a tensor of this file.
    pub fn bytes(&self, t: &TensorInfo) -> &[u8] {
        let s = self.header.data_start();
        // In bounds: validated by `parse_header` against this very map.
        &self.map[s + t.begin..s + t.end]
    }

    /// Tell the kernel the pages of tensor `t` are no longer needed, so
    /// streaming a checkpoint to a device does not leave every page it read
    /// resident (peak RSS stays near one tensor). The bytes stay valid: the
    /// map is a read-only file mapping, a later read faults them back in
    /// from the file. Best effort (errors ignored).
    pub fn release(&self, t: &TensorInfo) {
        let s = self.header.data_start();
        if t.end > t.begin {
            // SAFETY: MADV_DONTNEED on a read-only, file-backed private
            // mapping discards no data: the pages are re-read from the file
            // on the next access, so outstanding slices stay valid.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    s + t.begin,
                    t.end - t.begin,
                )
            };
        }
    }
}

/// One fuzz iteration (used by `fuzz/` and `cargo xtask fuzz`): feed
/// arbitrary bytes to the header validator and the index parser, and
/// assert the invariants callers rely on when they succeed. Errors are
/// fine; a panic is a bug.
#[doc(hidden)]
pub fn fuzz_one(data: &[u8]) {
    if let Ok(h) = parse_header("fuzz.safetensors", data) {
        let mut prev_end = 0usize;
        for t in &h.tensors {
            assert!(
                t.begin <= t.end && t.end <= h.data_len,
                "range outside the data area"
            );
            assert!(
                h.data_start() + t.end <= data.len(),
                "range outside the file"
            );
            assert!(t.begin >= prev_end, "ranges overlap or are unsorted");
            assert_eq!(t.nbytes(), t.numel() * t.dtype.size(), "size mismatch");
            prev_end = t.end;
        }
        assert!(h.unused_bytes <= h.data_len);
    }
    if let Ok(ix) = super::index::parse_index("fuzz.index.json", data) {
        for s in ix.weight_map.values() {
            assert!(
                !s.starts_with('/') && !s.split('/').any(|c| c == ".."),
                "unsafe shard path accepted"
            );
        }
    }
}
