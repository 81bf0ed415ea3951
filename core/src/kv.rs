//! Paged KV cache and index cache (MODEL.md 3.5-3.6).
//!
//! Layout: the cache of every layer is an array of *slots*; slot
//! `page * page_size + offset` holds one position of one sequence (see
//! `backend::StepBatch` for how positions map to slots). Per layer:
//! - `k`, `v`: `[slots, kv_heads * head_dim]`, head-major inside a slot;
//! - `index_k` (sparse layers only): `[slots, index_head_dim]`.
//!
//! Element dtype, each with the tensor's per-tensor scale (checkpoint
//! `k_scale`, `v_scale`, `index_k_scale`, default 1.0):
//! - `bf16` (exact for the bf16-rounded K/V of MODEL.md; the scale unused);
//! - `fp8_e4m3`: stored `e4m3(x / scale)` (saturating RNE,
//!   `formats::convert::cache_cast_e4m3`), read `e4m3 * scale`;
//! - `nvfp4` (ARCHITECTURE.md, *NVFP4 KV cache*): each row in blocks of 16,
//!   E2M1 codes packed two a byte plus one E4M3 block scale per 16, the
//!   per-tensor scale as NVFP4's global scale
//!   (`formats::convert::cache_store_nvfp4` / `cache_load_nvfp4`); 9/16 of a
//!   byte per element.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use crate::config::AttnKind;
use crate::formats::{bf16, convert, nvfp4};
use crate::weights::ModelWeights;

/// Storage dtype of a cache tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CacheDtype {
    #[default]
    Bf16,
    /// E4M3FN with a per-tensor f32 scale.
    Fp8E4M3,
    /// NVFP4: E2M1 codes, an E4M3 scale per 16 values, the per-tensor f32
    /// scale as the global scale.
    Nvfp4,
}

impl CacheDtype {
    /// Bytes one cached row of `width` elements takes: 2 a value for bf16,
    /// 1 for fp8, and for nvfp4 half a byte a value (packed E2M1) plus one
    /// E4M3 scale byte per 16 values (9/16 of a byte a value). `width` is a
    /// multiple of 16 for nvfp4 ([`CacheTensor::new`] refuses others); a
    /// partial block would be counted whole.
    pub const fn row_bytes(self, width: usize) -> usize {
        match self {
            CacheDtype::Bf16 => 2 * width,
            CacheDtype::Fp8E4M3 => width,
            CacheDtype::Nvfp4 => width.div_ceil(2) + width.div_ceil(nvfp4::BLOCK),
        }
    }

    /// Values a cached row must be a whole number of: 1, or nvfp4's block
    /// of 16 (FORMATS.md: a row is never padded to a block).
    pub const fn block(self) -> usize {
        match self {
            CacheDtype::Bf16 | CacheDtype::Fp8E4M3 => 1,
            CacheDtype::Nvfp4 => nvfp4::BLOCK,
        }
    }

    /// The command-line spelling (`--kv-cache-dtype`).
    pub const fn name(self) -> &'static str {
        match self {
            CacheDtype::Bf16 => "bf16",
            CacheDtype::Fp8E4M3 => "fp8_e4m3",
            CacheDtype::Nvfp4 => "nvfp4",
        }
    }

    /// Parse the command-line spelling (`bf16`, `fp8_e4m3`, `nvfp4`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "bf16" => Some(CacheDtype::Bf16),
            "fp8_e4m3" | "fp8" | "e4m3" => Some(CacheDtype::Fp8E4M3),
            "nvfp4" => Some(CacheDtype::Nvfp4),
            _ => None,
        }
    }
}

/// Why a cache tensor could not be made or written. Messages name the
/// tensor (e.g. `layers.3.k`) and both numbers.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KvError {
    /// An nvfp4 row that is not a whole number of 16-value blocks.
    #[error("{tensor}: a {dtype} cache row of {width} values is not a whole number of {block}-value blocks")]
    RowWidth {
        tensor: String,
        dtype: &'static str,
        width: usize,
        block: usize,
    },
    /// A per-tensor scale that cannot scale (zero, negative, NaN, Inf).
    #[error("{tensor}: cache scale {scale} must be finite and positive")]
    Scale { tensor: String, scale: f32 },
    /// A write or copy outside the tensor, or a row of the wrong length.
    #[error("{op}: {what}")]
    Range { op: &'static str, what: String },
}

