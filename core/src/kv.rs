//! Paged KV cache and index cache (MODEL.md 3.5-3.6).
//!
//! Layout: the cache of every layer is an array of *slots*; slot
//! `page * page_size + offset` holds one position of one sequence (see
//! `backend::StepBatch` for how positions map to slots). Per layer:
//! - `k`, `v`: `[slots, kv_heads * head_dim]`, head-major inside a slot;
//! - `index_k` (sparse layers only): `[slots, index_head_dim]`.
//!
//! Element dtype is `bf16` (exact for the bf16-rounded K/V of MODEL.md) or
//! `fp8_e4m3` with a per-tensor scale: stored `e4m3(x / scale)` (saturating
//! RNE, `formats::convert::cache_cast_e4m3`), read `e4m3 * scale`.

use alloc::vec;
use alloc::vec::Vec;

use crate::config::AttnKind;
use crate::formats::{bf16, convert};
use crate::weights::ModelWeights;

/// Storage dtype of a cache tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CacheDtype {
    #[default]
    Bf16,
    /// E4M3FN with a per-tensor f32 scale.
    Fp8E4M3,
}

impl CacheDtype {
    /// Bytes per element.
    pub const fn bytes(self) -> usize {
        match self {
            CacheDtype::Bf16 => 2,
            CacheDtype::Fp8E4M3 => 1,
        }
    }

    /// Parse the command-line spelling (`bf16`, `fp8_e4m3`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "bf16" => Some(CacheDtype::Bf16),
            "fp8_e4m3" | "fp8" | "e4m3" => Some(CacheDtype::Fp8E4M3),
            _ => None,
        }
    }
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
}

/// One cache tensor: `[slots, width]` elements plus its per-tensor scale
/// (used by fp8 only; 1.0 by default).
#[derive(Clone, Debug, PartialEq)]
pub struct CacheTensor {
    /// Elements per slot.
    pub width: usize,
    pub scale: f32,
    pub data: CacheData,
}

impl CacheTensor {
    /// A zeroed tensor of `slots` rows.
    pub fn new(dtype: CacheDtype, slots: usize, width: usize, scale: f32) -> Self {
        let data = match dtype {
            CacheDtype::Bf16 => CacheData::Bf16(vec![0; slots * width]),
            CacheDtype::Fp8E4M3 => CacheData::Fp8(vec![0; slots * width]),
        };
        CacheTensor { width, scale, data }
    }

    pub fn dtype(&self) -> CacheDtype {
        match self.data {
            CacheData::Bf16(_) => CacheDtype::Bf16,
            CacheData::Fp8(_) => CacheDtype::Fp8E4M3,
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        let n = match &self.data {
            CacheData::Bf16(d) => d.len(),
            CacheData::Fp8(d) => d.len(),
        };
        n.checked_div(self.width).unwrap_or(0)
    }

    /// Store `x` (`x.len() == width`) into `slot` in the tensor's dtype:
    /// bf16 RNE, or `e4m3(x / scale)` saturating.
    pub fn write(&mut self, slot: usize, x: &[f32]) {
        let w = self.width;
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
        }
    }

    /// Read elements `off .. off + out.len()` of `slot`, dequantized to f32.
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
        }
    }

    /// Bytes of one slot's `n` elements (for byte accounting).
    pub fn bytes_per(&self, n: usize) -> usize {
        n * self.dtype().bytes()
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
    pub fn new(model: &ModelWeights, layout: KvLayout) -> Self {
        let c = &model.config;
        let slots = layout.slots();
        let width = c.num_key_value_heads * c.head_dim;
        let layers = model
            .layers
            .iter()
            .enumerate()
            .map(|(l, lw)| {
                let sparse = c.attn_kinds.get(l) == Some(&AttnKind::Sparse);
                LayerCache {
                    k: CacheTensor::new(layout.dtype, slots, width, lw.attn.k_scale),
                    v: CacheTensor::new(layout.dtype, slots, width, lw.attn.v_scale),
                    index_k: match (&lw.attn.indexer, sparse) {
                        (Some(ix), true) => Some(CacheTensor::new(
                            layout.dtype,
                            slots,
                            c.index_head_dim,
                            ix.k_scale,
                        )),
                        _ => None,
                    },
                }
            })
            .collect();
        KvCache { layout, layers }
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
        let mut c = CacheTensor::new(CacheDtype::Bf16, 2, 2, 1.0);
        c.write(1, &[1.5, -3.0]);
        let mut out = [0.0f32; 1];
        c.read(1, 1, &mut out);
        assert_eq!(out, [-3.0]);
        assert_eq!(c.slots(), 2);
    }
}
