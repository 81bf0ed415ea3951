//! Every kernel source compiles with NVRTC for sm_90 (and, when a GPU is
//! present, its own arch). Needs libnvrtc on the loader path; skips without
//! it unless REQUIRE_GPU=1 or REQUIRE_NVRTC=1.

use m3_gpu::cuda::nvrtc;
use m3_gpu::kernels::{self, KernelSource};

fn nvrtc_or_skip() -> bool {
    match nvrtc::available() {
        Ok(()) => true,
        Err(e) => {
            let must = ["REQUIRE_GPU", "REQUIRE_NVRTC"]
                .iter()
                .any(|v| std::env::var(v).map(|x| x == "1").unwrap_or(false));
            if must {
                panic!("NVRTC required but unavailable: {e}");
            }
            println!("skipped: {e}");
            false
        }
    }
}

#[test]
fn every_kernel_compiles_for_sm90() {
    if !nvrtc_or_skip() {
        return;
    }
    let (ma, mi) = nvrtc::version().unwrap();
    println!("NVRTC {ma}.{mi}");
    for k in kernels::ALL {
        let t = std::time::Instant::now();
        let bin =
            nvrtc::compile_cubin(k.name, &k.full_source(), "sm_90", &k.nvrtc_options("sm_90"))
                .unwrap_or_else(|e| panic!("{e}"));
        // a CUBIN is an ELF file that names every entry point
        assert_eq!(&bin[..4], b"\x7fELF", "{}: not an ELF CUBIN", k.name);
        for e in k.entries {
            assert!(
                bin.windows(e.len()).any(|w| w == e.as_bytes()),
                "{}: entry {e} missing from the CUBIN",
                k.name
            );
        }
        println!(
            "{:8} {:7} bytes {:6.0} ms",
            k.name,
            bin.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}

#[test]
fn a_broken_kernel_is_reported_with_its_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let bad = KernelSource {
        name: "broken",
        body: "M3_KERNEL void k(float* x) { x[0] = undefined_name; }",
        exact: false,
        entries: &[],
    };
    let err = nvrtc::compile_cubin(
        bad.name,
        &bad.full_source(),
        "sm_90",
        &bad.nvrtc_options("sm_90"),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("broken") && msg.contains("undefined_name"),
        "{msg}"
    );
}

#[test]
fn format_kernels_get_fma_contraction_off() {
    assert!(kernels::FORMATS
        .nvrtc_options("sm_90")
        .iter()
        .any(|o| o == "--fmad=false"));
    assert!(!kernels::LINEAR
        .nvrtc_options("sm_90")
        .iter()
        .any(|o| o == "--fmad=false"));
    assert!(kernels::FORMATS
        .hip_options("gfx950")
        .iter()
        .any(|o| o == "-ffp-contract=off"));
}

#[test]
fn opening_a_gpu_never_panics() {
    // With no driver this is an error value, with one a device: never a panic.
    match m3_gpu::CudaGpu::open(0) {
        Ok(g) => println!("GPU: {:?}", g.info()),
        Err(e) => println!("no GPU: {e}"),
    }
    match m3_gpu::CudaGpu::open(1_000) {
        Ok(_) => panic!("device 1000 cannot exist"),
        Err(e) => println!("device 1000: {e}"),
    }
    match m3_gpu::hip::HipGpu::open() {
        Ok(h) => println!("HIP device {}", h.arch),
        Err(e) => println!("no HIP: {e}"),
    }
}