/// Geometry of a paged cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Positions per page.
    pub page_size: usize,
    /// Pages in the pool (shared by all sequences).
    pub num_pages: usize,
    /// Dtype of K, V and index keys.
    pub dtype: CacheDtype,
}

impl KvLayout {
    /// Total slots (`page_size * num_pages`).
    pub fn slots(&self) -> usize {
        self.page_size * self.num_pages
    }
}

/// The raw elements of one cache tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum CacheData {
    /// bf16 bits.
    Bf16(Vec<u16>),
    /// E4M3FN codes.
    Fp8(Vec<u8>),
    /// NVFP4: `codes` `[slots, width / 2]` (two E2M1 codes a byte, low
    /// nibble = even element), `scales` `[slots, width / 16]` (E4M3 bytes).
    Nvfp4 { codes: Vec<u8>, scales: Vec<u8> },
}

/// One cache tensor: `[slots, width]` elements plus its per-tensor scale
/// (fp8's divisor, nvfp4's global scale; unused by bf16; 1.0 by default).
#[derive(Clone, Debug, PartialEq)]
pub struct CacheTensor {
    /// Elements per slot.
    pub width: usize,
    /// Per-tensor scale: multiplies at decode (finite, positive).
    pub scale: f32,
    pub data: CacheData,
}

impl CacheTensor {
    /// A zeroed tensor of `slots` rows. Refuses a scale that is not finite
    /// and positive, and for nvfp4 a `width` that is not a multiple of 16.
    pub fn new(dtype: CacheDtype, slots: usize, width: usize, scale: f32) -> Result<Self, KvError> {
        Self::named("cache tensor", dtype, slots, width, scale)
    }

