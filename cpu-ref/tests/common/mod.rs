//! Shared helpers for the cpu-ref integration tests.
#![allow(dead_code)]

use m3_core::backend::{forward_by_ops, Path, RunOptions, StepBatch, TapData, TapRequest, Taps};
use m3_core::config::ModelConfig;
use m3_core::kv::{CacheDtype, KvCache, KvLayout};
use m3_core::weights::ModelWeights;
use m3_cpu_ref::synthetic::{self, Formats};
use m3_cpu_ref::CpuBackend;

pub const PAGE: usize = 16;
pub const PAGES: usize = 12;

pub fn tiny() -> ModelConfig {
    ModelConfig::preset("tiny").expect("tiny preset")
}

pub fn model(cfg: &ModelConfig, f: Formats) -> ModelWeights {
    synthetic::model(cfg, f, 42).expect("synthetic model")
}

/// A deliberately non-identity block table (pages in reverse order), so a
/// slot-mapping bug cannot hide behind identity paging.
pub fn block_table(n_positions: usize) -> Vec<u32> {
    let n = n_positions.div_ceil(PAGE);
    assert!(n <= PAGES);
    (0..n as u32).map(|i| PAGES as u32 - 1 - i).collect()
}

pub fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(salt * 977) >> 7) % 500 + 3)
        .collect()
}

pub fn cache(m: &ModelWeights, dtype: CacheDtype) -> KvCache {
    KvCache::new(
        m,
        KvLayout {
            page_size: PAGE,
            num_pages: PAGES,
            dtype,
        },
    )
    .unwrap()
}

/// One prefill of `toks` with every row's logits; returns the taps.
pub fn prefill(
    m: &ModelWeights,
    toks: &[u32],
    dtype: CacheDtype,
    opts: RunOptions,
    req: TapRequest,
) -> Taps {
    let mut c = cache(m, dtype);
    let step = StepBatch::contiguous(1, toks, 0, &block_table(toks.len()), PAGE, true);
    let mut taps = Taps::new(req);
    forward_by_ops(
        &CpuBackend,
        m,
        &mut c,
        &step,
        Path::Standard,
        &opts,
        &mut taps,
    )
    .expect("forward");
    taps
}

/// Compare two tap sets bit for bit; the first difference as an error.
pub fn taps_bit_equal(a: &Taps, b: &Taps) -> Result<(), String> {
    if a.tensors.len() != b.tensors.len() {
        return Err(format!(
            "{} vs {} tensors",
            a.tensors.len(),
            b.tensors.len()
        ));
    }
    for (name, ta) in &a.tensors {
        let tb = b.tensors.get(name).ok_or(format!("{name} missing"))?;
        if ta.shape != tb.shape {
            return Err(format!("{name}: shape {:?} vs {:?}", ta.shape, tb.shape));
        }
        match (&ta.data, &tb.data) {
            (TapData::F32(x), TapData::F32(y)) => {
                if let Some(i) = x
                    .iter()
                    .zip(y)
                    .position(|(p, q)| p.to_bits() != q.to_bits())
                {
                    return Err(format!("{name}[{i}]: {} vs {}", x[i], y[i]));
                }
            }
            (TapData::I32(x), TapData::I32(y)) => {
                if let Some(i) = x.iter().zip(y).position(|(p, q)| p != q) {
                    return Err(format!("{name}[{i}]: {} vs {}", x[i], y[i]));
                }
            }
            _ => return Err(format!("{name}: dtype differs")),
        }
    }
    Ok(())
}

/// Relative L2 error `|a - b| / |b|` (f64).
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

pub fn pool(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .expect("pool")
}

/// An op-level golden case, `golden/cases/ops/<file>` (written by
/// golden/gen/reference.py): its tensors as raw little-endian bytes.
pub struct OpCase(m3_core::checkpoint::safetensors_file::SafetensorsFile);

impl OpCase {
    /// Open `golden/cases/ops/<file>` (a missing or corrupt case fails the
    /// test, naming the file).
    pub fn open(file: &str) -> Self {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../golden/cases/ops")
            .join(file);
        OpCase(
            m3_core::checkpoint::safetensors_file::SafetensorsFile::open(&path, file)
                .unwrap_or_else(|e| panic!("{file}: {e}")),
        )
    }

    /// Tensor `name`: (shape, bytes).
    pub fn raw(&self, name: &str) -> (Vec<usize>, Vec<u8>) {
        let i = self
            .0
            .info(name)
            .unwrap_or_else(|| panic!("case lacks {name}"));
        (i.shape.clone(), self.0.bytes(i).to_vec())
    }

    /// Tensor `name` as f32 values.
    pub fn f32s(&self, name: &str) -> Vec<f32> {
        self.raw(name)
            .1
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}
