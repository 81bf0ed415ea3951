//! `cargo xtask kernels` (not built yet).

#[derive(clap::Args)]
pub struct KernelsArgs {}

pub fn kernels(_args: KernelsArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
