//! Register and scratch use of AMD code objects, from the AMDGPU metadata
//! note that the compiler writes into every code object (read with
//! `llvm-readelf --notes`, which prints it as YAML).
//!
//! `cargo xtask kernels` reports it for each clang target and fails when any
//! kernel spills VGPRs (to scratch memory: a performance bug that no CI test
//! would otherwise notice), or spills more SGPRs than its ceiling in
//! [`SGPR_SPILL_CEILINGS`] (zero for every kernel not listed). SGPR spills go
//! to lanes of a VGPR (`v_writelane` / `v_readlane`, no memory); the listed
//! kernels keep a few because wave64 lane masks take two SGPRs each. This
//! reads what the compiler reports; nothing has run on AMD hardware.
//!
//! The gfx950-only MX linears (`m3_gpu::mfma_mx`) are also disassembled
//! (`llvm-objdump -d --mcpu=gfx950`) and must pass [`mfma_violations`]: each
//! entry point contains its MFMA instruction (the scaled
//! `v_mfma_scale_f32_16x16x128_f8f6f4` for MXFP4 x MXFP4), no scratch at
//! all, and VGPRs + AGPRs under the stated ceiling.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The kernels allowed to spill SGPRs, with the most they may spill on
/// gfx950 and gfx942 (clang 22's counts when set; a ceiling goes down
/// with the code, and up only by a decision written in its reason)
/// and why. Every other kernel must spill none, and no kernel may spill a
/// VGPR.
pub const SGPR_SPILL_CEILINGS: &[(&str, u32, &str)] = &[
    (
        "m3s_index_scores",
        27,
        "a 64-bit lane mask per (key, chunk) load predicate and per index head; \
         a few read back per key pass (27 with the tensor-core body beside the \
         scalar one, session 18)",
    ),
    (
        "m3s_attn_partial",
        62,
        "kernel arguments and 64-bit lane masks live across the tile loop; spilled and \
         read back outside its Q K^T / P V loops (full layers; the split sparse entry \
         point, m3s_attn_partial_split, spills none). Raised from 43 on purpose in \
         session 10: the NVFP4 KV cache added two block-scale pointers and a cache-kind \
         argument (its NVFP4 bodies are entry points of their own, traps on HIP); no VGPR spill",
    ),
    (
        "m3s_attn_partial_sparse",
        85,
        "as m3s_attn_partial: the same tile loop for sparse layers, a CTA a selected block \
         (the one kernel before it was split in three spilled 59; 51 before the NVFP4 \
         cache's arguments, session 10)",
    ),
    (
        "m3s_attn_combine",
        11,
        "16 chunk loads in flight with 64-bit uniform offsets; spilled once before the \
         chunk loop, read back after it. Raised from 9 on purpose in session 13: the \
         o projection's f16 rows (one more pointer, written after the loop)",
    ),
    (
        "m3s_router_small",
        38,
        "the router of a small step in one launch (session 13): 16 kernel arguments, 8 of \
         them pointers, live across the logit loop, the unrolled top-k and the grouping; \
         spilled to VGPR lanes, no scratch (the three kernels it replaces spill none)",
    ),
    (
        "m3s_sample_keyed",
        6,
        "kept across the radix selects, read back once at the end",
    ),
    (
        "m3s_mono",
        168,
        "the mono interpreter (kernels/mono.cu) calls each op body as a function of its own \
         (not inlined: one body's registers at a time), so what lives across a call is \
         spilled to VGPR lanes at the call (128 on gfx950 and gfx942, session 21, its first \
         HIP build); its scratch is the call stack (1120 B); compiled, never run on AMD. \
         Raised to 130 on purpose in session 23: the MX linear's E2M1 tile layout (its \
         partial-chunk fetch takes the row's place in its 16-row tile), and to 132 for \
         its gate + up pairs (SwiGLU in the epilogue: a second matrix's pointers), and to \
         178 for the op body of an RMSNorm taking a MoE combine in (fold_combine: a \
         kernel of its own, m3s_rmsnorm_mix, so CUDA's plain RMSNorm holds 56 registers, \
         not 72); and to 184 in session 25 for NVFP4's block scales folded into the f16 \
         weights (S_NV_FOLD: a second form of the walk's block body); lowered to 172 in \
         session 26 (RMSNorm's weight bound now an argument computed at load, not a scan \
         of the weight in the op body); raised to 174 in session 27 (each op's virtual \
         blocks start at a rotated CTA index read from LDS, not at blockIdx.x: a phase's \
         second op starts on the CTAs its first leaves idle); lowered to 168 in session 28 \
         (the small-step build's one-row and one-tile linears became ops of their own; \
         HIP compiles them as the general walk, never records them); all spilled to VGPR \
         lanes at the calls, its scratch unchanged",
    ),
];

