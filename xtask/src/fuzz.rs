//! `cargo xtask fuzz` (not built yet).

#[derive(clap::Args)]
pub struct FuzzArgs {}

pub fn fuzz(_args: FuzzArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
