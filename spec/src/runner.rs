//! The conformance runner: every vector of every group through a
//! [`FormatOps`], compared bit for bit, with per-group counts and the first
//! mismatches (vector id, input, expected, got).
//!
//! A backend that panics in an operation fails the vectors of that call
//! (reported with the panic message) instead of aborting the run, so a
//! partly implemented backend still gets a full table.

use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

use m3_core::formats::MxElem;

use crate::compare::{bf16_same, code_same, f32_same, fmt_bytes, fmt_f32, fmt_f32s, fmt_f64};
use crate::ops::{ElemKind, FormatOps, MxParts, Nvfp4Parts, OpError};
use crate::vectors::{
    BlockCase, CacheCastCase, Group, GroupData, Mxfp8Bf16Case, Nvfp4Case, Nvfp4ToMxCase, PtpcCase,
    VectorSet,
};

/// Mismatches kept per group (the counts are always complete).
pub const MAX_MISMATCHES: usize = 8;

/// One failing vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// `group/case` plus the position (`[row r, block b]`, `[i]`).
    pub id: String,
    pub input: String,
    pub expected: String,
    pub got: String,
}

/// The outcome of one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupReport {
    pub name: String,
    pub vectors: usize,
    pub passed: usize,
    pub failed: usize,
    /// The first [`MAX_MISMATCHES`] failures.
    pub mismatches: Vec<Mismatch>,
}

/// The outcome of a whole run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub backend: String,
    pub groups: Vec<GroupReport>,
}

impl Report {
    pub fn all_passed(&self) -> bool {
        self.groups.iter().all(|g| g.failed == 0)
    }

    /// Names of the groups with at least one failure.
    pub fn failed_groups(&self) -> Vec<&str> {
        self.groups
            .iter()
            .filter(|g| g.failed > 0)
            .map(|g| g.name.as_str())
            .collect()
    }

    pub fn group(&self, name: &str) -> Option<&GroupReport> {
        self.groups.iter().find(|g| g.name == name)
    }

    /// The table: group, vectors, passed, failed, and a total line.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "backend: {}", self.backend);
        let _ = writeln!(
            s,
            "{:<26} {:>8} {:>8} {:>8}",
            "group", "vectors", "passed", "failed"
        );
        let (mut v, mut p, mut f) = (0, 0, 0);
        for g in &self.groups {
            let _ = writeln!(
                s,
                "{:<26} {:>8} {:>8} {:>8}",
                g.name, g.vectors, g.passed, g.failed
            );
            v += g.vectors;
            p += g.passed;
            f += g.failed;
        }
        let _ = writeln!(s, "{:<26} {:>8} {:>8} {:>8}", "TOTAL", v, p, f);
        s
    }

    /// The kept mismatches of every failing group.
    pub fn details(&self) -> String {
        let mut s = String::new();
        for g in self.groups.iter().filter(|g| g.failed > 0) {
            let _ = writeln!(s, "{}: {} of {} failed", g.name, g.failed, g.vectors);
            for m in &g.mismatches {
                let _ = writeln!(s, "  {}", m.id);
                let _ = writeln!(s, "    input:    {}", m.input);
                let _ = writeln!(s, "    expected: {}", m.expected);
                let _ = writeln!(s, "    got:      {}", m.got);
            }
        }
        s
    }
}

/// Per-group tally.
struct Tally {
    name: String,
    vectors: usize,
    failed: usize,
    mismatches: Vec<Mismatch>,
}

impl Tally {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            vectors: 0,
            failed: 0,
            mismatches: Vec::new(),
        }
    }

    fn pass(&mut self) {
        self.vectors += 1;
    }

    fn fail(&mut self, id: String, input: String, expected: String, got: String) {
        self.vectors += 1;
        self.failed += 1;
        if self.mismatches.len() < MAX_MISMATCHES {
            self.mismatches.push(Mismatch {
                id,
                input,
                expected,
                got,
            });
        }
    }

    /// A call that gave no result fails all `n` vectors it covered.
    fn fail_all(&mut self, n: usize, id: String, what: &str, e: &OpError) {
        for i in 0..n {
            let (inp, exp) = if i == 0 {
                (what.to_string(), "a result".to_string())
            } else {
                (String::new(), String::new())
            };
            self.vectors += 1;
            self.failed += 1;
            if i == 0 && self.mismatches.len() < MAX_MISMATCHES {
                self.mismatches.push(Mismatch {
                    id: id.clone(),
                    input: inp,
                    expected: exp,
                    got: format!("error: {e}"),
                });
            }
        }
    }

    fn finish(self) -> GroupReport {
        GroupReport {
            name: self.name,
            vectors: self.vectors,
            passed: self.vectors - self.failed,
            failed: self.failed,
            mismatches: self.mismatches,
        }
    }
}

