//! Bit-for-bit equality, with NaN compared as NaN (FORMATS.md pins that a
//! value is NaN, not which NaN payload), and the value formatting used in
//! mismatch reports.

use crate::ops::ElemKind;

/// Same f32 bits, or both NaN (so -0.0 != +0.0).
pub fn f32_same(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

fn bf16_is_nan(x: u16) -> bool {
    x & 0x7F80 == 0x7F80 && x & 0x7F != 0
}

/// Same bf16 bits, or both NaN.
pub fn bf16_same(a: u16, b: u16) -> bool {
    a == b || (bf16_is_nan(a) && bf16_is_nan(b))
}

/// Same element code, or both NaN codes of `elem`.
pub fn code_same(elem: ElemKind, a: u8, b: u8) -> bool {
    a == b || (elem.is_nan_code(a) && elem.is_nan_code(b))
}

pub fn fmt_f32(x: f32) -> String {
    format!("{x:e} (0x{:08x})", x.to_bits())
}

pub fn fmt_f64(x: f64) -> String {
    format!("{x:e} (0x{:016x})", x.to_bits())
}

pub fn fmt_bytes(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 3);
    for (i, x) in b.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(&format!("{x:02x}"));
    }
    s
}

pub fn fmt_f32s(xs: &[f32]) -> String {
    let v: Vec<String> = xs.iter().map(|x| format!("{x:e}")).collect();
    format!("[{}]", v.join(", "))
}
