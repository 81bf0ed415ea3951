//! Test helpers: build small checkpoints in a temp dir, byte by byte, so
//! tests can break them in precise ways. The safetensors writer here is
//! deliberately independent of m3's own writer.
#![allow(dead_code)]

use std::path::Path;

use m3_core::checkpoint::names::{
    sibling, TensorNames, INPUT_SCALE, WEIGHT_SCALE, WEIGHT_SCALE_2, WEIGHT_SCALE_INV,
};
use m3_core::config::{AttnKind, MlpKind, ModelConfig};
use serde_json::{json, Value};

/// One tensor to write.
#[derive(Clone, Debug)]
pub struct T {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// Stored format of a family of linear weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fmt {
    Bf16,
    Mxfp4,
    Mxfp8,
    Nvfp4,
}

/// What to build.
#[derive(Clone, Debug)]
pub struct Spec {
    pub cfg: ModelConfig,
    pub prefix: bool,
    pub experts: Fmt,
    pub attn: Fmt,
    pub quant: Option<Value>,
    pub shards: usize,
}

impl Spec {
    /// `tiny` with 2 layers (1 dense, 1 MoE), MXFP4 experts, MXFP8
    /// attention, bf16 rest, `language_model.` prefix, 2 shards.
    pub fn tiny() -> Spec {
        Spec {
            cfg: ModelConfig::preset("tiny").unwrap().with_layers(2).unwrap(),
            prefix: true,
            experts: Fmt::Mxfp4,
            attn: Fmt::Mxfp8,
            quant: None,
            shards: 2,
        }
    }
}

/// Deterministic bytes (xorshift), so data is not all zeros.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// Bytes in [lo, hi].
    pub fn range(&mut self, n: usize, lo: u8, hi: u8) -> Vec<u8> {
        (0..n)
            .map(|_| lo + (self.next() % (hi - lo + 1) as u64) as u8)
            .collect()
    }
    /// bf16 bits of values in about [-1, 1].
    pub fn bf16(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 * n);
        for _ in 0..n {
            let x = ((self.next() % 2001) as f32 - 1000.0) / 1000.0;
            out.extend_from_slice(&((x.to_bits() >> 16) as u16).to_le_bytes());
        }
        out
    }
}

fn linear(out: &mut Vec<T>, rng: &mut Rng, name: String, rows: usize, cols: usize, fmt: Fmt) {
    match fmt {
        Fmt::Bf16 => out.push(T {
            name,
            dtype: "BF16",
            shape: vec![rows, cols],
            data: rng.bf16(rows * cols),
        }),
        Fmt::Mxfp4 => {
            out.push(T {
                name: sibling(&name, WEIGHT_SCALE),
                dtype: "U8",
                shape: vec![rows, cols / 32],
                data: rng.range(rows * cols / 32, 118, 126),
            });
            out.push(T {
                name,
                dtype: "U8",
                shape: vec![rows, cols / 2],
                data: rng.bytes(rows * cols / 2),
            });
        }
        Fmt::Mxfp8 => {
            // E4M3 codes without the NaN codes 0x7F / 0xFF.
            let codes = rng
                .bytes(rows * cols)
                .into_iter()
                .map(|b| if b & 0x7F == 0x7F { 0 } else { b })
                .collect();
            out.push(T {
                name: sibling(&name, WEIGHT_SCALE_INV),
                dtype: "U8",
                shape: vec![rows, cols / 32],
                data: rng.range(rows * cols / 32, 118, 126),
            });
            out.push(T {
                name,
                dtype: "F8_E4M3",
                shape: vec![rows, cols],
                data: codes,
            });
        }
        Fmt::Nvfp4 => {
            out.push(T {
                name: sibling(&name, WEIGHT_SCALE),
                dtype: "F8_E4M3",
                shape: vec![rows, cols / 16],
                data: rng.range(rows * cols / 16, 0x30, 0x50),
            });
            out.push(T {
                name: sibling(&name, WEIGHT_SCALE_2),
                dtype: "F32",
                shape: vec![],
                data: 0.01f32.to_le_bytes().to_vec(),
            });
            out.push(T {
                name: sibling(&name, INPUT_SCALE),
                dtype: "F32",
                shape: vec![],
                data: 1.0f32.to_le_bytes().to_vec(),
            });
            out.push(T {
                name,
                dtype: "U8",
                shape: vec![rows, cols / 2],
                data: rng.bytes(rows * cols / 2),
            });
        }
    }
}

fn vector(out: &mut Vec<T>, rng: &mut Rng, name: String, n: usize) {
    out.push(T {
        name,
        dtype: "BF16",
        shape: vec![n],
        data: rng.bf16(n),
    });
}

