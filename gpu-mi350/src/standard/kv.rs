//! The paged KV and index caches on the device, and copy-on-write.
//!
//! One pool of `num_pages` blocks of `page_size` positions, shared by every
//! layer (the scheduler's block ids index all of them). Per layer:
//! `k`, `v` `[slots, kv_heads * head_dim]` and, on sparse layers, the index
//! keys `[slots, index_head_dim]`, in the cache dtype (bf16 bits or E4M3
//! codes with the layer's per-tensor scale; MODEL.md 3.5). The layout is
//! `m3_core::kv`'s, so a block copy is a byte copy.

use m3_core::config::{AttnKind, ModelConfig};
use m3_core::kv::CacheDtype;

use super::launch::Launcher;
use crate::error::{GpuError, Result};
use crate::model::DevBuf;
use crate::runtime::api::Device;

/// The caches of one layer.
pub struct LayerKv {
    pub k: DevBuf,
    pub v: DevBuf,
    /// Index keys (sparse layers only).
    pub ik: Option<DevBuf>,
}

/// Every layer's caches.
pub struct DevKv {
    pub layers: Vec<LayerKv>,
    pub page_size: usize,
    pub num_pages: usize,
    pub dtype: CacheDtype,
}

impl DevKv {
    /// Bytes one block takes across every layer (K, V and index keys).
    pub fn block_bytes(c: &ModelConfig, page_size: usize, dtype: CacheDtype) -> usize {
        let kv = 2 * dtype.row_bytes(c.num_key_value_heads * c.head_dim);
        (0..c.num_hidden_layers)
            .map(|l| {
                let ik = if c.attn_kinds.get(l) == Some(&AttnKind::Sparse) {
                    dtype.row_bytes(c.index_head_dim)
                } else {
                    0
                };
                page_size * (kv + ik)
            })
            .sum()
    }

    /// Allocate `num_pages` zeroed blocks for every layer of `c`.
    pub fn new(
        ctx: &Device,
        c: &ModelConfig,
        page_size: usize,
        num_pages: usize,
        dtype: CacheDtype,
    ) -> Result<Self> {
        if page_size == 0 || num_pages == 0 {
            return Err(GpuError::input(
                "kv cache",
                format!("{num_pages} blocks of {page_size} positions"),
            ));
        }
        if dtype == CacheDtype::Nvfp4 {
            return Err(GpuError::input(
                "kv cache",
                "--kv-cache-dtype nvfp4: the device has no NVFP4 cache kernels yet (CPU reference only)",
            ));
        }
        let slots = page_size * num_pages;
        let e = dtype.row_bytes(1);
        let width = c.num_key_value_heads * c.head_dim;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let sparse = c.attn_kinds.get(l) == Some(&AttnKind::Sparse);
            layers.push(LayerKv {
                k: DevBuf::zeroed(ctx, slots * width * e)?,
                v: DevBuf::zeroed(ctx, slots * width * e)?,
                ik: if sparse {
                    Some(DevBuf::zeroed(ctx, slots * c.index_head_dim * e)?)
                } else {
                    None
                },
            });
        }
        Ok(DevKv {
            layers,
            page_size,
            num_pages,
            dtype,
        })
    }

    /// Device bytes of every cache.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.k.bytes() + l.v.bytes() + l.ik.as_ref().map_or(0, |b| b.bytes()))
            .sum()
    }

    /// Copy every slot of block `src` into block `dst` in every tensor,
    /// in order on the launcher's stream (a later step sees the copies).
    pub fn copy_blocks(&self, l: &Launcher, pairs: &[(u32, u32)]) -> Result<()> {
        for &(src, dst) in pairs {
            if src as usize >= self.num_pages || dst as usize >= self.num_pages {
                return Err(GpuError::input(
                    "copy_blocks",
                    format!(
                        "block copy {src} -> {dst} outside the pool of {} blocks",
                        self.num_pages
                    ),
                ));
            }
            for layer in &self.layers {
                for t in [Some(&layer.k), Some(&layer.v), layer.ik.as_ref()]
                    .into_iter()
                    .flatten()
                {
                    let block = t.bytes() / self.num_pages;
                    l.copy(
                        t.at(dst as usize * block),
                        t.at(src as usize * block),
                        block,
                    )?;
                }
            }
        }
        Ok(())
    }
}
