//! `cargo xtask gen_golden` and `cargo xtask golden` (not built yet).

#[derive(clap::Args)]
pub struct GenGoldenArgs {}

#[derive(clap::Args)]
pub struct GoldenArgs {}

pub fn gen_golden(_args: GenGoldenArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}

pub fn golden(_args: GoldenArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
