//! `--backend auto|cpu|gpu` for `m3 forward` / `m3 generate`.
//!
//! - `cpu`: the CPU reference (`m3_cpu_ref::CpuBackend`);
//! - `gpu`: the CUDA backend (`m3_gpu::GpuBackend`); no usable device is an
//!   error that says why (no driver, no device, no NVRTC, arch);
//! - `auto`: the GPU when one opens, else the CPU reference, with one
//!   `info:` line on stderr naming the choice and why.

use anyhow::{bail, Result};
use m3_core::backend::Backend;

/// A parsed `--backend` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Cpu,
    Gpu,
}

impl BackendChoice {
    /// Parse the command-line spelling.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "auto" => BackendChoice::Auto,
            "cpu" => BackendChoice::Cpu,
            "gpu" | "cuda" => BackendChoice::Gpu,
            other => bail!("--backend: `{other}` is not one of auto, cpu, gpu"),
        })
    }
}

/// Open the backend `name` names (see the module docs).
pub fn select(name: &str) -> Result<Box<dyn Backend + Sync>> {
    let cpu = || -> Box<dyn Backend + Sync> { Box::new(m3_cpu_ref::CpuBackend::new()) };
    match BackendChoice::parse(name)? {
        BackendChoice::Cpu => Ok(cpu()),
        BackendChoice::Gpu => match m3_gpu::GpuBackend::open() {
            Ok(g) => Ok(Box::new(g)),
            Err(e) => bail!("--backend gpu: no usable GPU: {e}"),
        },
        BackendChoice::Auto => match m3_gpu::GpuBackend::open() {
            Ok(g) => {
                let i = g.gpu().info();
                eprintln!("info: --backend auto: using gpu ({}, {})", i.name, i.arch);
                Ok(Box::new(g))
            }
            Err(e) => {
                eprintln!("info: --backend auto: using cpu (no usable GPU: {e})");
                Ok(cpu())
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_spellings_and_rejects_others() {
        assert_eq!(BackendChoice::parse("auto").ok(), Some(BackendChoice::Auto));
        assert_eq!(BackendChoice::parse("cpu").ok(), Some(BackendChoice::Cpu));
        assert_eq!(BackendChoice::parse("gpu").ok(), Some(BackendChoice::Gpu));
        let e = BackendChoice::parse("tpu").err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("tpu")));
    }

    #[test]
    fn cpu_and_auto_always_give_a_backend() {
        assert_eq!(
            select("cpu").map(|b| b.name().to_string()).ok().as_deref(),
            Some("cpu")
        );
        // auto: gpu where a device opens, else cpu; never an error
        let name = select("auto").map(|b| b.name().to_string());
        assert!(matches!(name.as_deref(), Ok("cpu") | Ok("gpu")));
    }

    #[test]
    fn gpu_without_a_device_is_a_clear_error() {
        if m3_gpu::GpuBackend::open().is_ok() {
            return; // a device is present: nothing to check here
        }
        let e = select("gpu").err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.starts_with("--backend gpu: no usable GPU")));
    }
}
