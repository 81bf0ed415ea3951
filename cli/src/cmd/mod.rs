//! One module per subcommand.
pub mod batch;
pub mod bench;
pub mod bench_serve;
pub mod convert;
pub mod forward;
pub mod generate;
pub mod inspect;
pub mod parity;
pub mod quant;
pub mod serve;
pub mod synth;
