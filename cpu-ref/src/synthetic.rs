//! In-memory synthetic weights for tests and `m3 bench` (no checkpoint on
//! disk): a deterministic generator keyed by (seed, tensor name), any
//! preset, routed experts and the other linears in a chosen format.
//! (The on-disk synthetic checkpoint is `m3 synth`'s job; this one only
//! needs to be reproducible and to exercise every format.)

use m3_core::config::{AttnKind, MlpKind, ModelConfig};
use m3_core::formats::{bf16, FormatError, MxElem, MxTensor, Nvfp4Tensor, ScaleRule};
use m3_core::weights::{
    AttnWeights, FfnWeights, IndexerWeights, LayerWeights, LinearWeight, MlpWeights, ModelWeights,
    MoeWeights,
};

/// Storage format of a generated linear weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    Bf16,
    F32,
    /// MXFP8 with E4M3 elements.
    Mxfp8,
    /// MXFP8 with E5M2 elements.
    Mxfp8E5M2,
    Mxfp4,
    Nvfp4,
}

/// Formats of the two weight families of MODEL.md 5.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Formats {
    /// Routed experts.
    pub experts: WeightFormat,
    /// Attention, indexer, dense MLP, shared expert.
    pub dense: WeightFormat,
}

impl Default for Formats {
    fn default() -> Self {
        Formats {
            experts: WeightFormat::Bf16,
            dense: WeightFormat::Bf16,
        }
    }
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn name_key(seed: u64, name: &str) -> u64 {
    let mut h = mix64(seed ^ 0xA076_1D64_78BD_642F);
    for b in name.bytes() {
        h = mix64(h ^ b as u64);
    }
    h
}

/// `n` values uniform in `[-amp, amp)`, keyed by (seed, name).
pub fn uniform(seed: u64, name: &str, n: usize, amp: f32) -> Vec<f32> {
    let k = name_key(seed, name);
    (0..n as u64)
        .map(|i| {
            let u = (mix64(k.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))) >> 40) as f32
                / (1u64 << 24) as f32;
            (2.0 * u - 1.0) * amp
        })
        .collect()
}

/// A `[rows, cols]` weight with values ~ U(-amp, amp) stored in `fmt`.
pub fn linear(
    seed: u64,
    name: &str,
    rows: usize,
    cols: usize,
    amp: f32,
    fmt: WeightFormat,
) -> Result<LinearWeight, FormatError> {
    let x = uniform(seed, name, rows * cols, amp);
    Ok(match fmt {
        WeightFormat::Bf16 => LinearWeight::Bf16 {
            rows,
            cols,
            data: x.iter().map(|&v| bf16::from_f32(v)).collect(),
        },
        WeightFormat::F32 => LinearWeight::F32 {
            rows,
            cols,
            data: x,
        },
        WeightFormat::Mxfp8 => LinearWeight::Mx(MxTensor::quantize(
            &x,
            rows,
            cols,
            MxElem::Fp8E4M3,
            ScaleRule::Floor,
        )?),
        WeightFormat::Mxfp8E5M2 => LinearWeight::Mx(MxTensor::quantize(
            &x,
            rows,
            cols,
            MxElem::Fp8E5M2,
            ScaleRule::Floor,
        )?),
        WeightFormat::Mxfp4 => LinearWeight::Mx(MxTensor::quantize(
            &x,
            rows,
            cols,
            MxElem::Fp4E2M1,
            ScaleRule::Floor,
        )?),
        WeightFormat::Nvfp4 => LinearWeight::Nvfp4(Nvfp4Tensor::quantize(&x, rows, cols)?),
    })
}

fn mlp(
    seed: u64,
    p: &str,
    width: usize,
    h: usize,
    fmt: WeightFormat,
) -> Result<MlpWeights, FormatError> {
    Ok(MlpWeights {
        gate: linear(
            seed,
            &format!("{p}.gate"),
            width,
            h,
            1.0 / (h as f32).sqrt() * 1.7,
            fmt,
        )?,
        up: linear(
            seed,
            &format!("{p}.up"),
            width,
            h,
            1.0 / (h as f32).sqrt() * 1.7,
            fmt,
        )?,
        down: linear(
            seed,
            &format!("{p}.down"),
            h,
            width,
            1.0 / (width as f32).sqrt() * 1.7,
            fmt,
        )?,
    })
}