/// Call a backend operation, turning a panic into an error.
fn guard<T>(f: impl FnOnce() -> Result<T, OpError>) -> Result<T, OpError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "(no message)".to_string());
            Err(OpError::Failed(format!("panicked: {msg}")))
        }
    }
}

/// A result of the wrong length is a failure of the whole call.
fn check_len<T>(r: Result<Vec<T>, OpError>, n: usize) -> Result<Vec<T>, OpError> {
    let v = r?;
    if v.len() != n {
        return Err(OpError::Failed(format!(
            "returned {} values for {n} inputs",
            v.len()
        )));
    }
    Ok(v)
}

/// Run every group of `set` on `ops`.
pub fn run(ops: &dyn FormatOps, set: &VectorSet) -> Report {
    Report {
        backend: ops.name().to_string(),
        groups: set.groups.iter().map(|g| run_group(ops, g)).collect(),
    }
}

fn run_group(ops: &dyn FormatOps, g: &Group) -> GroupReport {
    let mut t = Tally::new(&g.name);
    match &g.data {
        GroupData::Decode {
            elem,
            codes,
            expected,
        } => match check_len(guard(|| ops.decode(*elem, codes)), codes.len()) {
            Err(e) => t.fail_all(codes.len(), g.name.clone(), "decode", &e),
            Ok(got) => {
                for (i, ((&c, &want), &have)) in codes.iter().zip(expected).zip(&got).enumerate() {
                    if f32_same(want, have) {
                        t.pass();
                    } else {
                        t.fail(
                            format!("{}[{i}]", g.name),
                            format!("code 0x{c:02x}"),
                            fmt_f32(want),
                            fmt_f32(have),
                        );
                    }
                }
            }
        },
        GroupData::Encode {
            elem,
            inputs,
            expected,
        } => match check_len(guard(|| ops.encode_sat(*elem, inputs)), inputs.len()) {
            Err(e) => t.fail_all(inputs.len(), g.name.clone(), "encode", &e),
            Ok(got) => {
                for (i, ((&x, &want), &have)) in inputs.iter().zip(expected).zip(&got).enumerate() {
                    if code_same(*elem, want, have) {
                        t.pass();
                    } else {
                        t.fail(
                            format!("{}[{i}]", g.name),
                            fmt_f64(x),
                            format!("0x{want:02x}"),
                            format!("0x{have:02x}"),
                        );
                    }
                }
            }
        },
        GroupData::Bf16 { inputs, expected } => {
            match check_len(guard(|| ops.bf16_from_f32(inputs)), inputs.len()) {
                Err(e) => t.fail_all(inputs.len(), g.name.clone(), "bf16", &e),
                Ok(got) => {
                    for (i, ((&x, &want), &have)) in
                        inputs.iter().zip(expected).zip(&got).enumerate()
                    {
                        if bf16_same(want, have) {
                            t.pass();
                        } else {
                            t.fail(
                                format!("{}[{i}]", g.name),
                                fmt_f32(x),
                                format!("0x{want:04x}"),
                                format!("0x{have:04x}"),
                            );
                        }
                    }
                }
            }
        }
        GroupData::Mx { elem, rule, cases } => {
            for c in cases {
                let id = format!("{}/{}", g.name, c.id);
                match mx_case(ops, *elem, *rule, c, &id) {
                    None => t.pass(),
                    Some(m) => t.fail(m.id, m.input, m.expected, m.got),
                }
            }
        }
        GroupData::Nvfp4 { cases } => {
            for c in cases {
                let id = format!("{}/{}", g.name, c.id);
                match nvfp4_case(ops, c, &id) {
                    None => t.pass(),
                    Some(m) => t.fail(m.id, m.input, m.expected, m.got),
                }
            }
        }
        GroupData::Nvfp4ToMxfp4 { rule, cases } => {
            for c in cases {
                let id = format!("{}/{}", g.name, c.id);
                match nvfp4_to_mx_case(ops, *rule, c, &id) {
                    None => t.pass(),
                    Some(m) => t.fail(m.id, m.input, m.expected, m.got),
                }
            }
        }
        GroupData::Mxfp8ToBf16 { cases, .. } => {
            for c in cases {
                let id = format!("{}/{}", g.name, c.id);
                match mxfp8_bf16_case(ops, c, &id) {
                    None => t.pass(),
                    Some(m) => t.fail(m.id, m.input, m.expected, m.got),
                }
            }
        }
        GroupData::Ptpc { cases } => {
            for c in cases {
                ptpc_case(ops, c, &format!("{}/{}", g.name, c.id), &mut t);
            }
        }
        GroupData::CacheCast { cases } => {
            for c in cases {
                cache_case(ops, c, &format!("{}/{}", g.name, c.id), &mut t);
            }
        }
    }
    t.finish()
}