    /// [`CacheTensor::new`] whose errors name the tensor `name`.
    pub fn named(
        name: &str,
        dtype: CacheDtype,
        slots: usize,
        width: usize,
        scale: f32,
    ) -> Result<Self, KvError> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(KvError::Scale {
                tensor: name.into(),
                scale,
            });
        }
        if !width.is_multiple_of(dtype.block()) {
            return Err(KvError::RowWidth {
                tensor: name.into(),
                dtype: dtype.name(),
                width,
                block: dtype.block(),
            });
        }
        let n = slots * width;
        let data = match dtype {
            CacheDtype::Bf16 => CacheData::Bf16(vec![0; n]),
            CacheDtype::Fp8E4M3 => CacheData::Fp8(vec![0; n]),
            CacheDtype::Nvfp4 => CacheData::Nvfp4 {
                codes: vec![0; n / 2],
                scales: vec![0; n / nvfp4::BLOCK],
            },
        };
        Ok(CacheTensor { width, scale, data })
    }

    pub fn dtype(&self) -> CacheDtype {
        match self.data {
            CacheData::Bf16(_) => CacheDtype::Bf16,
            CacheData::Fp8(_) => CacheDtype::Fp8E4M3,
            CacheData::Nvfp4 { .. } => CacheDtype::Nvfp4,
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        let n = match &self.data {
            CacheData::Bf16(d) => d.len(),
            CacheData::Fp8(d) => d.len(),
            CacheData::Nvfp4 { codes, .. } => codes.len() * 2,
        };
        n.checked_div(self.width).unwrap_or(0)
    }

    /// Store `x` (`x.len() == width`) into `slot` in the tensor's dtype:
    /// bf16 RNE, `e4m3(x / scale)` saturating, or nvfp4 blocks
    /// ([`convert::cache_store_nvfp4`]).
    pub fn write(&mut self, slot: usize, x: &[f32]) -> Result<(), KvError> {
        let w = self.width;
        let slots = self.slots();
        if slot >= slots || x.len() != w {
            return Err(KvError::Range {
                op: "cache_write",
                what: format!(
                    "row of {} values into slot {slot} of a [{slots}, {w}] cache",
                    x.len()
                ),
            });
        }
        let base = slot * w;
        match &mut self.data {
            CacheData::Bf16(d) => {
                for (o, &v) in d[base..base + w].iter_mut().zip(x) {
                    *o = bf16::from_f32(v);
                }
            }
            CacheData::Fp8(d) => {
                let s = self.scale;
                for (o, &v) in d[base..base + w].iter_mut().zip(x) {
                    *o = convert::cache_cast_e4m3(v, s);
                }
            }
            CacheData::Nvfp4 { codes, scales } => {
                let b = w / nvfp4::BLOCK;
                convert::cache_store_nvfp4(
                    x,
                    self.scale,
                    &mut codes[base / 2..(base + w) / 2],
                    &mut scales[slot * b..(slot + 1) * b],
                )
                .map_err(|e| KvError::Range {
                    op: "cache_write",
                    what: e.to_string(),
                })?;
            }
        }
        Ok(())
    }

    /// Read elements `off .. off + out.len()` of `slot`, dequantized to f32.
    /// The caller keeps the range inside the tensor (`Op::check` does).
    pub fn read(&self, slot: usize, off: usize, out: &mut [f32]) {
        let base = slot * self.width + off;
        let n = out.len();
        match &self.data {
            CacheData::Bf16(d) => {
                for (o, &b) in out.iter_mut().zip(&d[base..base + n]) {
                    *o = bf16::to_f32(b);
                }
            }
            CacheData::Fp8(d) => {
                for (o, &c) in out.iter_mut().zip(&d[base..base + n]) {
                    *o = convert::cache_load_e4m3(c, self.scale);
                }
            }
            CacheData::Nvfp4 { codes, scales } => {
                let w = self.width;
                let b = w / nvfp4::BLOCK;
                let row_codes = codes.get(slot * w / 2..(slot + 1) * w / 2).unwrap_or(&[]);
                let row_scales = scales.get(slot * b..(slot + 1) * b).unwrap_or(&[]);
                convert::cache_load_nvfp4(row_codes, row_scales, self.scale, off, out);
            }
        }
    }

    /// Bytes of one slot's `n` elements (for byte accounting).
    pub fn bytes_per(&self, n: usize) -> usize {
        self.dtype().row_bytes(n)
    }

    /// Copy `n` slots starting at slot `src` to slot `dst`, raw (no
    /// requantization): the page copy of copy-on-write.
    pub fn copy_slots(&mut self, src: usize, dst: usize, n: usize) -> Result<(), KvError> {
        let slots = self.slots();
        if src.max(dst).saturating_add(n) > slots {
            return Err(KvError::Range {
                op: "copy_blocks",
                what: format!("{n} slots {src} -> {dst} outside a cache of {slots} slots"),
            });
        }
        let w = self.width;
        match &mut self.data {
            CacheData::Bf16(x) => x.copy_within(src * w..(src + n) * w, dst * w),
            CacheData::Fp8(x) => x.copy_within(src * w..(src + n) * w, dst * w),
            CacheData::Nvfp4 { codes, scales } => {
                let (c, b) = (w / 2, w / nvfp4::BLOCK);
                codes.copy_within(src * c..(src + n) * c, dst * c);
                scales.copy_within(src * b..(src + n) * b, dst * b);
            }
        }
        Ok(())
    }

    /// Grow (or shrink) the tensor to `slots` slots; new slots are zero.
    pub fn resize_slots(&mut self, slots: usize) {
        let w = self.width;
        match &mut self.data {
            CacheData::Bf16(d) => d.resize(slots * w, 0),
            CacheData::Fp8(d) => d.resize(slots * w, 0),
            CacheData::Nvfp4 { codes, scales } => {
                codes.resize(slots * w / 2, 0);
                scales.resize(slots * (w / nvfp4::BLOCK), 0);
            }
        }
    }
}

/// The caches of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerCache {
    /// `[slots, kv_heads * head_dim]`.
    pub k: CacheTensor,
    /// `[slots, kv_heads * head_dim]`.
    pub v: CacheTensor,
    /// `[slots, index_head_dim]`, sparse layers only.
    pub index_k: Option<CacheTensor>,
}

/// The paged KV + index cache of a whole model.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    pub layout: KvLayout,
    pub layers: Vec<LayerCache>,
}

