//! Register and scratch use of AMD code objects, from the AMDGPU metadata
//! note that the compiler writes into every code object (read with
//! `llvm-readelf --notes`, which prints it as YAML).
//!
//! `cargo xtask kernels` reports it for each clang target and fails when a
//! standard-path tensor-core linear kernel (`m3s_mma_*`) spills registers:
//! those kernels are sized to keep their tiles in registers, and a spill
//! there is a performance bug that no CI test would otherwise notice. This
//! reads what the compiler reports; nothing has run on AMD hardware.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Kernels that must not spill (name prefix).
pub const NO_SPILL_PREFIX: &str = "m3s_mma_";

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

/// The kernels that break the no-spill rule.
pub fn violations<'a>(rows: &'a [(&str, KernelResources)]) -> Vec<&'a KernelResources> {
    rows.iter()
        .map(|(_, k)| k)
        .filter(|k| k.name.starts_with(NO_SPILL_PREFIX) && k.spills())
        .collect()
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
    fn only_mma_spills_are_violations() {
        let ks = parse_notes(SAMPLE).unwrap();
        let mut spilling_other = ks[0].clone();
        spilling_other.name = "m3s_attn_partial".into();
        spilling_other.vgpr_spill = 100;
        let rows = vec![
            ("standard_decode", ks[1].clone()),
            ("standard_decode", spilling_other),
        ];
        let v = violations(&rows);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].name, "m3s_mma_fp4");
        let mut clean = ks[1].clone();
        clean.vgpr_spill = 0;
        clean.sgpr_spill = 0;
        assert!(violations(&[("m", clean)]).is_empty());
    }

    #[test]
    fn bad_numbers_are_errors() {
        let bad = SAMPLE.replace(".vgpr_count:     36", ".vgpr_count:     lots");
        assert!(parse_notes(&bad).is_err());
    }
}
