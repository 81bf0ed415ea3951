//! `cargo xtask gen_spec` and `cargo xtask conform` (not built yet).

#[derive(clap::Args)]
pub struct GenSpecArgs {}

#[derive(clap::Args)]
pub struct ConformArgs {}

pub fn gen_spec(_args: GenSpecArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}

pub fn conform(_args: ConformArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
