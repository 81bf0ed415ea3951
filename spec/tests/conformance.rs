//! Every committed vector on the CPU codecs, and proof that the runner catches
//! a wrong codec: two planted errors, each of which must make exactly the
//! groups it touches fail (and no others).

use std::collections::BTreeSet;

use m3_core::formats::{MxElem, ScaleRule};
use m3_spec::{
    run, CpuOps, ElemKind, FormatOps, MxParts, Nvfp4Parts, OpError, PtpcParts, Report, VectorSet,
};

fn vectors() -> VectorSet {
    match VectorSet::load_default() {
        Ok(v) => v,
        Err(e) => panic!("loading spec/vectors: {e}"),
    }
}

#[test]
fn cpu_passes_every_vector() {
    let set = vectors();
    let report = run(&CpuOps, &set);
    println!("{}", report.table());
    assert_eq!(
        report.groups.iter().map(|g| g.vectors).sum::<usize>(),
        set.total(),
        "the runner must count every vector of the manifest"
    );
    assert!(
        report.all_passed(),
        "conformance failures:\n{}",
        report.details()
    );
}

#[test]
fn manifest_has_every_group() {
    let set = vectors();
    let names: BTreeSet<&str> = set.groups.iter().map(|g| g.name.as_str()).collect();
    for want in [
        "decode_e2m1",
        "decode_e4m3",
        "decode_e5m2",
        "decode_e8m0",
        "encode_e2m1",
        "encode_e4m3",
        "encode_e5m2",
        "bf16_round",
        "mxfp4_floor",
        "mxfp4_even",
        "mxfp4_rceil",
        "mxfp8_e4m3_floor",
        "mxfp8_e4m3_even",
        "mxfp8_e4m3_rceil",
        "mxfp8_e5m2_floor",
        "mxfp8_e5m2_even",
        "mxfp8_e5m2_rceil",
        "nvfp4",
        "nvfp4_to_mxfp4_floor",
        "nvfp4_to_mxfp4_even",
        "nvfp4_to_mxfp4_rceil",
        "mxfp8_e4m3_to_bf16",
        "mxfp8_e5m2_to_bf16",
        "ptpc_fp8",
        "cache_cast_e4m3",
    ] {
        assert!(
            names.contains(want),
            "group {want} missing from the manifest"
        );
    }
    // exhaustive decode tables
    for (g, n) in [
        ("decode_e2m1", 16),
        ("decode_e4m3", 256),
        ("decode_e5m2", 256),
        ("decode_e8m0", 256),
    ] {
        let count = set.groups.iter().find(|x| x.name == g).map(|x| x.count);
        assert_eq!(count, Some(n), "{g}");
    }
}

/// What to get wrong on purpose.
#[derive(Clone, Copy)]
enum Plant {
    /// E2M1 encode rounds ties away from zero (0.25 -> 0.5, 2.5 -> 3, ...).
    E2m1TiesAway,
    /// MX quantize uses `floor` when asked for `even`.
    EvenAsFloor,
    /// PTPC divides `x / scale` in f32 instead of exactly.
    PtpcF32Quotient,
    /// NVFP4 -> MXFP4 dequantizes to f32 first instead of decoding exactly.
    ConvertThroughF32,
}

/// The CPU codecs with one planted error.
struct Planted {
    inner: CpuOps,
    plant: Plant,
}

/// E2M1 encode with ties away from zero: the correct code, except that an
/// exact midpoint goes to the larger magnitude.
fn e2m1_ties_away(x: f64) -> u8 {
    const MAGS: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let sign = if x.is_sign_negative() { 8 } else { 0 };
    let a = x.abs();
    for i in 0..7 {
        if a == (MAGS[i] + MAGS[i + 1]) / 2.0 {
            return sign | (i as u8 + 1);
        }
    }
    m3_core::formats::e2m1::encode_sat(x)
}

