//! `m3 quant` / `m3 dequant` (not built yet).

#[derive(clap::Args)]
pub struct QuantArgs {}

#[derive(clap::Args)]
pub struct DequantArgs {}

pub fn run_quant(_args: QuantArgs) -> anyhow::Result<()> {
    anyhow::bail!("`m3 quant` is not implemented yet")
}

pub fn run_dequant(_args: DequantArgs) -> anyhow::Result<()> {
    anyhow::bail!("`m3 dequant` is not implemented yet")
}