/// The SGPR spills `kernel` may have (0 unless listed).
pub fn sgpr_spill_ceiling(kernel: &str) -> u32 {
    SGPR_SPILL_CEILINGS
        .iter()
        .find(|(k, _, _)| *k == kernel)
        .map_or(0, |(_, n, _)| *n)
}

/// One kernel's resources as the compiler reports them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelResources {
    pub name: String,
    pub vgpr: u32,
    pub agpr: u32,
    pub sgpr: u32,
    pub vgpr_spill: u32,
    pub sgpr_spill: u32,
    /// Private (scratch) bytes per work item: spills and stack arrays.
    pub scratch: u32,
    /// Static LDS bytes per workgroup.
    pub lds: u32,
    pub max_workgroup: u32,
}

impl KernelResources {
    pub fn spills(&self) -> bool {
        self.vgpr_spill > 0 || self.sgpr_spill > 0
    }
}

/// Run `readelf --notes` on a code object and parse its kernels.
pub fn read(readelf: &Path, code_object: &Path) -> Result<Vec<KernelResources>> {
    let o = Command::new(readelf)
        .arg("--notes")
        .arg(code_object)
        .output()
        .with_context(|| format!("running {}", readelf.display()))?;
    if !o.status.success() {
        bail!(
            "{} --notes {} failed:\n{}",
            readelf.display(),
            code_object.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let ks = parse_notes(&String::from_utf8_lossy(&o.stdout))?;
    if ks.is_empty() {
        bail!("no amdhsa.kernels metadata in {}", code_object.display());
    }
    Ok(ks)
}

/// Parse the YAML that `llvm-readelf --notes` prints for AMDGPU metadata:
/// under `amdhsa.kernels:` each kernel is a list item (`  - .key: value`)
/// whose own keys sit four spaces in; deeper lines (arguments) are skipped.
pub fn parse_notes(text: &str) -> Result<Vec<KernelResources>> {
    let mut out: Vec<KernelResources> = Vec::new();
    let mut in_kernels = false;
    for line in text.lines() {
        if line.starts_with("amdhsa.") {
            in_kernels = line.trim_end() == "amdhsa.kernels:";
            continue;
        }
        if !in_kernels {
            continue;
        }
        let kv = if let Some(rest) = line.strip_prefix("  - .") {
            out.push(KernelResources::default());
            rest
        } else if let Some(rest) = line.strip_prefix("    .") {
            rest
        } else {
            continue;
        };
        let Some(k) = out.last_mut() else { continue };
        let Some((key, value)) = kv.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let num = || -> Result<u32> {
            value
                .parse()
                .with_context(|| format!("metadata .{key}: {value:?} is not a number"))
        };
        match key {
            "name" => k.name = value.to_string(),
            "vgpr_count" => k.vgpr = num()?,
            "agpr_count" => k.agpr = num()?,
            "sgpr_count" => k.sgpr = num()?,
            "vgpr_spill_count" => k.vgpr_spill = num()?,
            "sgpr_spill_count" => k.sgpr_spill = num()?,
            "private_segment_fixed_size" => k.scratch = num()?,
            "group_segment_fixed_size" => k.lds = num()?,
            "max_flat_workgroup_size" => k.max_workgroup = num()?,
            _ => {}
        }
    }
    if let Some(k) = out.iter().find(|k| k.name.is_empty()) {
        bail!("a kernel without .name in the metadata: {k:?}");
    }
    Ok(out)
}

/// The report, one line per kernel (`module` names the code object).
pub fn table(rows: &[(&str, KernelResources)]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "  {:16} {:26} {:>5} {:>5} {:>5} {:>8} {:>6} {:>6} {:>6} {:>5}",
        "module", "kernel", "vgpr", "agpr", "sgpr", "scratch", "vspill", "sspill", "lds", "wg"
    );
    for (m, k) in rows {
        let _ = writeln!(
            s,
            "  {:16} {:26} {:>5} {:>5} {:>5} {:>8} {:>6} {:>6} {:>6} {:>5}",
            m,
            k.name,
            k.vgpr,
            k.agpr,
            k.sgpr,
            k.scratch,
            k.vgpr_spill,
            k.sgpr_spill,
            k.lds,
            k.max_workgroup
        );
    }
    s
}

/// The kernels that break the spill rule: any VGPR spill, or more SGPR
/// spills than the kernel's ceiling.
pub fn violations<'a>(rows: &'a [(&str, KernelResources)]) -> Vec<&'a KernelResources> {
    rows.iter()
        .map(|(_, k)| k)
        .filter(|k| k.vgpr_spill > 0 || k.sgpr_spill > sgpr_spill_ceiling(&k.name))
        .collect()
}

