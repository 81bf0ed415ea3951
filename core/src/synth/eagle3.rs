//! The synthetic EAGLE3 draft `m3 synth --eagle3` writes under `eagle3/`
//! (layout: [`crate::eagle3`]): `config.json` and one bf16 safetensors
//! shard with its index, `d2t` int64 and `t2d` bool.
//!
//! Values: linears `N(0, 1/fan_in)` (`o_proj` and `down_proj` further by
//! `1/2`, so the midlayer's residual stays near the fused state's scale),
//! Llama norm weights `1 + N(0, 0.05^2)`, each from its own RNG stream keyed
//! `eagle3/<name>`. The draft vocabulary is the target ids `2 d + (d & 1)`
//! (`d2t[d] = d + (d & 1)`): a non-trivial, injective map, so every test
//! through the synthetic draft exercises it.

use std::path::Path;
use std::vec::Vec;

use super::rng::Stream;
use super::SynthError;
use crate::checkpoint::writer::{self, Dtype, ShardWriter, TensorEntry, WriteError};
use crate::eagle3::{Eagle3Config, Eagle3Names as N, DIR};
use crate::formats::bf16;

/// One tensor to write: name, shape and little-endian bytes.
struct Tensor {
    name: &'static str,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn normal_bf16(seed: u64, name: &'static str, shape: &[usize], std: f64, mean: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut v = vec![0.0f32; n];
    Stream::new(seed, &format!("{DIR}/{name}")).fill_normal(0, std, &mut v);
    Tensor {
        name,
        dtype: Dtype::BF16,
        shape: shape.to_vec(),
        bytes: v
            .iter()
            .flat_map(|&x| bf16::from_f32(x + mean).to_le_bytes())
            .collect(),
    }
}

/// The synthetic `d2t` offsets: draft id `d` is target id `2 d + (d & 1)`.
pub fn synth_d2t(draft_vocab: usize) -> Vec<i64> {
    (0..draft_vocab as i64).map(|d| d + (d & 1)).collect()
}

/// Write the draft `c` into `root/eagle3/` (which must not exist).
/// Returns the bytes of tensor data written.
pub fn write_eagle3(root: &Path, c: &Eagle3Config, seed: u64) -> Result<u64, SynthError> {
    let d2t = synth_d2t(c.draft_vocab_size);
    let map = c
        .draft_to_target(&d2t)
        .map_err(|e| SynthError::Invalid(format!("eagle3: {e}")))?;
    let h = c.hidden_size;
    let hd = c.head_dim();
    let (qd, kvd, im) = (
        c.num_attention_heads * hd,
        c.num_key_value_heads * hd,
        c.intermediate_size,
    );
    let inv = |n: usize| 1.0 / (n as f64).sqrt();
    let norm = |name| normal_bf16(seed, name, &[h], 0.05, 1.0);
    let mut t2d = vec![0u8; c.vocab_size];
    for &t in &map {
        t2d[t as usize] = 1;
    }
    let tensors = vec![
        normal_bf16(seed, N::FC, &[h, c.fc_in()], inv(c.fc_in()), 0.0),
        norm(N::INPUT_LAYERNORM),
        norm(N::HIDDEN_NORM),
        normal_bf16(seed, N::Q_PROJ, &[qd, 2 * h], inv(2 * h), 0.0),
        normal_bf16(seed, N::K_PROJ, &[kvd, 2 * h], inv(2 * h), 0.0),
        normal_bf16(seed, N::V_PROJ, &[kvd, 2 * h], inv(2 * h), 0.0),
        normal_bf16(seed, N::O_PROJ, &[h, qd], 0.5 * inv(qd), 0.0),
        norm(N::POST_ATTENTION_LAYERNORM),
        normal_bf16(seed, N::GATE_PROJ, &[im, h], inv(h), 0.0),
        normal_bf16(seed, N::UP_PROJ, &[im, h], inv(h), 0.0),
        normal_bf16(seed, N::DOWN_PROJ, &[h, im], 0.5 * inv(im), 0.0),
        norm(N::NORM),
        normal_bf16(seed, N::LM_HEAD, &[c.draft_vocab_size, h], inv(h), 0.0),
        Tensor {
            name: N::D2T,
            dtype: Dtype::I64,
            shape: vec![c.draft_vocab_size],
            bytes: d2t.iter().flat_map(|x| x.to_le_bytes()).collect(),
        },
        Tensor {
            name: N::T2D,
            dtype: Dtype::Bool,
            shape: vec![c.vocab_size],
            bytes: t2d,
        },
    ];
    let dir = root.join(DIR);
    std::fs::create_dir(&dir).map_err(|source| WriteError::Io {
        path: dir.clone(),
        source,
    })?;
    writer::write_file_atomic(&dir.join("config.json"), c.to_json().as_bytes())?;
    let groups: Vec<Vec<TensorEntry>> = tensors
        .iter()
        .map(|t| vec![TensorEntry::new(t.name, t.dtype, &t.shape)])
        .collect();
    let shards = writer::plan_shards(groups, u64::MAX);
    let mut total = 0u64;
    for shard in &shards {
        let mut w = ShardWriter::create(&dir.join(&shard.file), shard)?;
        for e in &shard.tensors {
            let Some(t) = tensors.iter().find(|t| t.name == e.name) else {
                return Err(SynthError::Invalid(format!(
                    "eagle3: no data for `{}`",
                    e.name
                )));
            };
            w.write(&e.name, &t.bytes)?;
            total += t.bytes.len() as u64;
        }
        w.finish()?;
    }
    writer::write_file_atomic(
        &dir.join(writer::INDEX_FILE),
        writer::index_json(&shards)?.as_bytes(),
    )?;
    Ok(total)
}
