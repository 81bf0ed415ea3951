//! On-disk cache of compiled kernel binaries, keyed by a SHA-256 of
//! (source, target arch, compiler flags, compiler version), so a changed
//! kernel, flag or compiler never reuses a stale binary.
//!
//! Directory: `$M3_KERNEL_CACHE`, else `$XDG_CACHE_HOME/m3/kernels`, else
//! `$HOME/.cache/m3/kernels`; `M3_KERNEL_CACHE=off` disables the disk cache.
//! Files are written under a temporary name and renamed into place.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{GpuError, Result};

/// The cache key of one compiled module.
pub fn key(source: &str, arch: &str, flags: &[String], compiler: &str) -> String {
    let mut h = Sha256::new();
    for part in [source, arch, &flags.join("\u{1f}"), compiler] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The disk cache directory, or `None` when disabled or no home is known.
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var_os("M3_KERNEL_CACHE") {
        Some(v) if v == "off" || v == "0" => return None,
        Some(v) if !v.is_empty() => return Some(PathBuf::from(v)),
        _ => {}
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("m3").join("kernels"));
    }
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join("m3").join("kernels"))
}

/// A directory of `<key>.<ext>` binaries.
#[derive(Clone, Debug)]
pub struct DiskCache {
    dir: PathBuf,
    ext: &'static str,
}

impl DiskCache {
    pub fn new(dir: PathBuf, ext: &'static str) -> Self {
        DiskCache { dir, ext }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.{}", self.ext))
    }

    /// The cached binary for `key`, if present and non-empty.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(key)).ok().filter(|b| !b.is_empty())
    }

    /// Whether a non-empty binary for `key` is there (without reading it).
    pub fn contains(&self, key: &str) -> bool {
        std::fs::metadata(self.path(key)).is_ok_and(|m| m.is_file() && m.len() > 0)
    }

    /// Store `bin` for `key` (temp file in the same directory, then rename).
    pub fn put(&self, key: &str, bin: &[u8]) -> Result<()> {
        let err = |p: &Path, e: std::io::Error| GpuError::Cache {
            path: p.to_path_buf(),
            msg: e.to_string(),
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| err(&self.dir, e))?;
        let fin = self.path(key);
        let tmp = self.dir.join(format!(".{key}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, bin).map_err(|e| err(&tmp, e))?;
        std::fs::rename(&tmp, &fin).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(&fin, e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_changes_with_every_part() {
        let f = vec!["--fmad=false".to_string()];
        let k = key("src", "sm_90", &f, "13.0");
        assert_eq!(k.len(), 64);
        assert_ne!(k, key("src2", "sm_90", &f, "13.0"));
        assert_ne!(k, key("src", "sm_80", &f, "13.0"));
        assert_ne!(k, key("src", "sm_90", &[], "13.0"));
        assert_ne!(k, key("src", "sm_90", &f, "13.1"));
        // part boundaries are length-prefixed: moving a byte between parts changes the key
        assert_ne!(key("ab", "c", &[], "v"), key("a", "bc", &[], "v"));
    }

    #[test]
    fn put_then_get_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::new(d.path().join("k"), "cubin");
        assert!(c.get("abc").is_none());
        c.put("abc", b"\x7fELF...").unwrap();
        assert_eq!(c.get("abc").as_deref(), Some(&b"\x7fELF..."[..]));
        // no temp file left behind
        let names: Vec<_> = std::fs::read_dir(c.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }
}