/// Listed kernels now below their SGPR ceiling (the ceiling can go down).
pub fn slack<'a>(rows: &'a [(&str, KernelResources)]) -> Vec<(&'a KernelResources, u32)> {
    rows.iter()
        .map(|(_, k)| (k, sgpr_spill_ceiling(&k.name)))
        .filter(|(k, c)| k.sgpr_spill < *c)
        .collect()
}

/// `llvm-objdump -d` of a code object for `arch`.
pub fn disassemble(objdump: &Path, arch: &str, code_object: &Path) -> Result<String> {
    let o = Command::new(objdump)
        .args(["-d", &format!("--mcpu={arch}")])
        .arg(code_object)
        .output()
        .with_context(|| format!("running {}", objdump.display()))?;
    if !o.status.success() {
        bail!(
            "{} -d {} failed:\n{}",
            objdump.display(),
            code_object.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The mnemonics of each function in an `llvm-objdump -d` listing: a line
/// `<hex> <name>:` opens a function, each indented line after it is one
/// instruction (its first word).
pub fn instructions_by_kernel(disasm: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cur: Option<String> = None;
    for line in disasm.lines() {
        let t = line.trim_end();
        if let Some(name) = t
            .split_once(" <")
            .filter(|(addr, rest)| {
                !addr.is_empty()
                    && addr.chars().all(|c| c.is_ascii_hexdigit())
                    && rest.ends_with(">:")
            })
            .map(|(_, rest)| rest.trim_end_matches(">:").to_string())
        {
            out.entry(name.clone()).or_default();
            cur = Some(name);
            continue;
        }
        if t.is_empty() || !line.starts_with(char::is_whitespace) {
            continue;
        }
        if let (Some(k), Some(m)) = (&cur, t.split_whitespace().next()) {
            out.get_mut(k).expect("opened above").push(m.to_string());
        }
    }
    out
}

/// What breaks the MFMA kernels' ISA rule: an entry point of `required`
/// (kernel, instruction) missing from the listing or without its
/// instruction, scratch or spills, or VGPRs (arch + accumulation) over
/// `vgpr_ceiling`. Empty when all is well.
pub fn mfma_violations(
    resources: &[KernelResources],
    instructions: &BTreeMap<String, Vec<String>>,
    required: &[(&str, &str)],
    vgpr_ceiling: u32,
) -> Vec<String> {
    let mut bad = Vec::new();
    for (kernel, instr) in required {
        match instructions.get(*kernel) {
            None => bad.push(format!("{kernel}: not in the disassembly")),
            Some(ins) if !ins.iter().any(|i| i == instr) => {
                bad.push(format!("{kernel}: no {instr} in its code"))
            }
            Some(_) => {}
        }
    }
    for k in resources {
        if k.spills() || k.scratch > 0 {
            bad.push(format!(
                "{}: {} B scratch, {} VGPR / {} SGPR spills",
                k.name, k.scratch, k.vgpr_spill, k.sgpr_spill
            ));
        }
        if k.vgpr + k.agpr > vgpr_ceiling {
            bad.push(format!(
                "{}: {} VGPRs + {} AGPRs, ceiling {vgpr_ceiling}",
                k.name, k.vgpr, k.agpr
            ));
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Displaying notes found in: .note
  Owner                Data size 	Description
  AMDGPU               0x00000b62	NT_AMDGPU_METADATA (AMDGPU Metadata)
    AMDGPU Metadata:
        ---
amdhsa.kernels:
  - .agpr_count:     0
    .args:
      - .address_space:  global
        .offset:         0
        .size:           8
        .value_kind:     global_buffer
      - .offset:         8
        .size:           4
        .value_kind:     by_value
    .group_segment_fixed_size: 68
    .max_flat_workgroup_size: 1024
    .name:           m3_rmsnorm
    .private_segment_fixed_size: 0
    .sgpr_count:     29
    .sgpr_spill_count: 0
    .vgpr_count:     36
    .vgpr_spill_count: 0
  - .agpr_count:     4
    .args:
      - .offset:         0
        .size:           8
        .value_kind:     global_buffer
    .group_segment_fixed_size: 0
    .max_flat_workgroup_size: 256
    .name:           m3s_mma_fp4
    .private_segment_fixed_size: 144
    .sgpr_count:     96
    .sgpr_spill_count: 2
    .vgpr_count:     222
    .vgpr_spill_count: 7
amdhsa.target:   amdgcn-amd-amdhsa--gfx950
amdhsa.version:
  - 1
  - 2
...
";

    #[test]
    fn parses_kernels_and_skips_args() {
        let ks = parse_notes(SAMPLE).unwrap();
        assert_eq!(ks.len(), 2);
        assert_eq!(
            ks[0],
            KernelResources {
                name: "m3_rmsnorm".into(),
                vgpr: 36,
                agpr: 0,
                sgpr: 29,
                vgpr_spill: 0,
                sgpr_spill: 0,
                scratch: 0,
                lds: 68,
                max_workgroup: 1024,
            }
        );
        assert_eq!(ks[1].name, "m3s_mma_fp4");
        assert_eq!(
            (
                ks[1].agpr,
                ks[1].scratch,
                ks[1].vgpr_spill,
                ks[1].sgpr_spill
            ),
            (4, 144, 7, 2)
        );
    }

    #[test]
    fn any_vgpr_spill_and_sgpr_spills_past_the_ceiling_are_violations() {
        let ks = parse_notes(SAMPLE).unwrap();
        // m3s_mma_fp4 spills 7 VGPRs and 2 SGPRs: both break the rule
        assert_eq!(violations(&[("standard_decode", ks[1].clone())]).len(), 1);
        let with = |name: &str, v: u32, s: u32| {
            let mut k = ks[0].clone();
            k.name = name.into();
            k.vgpr_spill = v;
            k.sgpr_spill = s;
            ("m", k)
        };
        let (listed, ceiling, _) = SGPR_SPILL_CEILINGS[0];
        // a VGPR spill fails in any kernel, listed or not
        assert_eq!(violations(&[with("m3_rmsnorm", 1, 0)]).len(), 1);
        assert_eq!(violations(&[with(listed, 1, 0)]).len(), 1);
        // SGPR spills: up to the ceiling for a listed kernel, none otherwise
        assert!(violations(&[with(listed, 0, ceiling)]).is_empty());
        assert_eq!(violations(&[with(listed, 0, ceiling + 1)]).len(), 1);
        assert_eq!(violations(&[with("m3_rmsnorm", 0, 1)]).len(), 1);
        assert!(violations(&[with("m3_rmsnorm", 0, 0)]).is_empty());
        // below the ceiling is reported as slack, not a failure
        let below = [with(listed, 0, ceiling - 1)];
        assert!(violations(&below).is_empty());
        assert_eq!(slack(&below).len(), 1);
        assert!(slack(&[with(listed, 0, ceiling)]).is_empty());
    }

    #[test]
    fn ceilings_are_unique_and_positive() {
        for (i, (k, n, why)) in SGPR_SPILL_CEILINGS.iter().enumerate() {
            assert!(*n > 0 && !why.is_empty(), "{k}");
            assert!(
                SGPR_SPILL_CEILINGS[..i].iter().all(|(o, _, _)| o != k),
                "{k}"
            );
        }
    }

    const DISASM: &str = "
mfma_mx.co:\tfile format elf64-amdgpu

Disassembly of section .text:

0000000000004400 <m3x_mfma_fp4_a4>:
\ts_load_dwordx8 s[4:11], s[0:1], 0x0                       // 000000004400: C00E0100 00000000
\tv_mfma_scale_f32_16x16x128_f8f6f4 v[0:3], v[6:9], v[10:13], v[0:3], v4, v5 op_sel_hi:[0,0,0] cbsz:4 blgp:4
\ts_endpgm

0000000000004700 <m3x_mfma_e4m3_bf16>:
\tv_mfma_f32_16x16x32_bf16 v[0:3], v[6:9], v[10:13], v[0:3]
\ts_endpgm
";

    #[test]
    fn disassembly_is_split_by_kernel() {
        let m = instructions_by_kernel(DISASM);
        assert_eq!(m.len(), 2);
        assert_eq!(
            m["m3x_mfma_fp4_a4"],
            [
                "s_load_dwordx8",
                "v_mfma_scale_f32_16x16x128_f8f6f4",
                "s_endpgm"
            ]
        );
        assert_eq!(m["m3x_mfma_e4m3_bf16"][0], "v_mfma_f32_16x16x32_bf16");
    }

    #[test]
    fn mfma_rule_catches_a_missing_instruction_scratch_and_vgprs() {
        let m = instructions_by_kernel(DISASM);
        let req = [
            ("m3x_mfma_fp4_a4", "v_mfma_scale_f32_16x16x128_f8f6f4"),
            ("m3x_mfma_e4m3_bf16", "v_mfma_f32_16x16x32_bf16"),
        ];
        let k = |name: &str, vgpr: u32| KernelResources {
            name: name.into(),
            vgpr,
            ..Default::default()
        };
        let ok = [k("m3x_mfma_fp4_a4", 34), k("m3x_mfma_e4m3_bf16", 36)];
        assert!(mfma_violations(&ok, &m, &req, 64).is_empty());
        // the scaled MFMA replaced by something else: caught
        let plain = DISASM.replace(
            "v_mfma_scale_f32_16x16x128_f8f6f4",
            "v_mfma_f32_16x16x128_f8f6f4",
        );
        assert_eq!(
            mfma_violations(&ok, &instructions_by_kernel(&plain), &req, 64).len(),
            1
        );
        // a kernel gone from the listing
        let mut gone = m.clone();
        gone.remove("m3x_mfma_e4m3_bf16");
        assert_eq!(mfma_violations(&ok, &gone, &req, 64).len(), 1);
        // VGPRs over the ceiling, AGPRs counted
        assert_eq!(mfma_violations(&ok, &m, &req, 35).len(), 1);
        let mut acc = ok.clone();
        acc[0].agpr = 40;
        assert_eq!(mfma_violations(&acc, &m, &req, 64).len(), 1);
        // scratch or a spill
        let mut sp = ok.clone();
        sp[1].scratch = 16;
        assert_eq!(mfma_violations(&sp, &m, &req, 64).len(), 1);
        sp[1].scratch = 0;
        sp[1].vgpr_spill = 1;
        assert_eq!(mfma_violations(&sp, &m, &req, 64).len(), 1);
    }

    #[test]
    fn bad_numbers_are_errors() {
        let bad = SAMPLE.replace(".vgpr_count:     36", ".vgpr_count:     lots");
        assert!(parse_notes(&bad).is_err());
    }
}