fn mm(id: String, input: String, expected: String, got: String) -> Option<Mismatch> {
    Some(Mismatch {
        id,
        input,
        expected,
        got,
    })
}

fn err_mm(id: &str, what: &str, e: &OpError) -> Option<Mismatch> {
    mm(
        format!("{id} ({what})"),
        what.to_string(),
        "a result".into(),
        format!("error: {e}"),
    )
}

/// First differing block of two stored MX / NVFP4 tensors: compares the scale
/// byte and the element bytes of each block, row-major.
fn block_diff(
    want_codes: &[u8],
    want_scales: &[u8],
    got_codes: &[u8],
    got_scales: &[u8],
    blocks: usize,
    code_bytes_per_block: usize,
) -> Option<usize> {
    if got_codes.len() != want_codes.len() || got_scales.len() != want_scales.len() {
        return Some(usize::MAX);
    }
    (0..blocks).find(|&b| {
        let r = b * code_bytes_per_block..(b + 1) * code_bytes_per_block;
        want_scales[b] != got_scales[b] || want_codes[r.clone()] != got_codes[r]
    })
}

/// Where the blocks of a stored tensor lie.
struct Layout {
    /// Elements per block.
    block: usize,
    cols: usize,
    /// Code bytes per block (16 for packed FP4 / 32, 8 for NVFP4, 32 for FP8).
    code_bytes: usize,
}

fn describe_block_diff(
    id: &str,
    b: usize,
    lay: &Layout,
    x: Option<&[f32]>,
    want: (&[u8], &[u8]),
    got: (&[u8], &[u8]),
) -> Option<Mismatch> {
    if b == usize::MAX {
        return mm(
            format!("{id} (shape)"),
            String::new(),
            format!("{} code bytes, {} scales", want.0.len(), want.1.len()),
            format!("{} code bytes, {} scales", got.0.len(), got.1.len()),
        );
    }
    let per_row = lay.cols / lay.block;
    let (row, blk) = (b / per_row, b % per_row);
    let input = match x {
        Some(x) => {
            let start = row * lay.cols + blk * lay.block;
            fmt_f32s(&x[start..start + lay.block])
        }
        None => String::from("(see case input)"),
    };
    let r = b * lay.code_bytes..(b + 1) * lay.code_bytes;
    mm(
        format!("{id} [row {row}, block {blk}]"),
        input,
        format!(
            "scale {:02x} codes {}",
            want.1[b],
            fmt_bytes(&want.0[r.clone()])
        ),
        format!("scale {:02x} codes {}", got.1[b], fmt_bytes(&got.0[r])),
    )
}

fn deq_diff(id: &str, want: &[f32], got: &[f32], cols: usize) -> Option<Mismatch> {
    if want.len() != got.len() {
        return mm(
            format!("{id} (dequantize)"),
            String::new(),
            format!("{} values", want.len()),
            format!("{} values", got.len()),
        );
    }
    let i = (0..want.len()).find(|&i| !f32_same(want[i], got[i]))?;
    mm(
        format!("{id} dequantize [row {}, col {}]", i / cols, i % cols),
        "the expected quantized tensor".into(),
        fmt_f32(want[i]),
        fmt_f32(got[i]),
    )
}

fn mx_code_bytes(elem: MxElem) -> usize {
    elem.packed_len(MxElem::BLOCK)
}

fn mx_compare(id: &str, x: Option<&[f32]>, want: &MxParts, got: &MxParts) -> Option<Mismatch> {
    if got.elem != want.elem || got.rows != want.rows || got.cols != want.cols {
        return mm(
            format!("{id} (shape)"),
            String::new(),
            format!("{:?} [{}, {}]", want.elem, want.rows, want.cols),
            format!("{:?} [{}, {}]", got.elem, got.rows, got.cols),
        );
    }
    let cbpb = mx_code_bytes(want.elem);
    let b = block_diff(
        &want.codes,
        &want.scales,
        &got.codes,
        &got.scales,
        want.scales.len(),
        cbpb,
    )?;
    let lay = Layout {
        block: MxElem::BLOCK,
        cols: want.cols,
        code_bytes: cbpb,
    };
    describe_block_diff(
        id,
        b,
        &lay,
        x,
        (&want.codes, &want.scales),
        (&got.codes, &got.scales),
    )
}

