//! FP8 element types: E4M3FN (bias 7, max 448, NaN = 0x7F/0xFF, no Inf) and
//! E5M2 (bias 15, max 57344, Inf = 0x7C/0xFC, NaN = 0x7D-0x7F and negatives).

/// Which 8-bit float.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8 {
    E4M3,
    E5M2,
}

pub mod e4m3 {
    /// Exact decode of an E4M3FN code (NaN codes give NaN).
    pub fn decode(code: u8) -> f32 {
        todo!("formats helper: {code}")
    }
    /// Saturating RNE encode of an exact value (f64 so quotients stay exact):
    /// past 448 (incl. Inf) -> +-448, NaN -> 0x7F (sign kept), -0 -> 0x80.
    pub fn encode_sat(x: f64) -> u8 {
        todo!("formats helper: {x}")
    }
}

pub mod e5m2 {
    /// Exact decode of an E5M2 code (Inf and NaN codes give Inf / NaN).
    pub fn decode(code: u8) -> f32 {
        todo!("formats helper: {code}")
    }
    /// Saturating RNE encode: past 57344 (incl. Inf) -> +-57344, NaN -> NaN
    /// (0x7E, sign kept), -0 -> 0x80.
    pub fn encode_sat(x: f64) -> u8 {
        todo!("formats helper: {x}")
    }
}

impl Fp8 {
    pub fn decode(self, code: u8) -> f32 {
        match self {
            Fp8::E4M3 => e4m3::decode(code),
            Fp8::E5M2 => e5m2::decode(code),
        }
    }
    pub fn encode_sat(self, x: f64) -> u8 {
        match self {
            Fp8::E4M3 => e4m3::encode_sat(x),
            Fp8::E5M2 => e5m2::encode_sat(x),
        }
    }
}