/// Generate a whole model for `config`.
pub fn model(
    config: &ModelConfig,
    formats: Formats,
    seed: u64,
) -> Result<ModelWeights, FormatError> {
    let c = config;
    let h = c.hidden_size;
    let a_in = 1.7 / (h as f32).sqrt();
    let norm = |name: &str, n: usize| uniform(seed, name, n, 0.2);
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let p = format!("layers.{l}");
        let df = formats.dense;
        let indexer = if c.attn_kinds[l] == AttnKind::Sparse {
            Some(IndexerWeights {
                q: linear(
                    seed,
                    &format!("{p}.iq"),
                    c.index_n_heads * c.index_head_dim,
                    h,
                    a_in,
                    df,
                )?,
                k: linear(seed, &format!("{p}.ik"), c.index_head_dim, h, a_in, df)?,
                q_norm: norm(&format!("{p}.iqn"), c.index_head_dim),
                k_norm: norm(&format!("{p}.ikn"), c.index_head_dim),
                k_scale: 1.0,
            })
        } else {
            None
        };
        let attn = AttnWeights {
            q: linear(
                seed,
                &format!("{p}.q"),
                c.num_attention_heads * c.head_dim,
                h,
                a_in,
                df,
            )?,
            k: linear(
                seed,
                &format!("{p}.k"),
                c.num_key_value_heads * c.head_dim,
                h,
                a_in,
                df,
            )?,
            v: linear(
                seed,
                &format!("{p}.v"),
                c.num_key_value_heads * c.head_dim,
                h,
                a_in,
                df,
            )?,
            o: linear(
                seed,
                &format!("{p}.o"),
                h,
                c.num_attention_heads * c.head_dim,
                1.7 / ((c.num_attention_heads * c.head_dim) as f32).sqrt(),
                df,
            )?,
            q_norm: norm(&format!("{p}.qn"), c.head_dim),
            k_norm: norm(&format!("{p}.kn"), c.head_dim),
            indexer,
            k_scale: 1.0,
            v_scale: 1.0,
        };
        let ffn = match c.mlp_kinds[l] {
            MlpKind::Dense => FfnWeights::Dense(mlp(
                seed,
                &format!("{p}.mlp"),
                c.dense_intermediate_size,
                h,
                df,
            )?),
            MlpKind::Moe => FfnWeights::Moe(MoeWeights {
                router: linear(
                    seed,
                    &format!("{p}.router"),
                    c.num_local_experts,
                    h,
                    a_in,
                    WeightFormat::F32,
                )?,
                correction_bias: uniform(seed, &format!("{p}.bias"), c.num_local_experts, 0.05),
                experts: (0..c.num_local_experts)
                    .map(|e| {
                        mlp(
                            seed,
                            &format!("{p}.e{e}"),
                            c.intermediate_size,
                            h,
                            formats.experts,
                        )
                    })
                    .collect::<Result<_, _>>()?,
                shared: if c.shared_intermediate_size > 0 {
                    Some(mlp(
                        seed,
                        &format!("{p}.shared"),
                        c.shared_intermediate_size,
                        h,
                        df,
                    )?)
                } else {
                    None
                },
            }),
        };
        layers.push(LayerWeights {
            input_norm: norm(&format!("{p}.in"), h),
            post_attn_norm: norm(&format!("{p}.post"), h),
            attn,
            ffn,
            ptpc: Default::default(),
        });
    }
    Ok(ModelWeights {
        config: c.clone(),
        embed: linear(seed, "embed", c.vocab_size, h, 1.0, WeightFormat::Bf16)?,
        layers,
        final_norm: norm("final_norm", h),
        lm_head: linear(seed, "lm_head", c.vocab_size, h, a_in, WeightFormat::Bf16)?,
    })
}