fn mx_case(
    ops: &dyn FormatOps,
    elem: MxElem,
    rule: m3_core::formats::ScaleRule,
    c: &BlockCase,
    id: &str,
) -> Option<Mismatch> {
    let (r, k) = (c.expected.rows, c.expected.cols);
    match guard(|| ops.mx_quantize(&c.x, r, k, elem, rule)) {
        Err(e) => return err_mm(id, "quantize", &e),
        Ok(got) => {
            if let Some(m) = mx_compare(id, Some(&c.x), &c.expected, &got) {
                return Some(m);
            }
        }
    }
    match guard(|| ops.mx_dequantize(&c.expected)) {
        Err(e) => err_mm(id, "dequantize", &e),
        Ok(got) => deq_diff(id, &c.deq, &got, k),
    }
}

fn nvfp4_compare(
    id: &str,
    x: Option<&[f32]>,
    want: &Nvfp4Parts,
    got: &Nvfp4Parts,
) -> Option<Mismatch> {
    if got.rows != want.rows || got.cols != want.cols {
        return mm(
            format!("{id} (shape)"),
            String::new(),
            format!("[{}, {}]", want.rows, want.cols),
            format!("[{}, {}]", got.rows, got.cols),
        );
    }
    if !f32_same(want.global, got.global) {
        return mm(
            format!("{id} (global scale)"),
            "the whole tensor".into(),
            fmt_f32(want.global),
            fmt_f32(got.global),
        );
    }
    let b = block_diff(
        &want.codes,
        &want.scales,
        &got.codes,
        &got.scales,
        want.scales.len(),
        8,
    )?;
    let lay = Layout {
        block: 16,
        cols: want.cols,
        code_bytes: 8,
    };
    describe_block_diff(
        id,
        b,
        &lay,
        x,
        (&want.codes, &want.scales),
        (&got.codes, &got.scales),
    )
}

fn nvfp4_case(ops: &dyn FormatOps, c: &Nvfp4Case, id: &str) -> Option<Mismatch> {
    let (r, k) = (c.expected.rows, c.expected.cols);
    match guard(|| ops.nvfp4_quantize(&c.x, r, k)) {
        Err(e) => return err_mm(id, "quantize", &e),
        Ok(got) => {
            if let Some(m) = nvfp4_compare(id, Some(&c.x), &c.expected, &got) {
                return Some(m);
            }
        }
    }
    match guard(|| ops.nvfp4_dequantize(&c.expected)) {
        Err(e) => err_mm(id, "dequantize", &e),
        Ok(got) => deq_diff(id, &c.deq, &got, k),
    }
}

fn nvfp4_to_mx_case(
    ops: &dyn FormatOps,
    rule: m3_core::formats::ScaleRule,
    c: &Nvfp4ToMxCase,
    id: &str,
) -> Option<Mismatch> {
    match guard(|| ops.nvfp4_to_mxfp4(&c.input, rule)) {
        Err(e) => err_mm(id, "convert", &e),
        Ok(got) => mx_compare(id, None, &c.expected, &got),
    }
}

fn bf16_diff(id: &str, input: &MxParts, want: &[u16], got: &[u16]) -> Option<Mismatch> {
    if want.len() != got.len() {
        return mm(
            format!("{id} (length)"),
            String::new(),
            format!("{} values", want.len()),
            format!("{} values", got.len()),
        );
    }
    let i = (0..want.len()).find(|&i| !bf16_same(want[i], got[i]))?;
    let (row, col) = (i / input.cols, i % input.cols);
    mm(
        format!("{id} [row {row}, col {col}]"),
        format!(
            "code 0x{:02x}, scale 0x{:02x}",
            input.codes[i],
            input.scales[row * (input.cols / 32) + col / 32]
        ),
        format!("0x{:04x}", want[i]),
        format!("0x{:04x}", got[i]),
    )
}