impl KvCache {
    /// Allocate a zeroed cache for `model` (scales from its `k_scale`,
    /// `v_scale` and indexer `k_scale`; index caches on sparse layers only).
    /// Refuses what [`CacheTensor::named`] refuses, naming the layer's
    /// tensor (an nvfp4 cache needs `head_dim` and `index_head_dim`
    /// multiples of 16).
    pub fn new(model: &ModelWeights, layout: KvLayout) -> Result<Self, KvError> {
        let c = &model.config;
        let slots = layout.slots();
        let width = c.num_key_value_heads * c.head_dim;
        let dt = layout.dtype;
        // A head's slice of a K / V row must be whole blocks too, so that
        // no block mixes two heads (each head reads its own slice).
        if !c.head_dim.is_multiple_of(dt.block()) {
            return Err(KvError::RowWidth {
                tensor: "head_dim (one head of the K / V cache)".into(),
                dtype: dt.name(),
                width: c.head_dim,
                block: dt.block(),
            });
        }
        let mut layers = Vec::with_capacity(model.layers.len());
        for (l, lw) in model.layers.iter().enumerate() {
            let sparse = c.attn_kinds.get(l) == Some(&AttnKind::Sparse);
            let name = |t: &str| format!("layers.{l}.{t} cache");
            layers.push(LayerCache {
                k: CacheTensor::named(&name("k"), dt, slots, width, lw.attn.k_scale)?,
                v: CacheTensor::named(&name("v"), dt, slots, width, lw.attn.v_scale)?,
                index_k: match (&lw.attn.indexer, sparse) {
                    (Some(ix), true) => Some(CacheTensor::named(
                        &name("index_k"),
                        dt,
                        slots,
                        c.index_head_dim,
                        ix.k_scale,
                    )?),
                    _ => None,
                },
            });
        }
        Ok(KvCache { layout, layers })
    }

    /// Bytes of K + V + index keys stored per cached position (all layers).
    pub fn bytes_per_position(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                l.k.bytes_per(l.k.width)
                    + l.v.bytes_per(l.v.width)
                    + l.index_k.as_ref().map_or(0, |t| t.bytes_per(t.width))
            })
            .sum()
    }
}

/// A free list of cache pages (the minimal engine's allocator; the
/// scheduler in `sched` has its own, with prefix sharing).
#[derive(Clone, Debug)]
pub struct PagePool {
    free: Vec<u32>,
}

impl PagePool {
    /// All of `num_pages` free; pages are handed out lowest id first.
    pub fn new(num_pages: usize) -> Self {
        PagePool {
            free: (0..num_pages as u32).rev().collect(),
        }
    }

    /// Free pages left.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Grow `table` until it covers `positions` positions; `false` (and
    /// `table` unchanged) when the pool runs out.
    pub fn ensure(&mut self, table: &mut Vec<u32>, positions: usize, page_size: usize) -> bool {
        let need = positions.div_ceil(page_size);
        if need <= table.len() {
            return true;
        }
        if need - table.len() > self.free.len() {
            return false;
        }
        while table.len() < need {
            if let Some(p) = self.free.pop() {
                table.push(p);
            }
        }
        true
    }

    /// Return a sequence's pages.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        while let Some(p) = table.pop() {
            self.free.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_pool_grows_tables_and_refuses_when_empty() {
        let mut pool = PagePool::new(3);
        let mut a = Vec::new();
        assert!(pool.ensure(&mut a, 5, 4)); // 2 pages
        assert_eq!(a, [0, 1]);
        assert!(pool.ensure(&mut a, 8, 4)); // still 2
        let mut b = Vec::new();
        assert!(!pool.ensure(&mut b, 9, 4)); // needs 3, 1 left
        assert!(b.is_empty() && pool.available() == 1);
        pool.release(&mut a);
        assert!(pool.ensure(&mut b, 9, 4));
        assert_eq!(b.len(), 3);
    }

    #[test]
    fn bf16_cache_round_trips_bf16_values() {
        let mut c = CacheTensor::new(CacheDtype::Bf16, 2, 2, 1.0).unwrap();
        c.write(1, &[1.5, -3.0]).unwrap();
        let mut out = [0.0f32; 1];
        c.read(1, 1, &mut out);
        assert_eq!(out, [-3.0]);
        assert_eq!(c.slots(), 2);
    }
}