/// Every tensor of `spec`, grouped by layer (group 0: embed; last: head).
pub fn tensors(spec: &Spec) -> Vec<Vec<T>> {
    let c = &spec.cfg;
    let n = TensorNames::new(spec.prefix);
    let mut rng = Rng::new(0x5eed);
    let h = c.hidden_size;
    let mut groups = Vec::new();
    let mut g = Vec::new();
    linear(&mut g, &mut rng, n.embed(), c.vocab_size, h, Fmt::Bf16);
    groups.push(g);
    for l in 0..c.num_hidden_layers {
        let ln = n.layer(l);
        let mut g = Vec::new();
        let (qd, kvd) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        vector(&mut g, &mut rng, ln.input_layernorm(), h);
        vector(&mut g, &mut rng, ln.post_attention_layernorm(), h);
        linear(&mut g, &mut rng, ln.q_proj(), qd, h, spec.attn);
        linear(&mut g, &mut rng, ln.k_proj(), kvd, h, spec.attn);
        linear(&mut g, &mut rng, ln.v_proj(), kvd, h, spec.attn);
        linear(&mut g, &mut rng, ln.o_proj(), h, qd, spec.attn);
        vector(&mut g, &mut rng, ln.q_norm(), c.head_dim);
        vector(&mut g, &mut rng, ln.k_norm(), c.head_dim);
        if c.attn_kinds[l] == AttnKind::Sparse {
            let di = c.index_head_dim;
            linear(
                &mut g,
                &mut rng,
                ln.index_q_proj(),
                c.index_n_heads * di,
                h,
                spec.attn,
            );
            linear(&mut g, &mut rng, ln.index_k_proj(), di, h, spec.attn);
            vector(&mut g, &mut rng, ln.index_q_norm(), di);
            vector(&mut g, &mut rng, ln.index_k_norm(), di);
        }
        let mlp = |g: &mut Vec<T>,
                   rng: &mut Rng,
                   m: m3_core::checkpoint::names::MlpNames,
                   w: usize,
                   f: Fmt| {
            linear(g, rng, m.gate(), w, h, f);
            linear(g, rng, m.up(), w, h, f);
            linear(g, rng, m.down(), h, w, f);
        };
        match c.mlp_kinds[l] {
            MlpKind::Dense => mlp(
                &mut g,
                &mut rng,
                ln.dense_mlp(),
                c.dense_intermediate_size,
                spec.attn,
            ),
            MlpKind::Moe => {
                g.push(T {
                    name: ln.router(),
                    dtype: "F32",
                    shape: vec![c.num_local_experts, h],
                    data: rng.range(c.num_local_experts * h * 4, 0, 60),
                });
                g.push(T {
                    name: ln.correction_bias(),
                    dtype: "F32",
                    shape: vec![c.num_local_experts],
                    data: vec![0; 4 * c.num_local_experts],
                });
                for e in 0..c.num_local_experts {
                    mlp(
                        &mut g,
                        &mut rng,
                        ln.expert(e),
                        c.intermediate_size,
                        spec.experts,
                    );
                }
                if c.shared_intermediate_size > 0 {
                    mlp(
                        &mut g,
                        &mut rng,
                        ln.shared_expert(),
                        c.shared_intermediate_size,
                        spec.attn,
                    );
                }
            }
        }
        groups.push(g);
    }
    let mut g = Vec::new();
    vector(&mut g, &mut rng, n.final_norm(), h);
    linear(&mut g, &mut rng, n.lm_head(), c.vocab_size, h, Fmt::Bf16);
    groups.push(g);
    groups
}

/// The bytes of a safetensors file holding `ts` in order.
pub fn safetensors_bytes(ts: &[T]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for t in ts {
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.data.len()]}),
        );
        off += t.data.len();
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    raw_file(
        &h,
        &ts.iter().flat_map(|t| t.data.clone()).collect::<Vec<u8>>(),
    )
}

/// A file made of a given header text and data area.
pub fn raw_file(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

pub fn shard_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
}

/// Write `groups` into `dir` as `spec.shards` shards + index + config.json
/// (groups are dealt round-robin-free: contiguous runs per shard).
pub fn write_dir(dir: &Path, spec: &Spec, groups: &[Vec<T>]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut cfg: Value = serde_json::from_str(&spec.cfg.to_json()).unwrap();
    if let Some(q) = &spec.quant {
        cfg["quantization_config"] = q.clone();
    }
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&cfg).unwrap(),
    )
    .unwrap();
    let per = groups.len().div_ceil(spec.shards);
    let mut weight_map = serde_json::Map::new();
    for (i, chunk) in groups.chunks(per).enumerate() {
        let ts: Vec<T> = chunk.iter().flatten().cloned().collect();
        let name = shard_name(i, spec.shards);
        for t in &ts {
            weight_map.insert(t.name.clone(), Value::from(name.clone()));
        }
        std::fs::write(dir.join(&name), safetensors_bytes(&ts)).unwrap();
    }
    let index = json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index).unwrap(),
    )
    .unwrap();
}

/// Build the default tiny checkpoint in a fresh temp dir.
pub fn build(spec: &Spec) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    write_dir(d.path(), spec, &tensors(spec));
    d
}

/// Build with an edit applied to the tensor list first.
pub fn build_with(spec: &Spec, edit: impl FnOnce(&mut Vec<Vec<T>>)) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let mut g = tensors(spec);
    edit(&mut g);
    write_dir(d.path(), spec, &g);
    d
}

/// Find a tensor by name suffix (panics in the test if absent).
pub fn find<'a>(groups: &'a mut [Vec<T>], suffix: &str) -> &'a mut T {
    groups
        .iter_mut()
        .flatten()
        .find(|t| t.name.ends_with(suffix))
        .unwrap_or_else(|| panic!("no tensor {suffix}"))
}

/// Assert `msg` is one line mentioning every needle.
pub fn assert_names(msg: &str, needles: &[&str]) {
    assert!(!msg.contains('\n'), "not one line: {msg}");
    for n in needles {
        assert!(msg.contains(n), "`{msg}` should mention `{n}`");
    }
}
