//! Empty: xtask has a build script only so that its `[build-dependencies]`
//! (syn's features, see Cargo.toml) join the host graph the workspace's
//! proc macros build in.

fn main() {}
