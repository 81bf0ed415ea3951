use alloc::string::String;

/// Why a format operation refused its input. Messages name the tensor shape,
/// block or field at fault so a CLI can print them as one line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FormatError {
    /// The last dimension is not a multiple of the block size (never padded).
    #[error("last dimension {cols} is not a multiple of the block size {block}")]
    NotBlockMultiple { cols: usize, block: usize },
    /// A buffer has the wrong length for the declared shape.
    #[error("{what}: expected {expected} bytes/elements for shape [{rows}, {cols}], got {got}")]
    BadLength {
        what: &'static str,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    /// A lossless conversion met a block it cannot represent exactly.
    #[error("block (row {row}, block {block}) cannot be converted losslessly: {why}")]
    NotExact {
        row: usize,
        block: usize,
        why: String,
    },
    /// Anything else, with its reason.
    #[error("{0}")]
    Invalid(String),
}