fn mxfp8_bf16_case(ops: &dyn FormatOps, c: &Mxfp8Bf16Case, id: &str) -> Option<Mismatch> {
    match guard(|| ops.mxfp8_to_bf16(&c.input, false)) {
        Err(e) => return err_mm(id, "convert, exact = false", &e),
        Ok(got) => {
            if let Some(m) = bf16_diff(id, &c.input, &c.bf16, &got) {
                return Some(m);
            }
        }
    }
    let got = guard(|| ops.mxfp8_to_bf16(&c.input, true));
    let eid = format!("{id} (exact = true)");
    match (c.exact_refuses, got) {
        (None, Ok(bits)) => bf16_diff(&eid, &c.input, &c.bf16, &bits),
        (None, Err(e)) => mm(
            eid,
            String::new(),
            "a lossless result".into(),
            format!("error: {e}"),
        ),
        (Some((row, block)), Ok(_)) => mm(
            eid,
            String::new(),
            format!("refusal at row {row}, block {block}"),
            "a result".into(),
        ),
        (
            Some((row, block)),
            Err(OpError::Refused {
                row: r, block: b, ..
            }),
        ) => {
            if (r, b) == (row, block) {
                None
            } else {
                mm(
                    eid,
                    String::new(),
                    format!("refusal at row {row}, block {block}"),
                    format!("refusal at row {r}, block {b}"),
                )
            }
        }
        (Some((row, block)), Err(e)) => mm(
            eid,
            String::new(),
            format!("refusal at row {row}, block {block}"),
            format!("error: {e}"),
        ),
    }
}

/// PTPC counts one vector per row: the row's codes, scale and dequantize.
fn ptpc_case(ops: &dyn FormatOps, c: &PtpcCase, id: &str, t: &mut Tally) {
    let (rows, cols) = (c.expected.rows, c.expected.cols);
    let q = guard(|| ops.ptpc_quantize(&c.x, rows, cols)).and_then(|q| {
        if q.codes.len() != rows * cols || q.scales.len() != rows {
            Err(OpError::Failed(format!(
                "PTPC result has {} codes and {} scales for [{rows}, {cols}]",
                q.codes.len(),
                q.scales.len()
            )))
        } else {
            Ok(q)
        }
    });
    let q = match q {
        Ok(q) => q,
        Err(e) => return t.fail_all(rows, format!("{id} (quantize)"), "quantize", &e),
    };
    let d = match check_len(guard(|| ops.ptpc_dequantize(&c.expected)), rows * cols) {
        Ok(d) => d,
        Err(e) => return t.fail_all(rows, format!("{id} (dequantize)"), "dequantize", &e),
    };
    for r in 0..rows {
        let span = r * cols..(r + 1) * cols;
        let x = &c.x[span.clone()];
        if !f32_same(c.expected.scales[r], q.scales[r]) {
            t.fail(
                format!("{id} [row {r}] scale"),
                fmt_f32s(x),
                fmt_f32(c.expected.scales[r]),
                fmt_f32(q.scales[r]),
            );
        } else if let Some(j) = span
            .clone()
            .find(|&i| !code_same(ElemKind::E4M3, c.expected.codes[i], q.codes[i]))
        {
            t.fail(
                format!("{id} [row {r}, col {}]", j - r * cols),
                fmt_f32(c.x[j]),
                format!("0x{:02x}", c.expected.codes[j]),
                format!("0x{:02x}", q.codes[j]),
            );
        } else if let Some(j) = span.clone().find(|&i| !f32_same(c.deq[i], d[i])) {
            t.fail(
                format!("{id} dequantize [row {r}, col {}]", j - r * cols),
                format!("code 0x{:02x}", c.expected.codes[j]),
                fmt_f32(c.deq[j]),
                fmt_f32(d[j]),
            );
        } else {
            t.pass();
        }
    }
}

fn cache_case(ops: &dyn FormatOps, c: &CacheCastCase, id: &str, t: &mut Tally) {
    match check_len(guard(|| ops.cache_cast_e4m3(&c.x, c.scale)), c.x.len()) {
        Err(e) => t.fail_all(c.x.len(), id.to_string(), "cache cast", &e),
        Ok(got) => {
            for (i, ((&x, &want), &have)) in c.x.iter().zip(&c.codes).zip(&got).enumerate() {
                if code_same(ElemKind::E4M3, want, have) {
                    t.pass();
                } else {
                    t.fail(
                        format!("{id}[{i}]"),
                        format!("x = {}, scale = {}", fmt_f32(x), fmt_f32(c.scale)),
                        format!("0x{want:02x}"),
                        format!("0x{have:02x}"),
                    );
                }
            }
        }
    }
}