impl FormatOps for Planted {
    fn name(&self) -> &str {
        "cpu+planted"
    }
    fn decode(&self, elem: ElemKind, codes: &[u8]) -> Result<Vec<f32>, OpError> {
        self.inner.decode(elem, codes)
    }
    fn encode_sat(&self, elem: ElemKind, xs: &[f64]) -> Result<Vec<u8>, OpError> {
        match (self.plant, elem) {
            (Plant::E2m1TiesAway, ElemKind::E2M1) => {
                Ok(xs.iter().map(|&x| e2m1_ties_away(x)).collect())
            }
            _ => self.inner.encode_sat(elem, xs),
        }
    }
    fn bf16_from_f32(&self, xs: &[f32]) -> Result<Vec<u16>, OpError> {
        self.inner.bf16_from_f32(xs)
    }
    fn mx_quantize(
        &self,
        x: &[f32],
        rows: usize,
        cols: usize,
        elem: MxElem,
        rule: ScaleRule,
    ) -> Result<MxParts, OpError> {
        let rule = match (self.plant, rule) {
            (Plant::EvenAsFloor, ScaleRule::Even) => ScaleRule::Floor,
            (_, r) => r,
        };
        self.inner.mx_quantize(x, rows, cols, elem, rule)
    }
    fn mx_dequantize(&self, t: &MxParts) -> Result<Vec<f32>, OpError> {
        self.inner.mx_dequantize(t)
    }
    fn nvfp4_quantize(&self, x: &[f32], rows: usize, cols: usize) -> Result<Nvfp4Parts, OpError> {
        self.inner.nvfp4_quantize(x, rows, cols)
    }
    fn nvfp4_dequantize(&self, t: &Nvfp4Parts) -> Result<Vec<f32>, OpError> {
        self.inner.nvfp4_dequantize(t)
    }
    fn nvfp4_to_mxfp4(&self, t: &Nvfp4Parts, rule: ScaleRule) -> Result<MxParts, OpError> {
        if let Plant::ConvertThroughF32 = self.plant {
            let x = self.inner.nvfp4_dequantize(t)?;
            return self
                .inner
                .mx_quantize(&x, t.rows, t.cols, MxElem::Fp4E2M1, rule);
        }
        self.inner.nvfp4_to_mxfp4(t, rule)
    }
    fn mxfp8_to_bf16(&self, t: &MxParts, exact: bool) -> Result<Vec<u16>, OpError> {
        self.inner.mxfp8_to_bf16(t, exact)
    }
    fn ptpc_quantize(&self, x: &[f32], rows: usize, cols: usize) -> Result<PtpcParts, OpError> {
        let q = self.inner.ptpc_quantize(x, rows, cols)?;
        if let Plant::PtpcF32Quotient = self.plant {
            // same scales, codes from an f32 quotient
            let codes = x
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    m3_core::formats::fp8::e4m3::encode_sat((v / q.scales[i / cols]) as f64)
                })
                .collect();
            return Ok(PtpcParts { codes, ..q });
        }
        Ok(q)
    }
    fn ptpc_dequantize(&self, t: &PtpcParts) -> Result<Vec<f32>, OpError> {
        self.inner.ptpc_dequantize(t)
    }
    fn cache_cast_e4m3(&self, xs: &[f32], scale: f32) -> Result<Vec<u8>, OpError> {
        self.inner.cache_cast_e4m3(xs, scale)
    }
}

/// Groups whose failure count differs between two reports of the same set.
fn changed_groups(base: &Report, planted: &Report) -> BTreeSet<String> {
    base.groups
        .iter()
        .zip(&planted.groups)
        .filter(|(a, b)| a.failed != b.failed)
        .map(|(a, _)| a.name.clone())
        .collect()
}

fn check_plant(plant: Plant, affected: &[&str]) {
    let set = vectors();
    let base = run(&CpuOps, &set);
    let planted = run(
        &Planted {
            inner: CpuOps,
            plant,
        },
        &set,
    );
    println!("{}", planted.table());
    println!("{}", planted.details());
    let want: BTreeSet<String> = affected.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        changed_groups(&base, &planted),
        want,
        "the planted error must change exactly the affected groups"
    );
    for g in affected {
        let (b, p) = (base.group(g), planted.group(g));
        let (Some(b), Some(p)) = (b, p) else {
            panic!("group {g} missing");
        };
        assert!(p.failed > b.failed, "{g}: the plant was not caught");
        assert!(!p.mismatches.is_empty(), "{g}: no mismatch reported");
    }
}

#[test]
fn planted_e2m1_ties_away_is_caught() {
    check_plant(Plant::E2m1TiesAway, &["encode_e2m1"]);
}

#[test]
fn planted_floor_for_even_is_caught() {
    check_plant(
        Plant::EvenAsFloor,
        &["mxfp4_even", "mxfp8_e4m3_even", "mxfp8_e5m2_even"],
    );
}

#[test]
fn planted_ptpc_f32_quotient_is_caught() {
    check_plant(Plant::PtpcF32Quotient, &["ptpc_fp8"]);
}

#[test]
fn planted_convert_through_f32_is_caught() {
    check_plant(
        Plant::ConvertThroughF32,
        &[
            "nvfp4_to_mxfp4_floor",
            "nvfp4_to_mxfp4_even",
            "nvfp4_to_mxfp4_rceil",
        ],
    );
}

#[test]
fn the_tie_wrapper_really_differs_on_ties() {
    // Guard against a plant that is silently a no-op.
    assert_eq!(e2m1_ties_away(0.25), 1);
    assert_eq!(e2m1_ties_away(-2.5), 8 | 5);
    assert_eq!(e2m1_ties_away(5.0), 7);
}
