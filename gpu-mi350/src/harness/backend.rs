//! `GpuBackend`: `m3_core::backend::Backend` on a GPU, CUDA or HIP. `load`
//! gives the device-resident engine ([`crate::GpuRunner`]) on either vendor
//! (it runs above the runtime line, [`crate::runtime::api::Gpu`]); `run_op`
//! runs every `Op` by a kernel, one op at a time (the op-parity harness,
//! below), on CUDA only: the harness calls cudarc directly by choice (a
//! diagnosis and conformance tool), so on a HIP device every op is refused
//! with [`BackendError::Unsupported`] naming it.
//!
//! [`GpuBackend::open`] tries CUDA first and HIP where CUDA finds no device
//! ([`pick`] holds that order; `M3_GPU_RUNTIME=cuda|hip` forces one).
//!
//! `run_op` takes host slices, so each op uploads its activations, runs its
//! kernels and downloads its outputs; the KV cache stays a host
//! `CacheTensor` (uploaded whole for attention, written back row by row).
//! Weights are uploaded once and kept on the device, keyed by the host
//! address, length and shape of their buffers plus a content fingerprint:
//! model weights are immutable for the backend's lifetime (a caller that
//! frees weights and builds new ones, like a test suite, calls
//! [`GpuBackend::forget_weights`]).
//!
//! Linear layers with bf16 input and bf16 output on a quantized or bf16
//! weight (K a multiple of 32) run the runtime's GEMV kernels
//! (`ops::linear`); the router (f32 input), the LM head (f32 output) and f32
//! weights run `m3_linear_generic`. A `HostRunner` over this backend
//! (`m3_core::backend::HostRunner`) composes these ops (`forward_by_ops`)
//! into whole steps: the op path, kept for parity only. Stochastic sampling
//! runs on the host (`m3_core::sample`); greedy rows run on the device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use m3_core::backend::{
    ActMode, Backend, BackendError, BlockSelection, BoxedRunner, LinearInput, LoadProgress,
    LoadSpec, ModelSource, Op, StepBatch,
};
use m3_core::config::IndexSelection;
use m3_core::formats::{bf16, MxElem, MxTensor, Nvfp4Tensor, ScaleRule};
use m3_core::kv::{CacheData, CacheDtype, CacheTensor};
use m3_core::sample;
use m3_core::weights::{LinearWeight, MlpWeights, MoeWeights};

use super::ops::attention::{CacheKind, DeviceCache, DeviceStep, MAX_HEAD_DIM};
use super::ops::elementwise::DeviceWeight;
use crate::error::GpuError;
use crate::runtime::api::Gpu;
use crate::{CudaGpu, DeviceLinear, HipGpu};

/// Identity of a host weight buffer: (address, length, rows, cols,
/// fingerprint of its first/last bytes, scales and global scale).
type WeightKey = (usize, usize, usize, usize, u64);

/// The GPU backend: one device, CUDA or HIP, and how loaded models run.
pub struct GpuBackend {
    device: Opened,
    /// How loaded models run (graph sizes, programmatic dependent launch).
    pub path_options: crate::standard::PathOptions,
}

/// The device a [`GpuBackend`] holds. The op harness exists on CUDA only
/// (it is written against cudarc, see the module docs), so it lives inside
/// the CUDA arm and a HIP device has none to call by mistake.
enum Opened {
    /// Boxed: the harness (device, two weight caches) is the larger arm.
    Cuda(Box<Harness>),
    Hip(HipGpu),
}

/// The op-by-op harness on a CUDA device: the device and the weights
/// uploaded so far.
struct Harness {
    gpu: CudaGpu,
    /// Weights in their stored format (generic kernels, embedding).
    generic: Mutex<HashMap<WeightKey, Arc<DeviceWeight>>>,
    /// Weights in the runtime's GEMV layout (`ops::linear`).
    fast: Mutex<HashMap<WeightKey, Arc<DeviceLinear>>>,
}

/// Which runtime [`GpuBackend::open`] opened (or was forced to open by
/// `M3_GPU_RUNTIME`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    Cuda,
    Hip,
}

/// One of two opened devices (generic so the open order is testable
/// without either vendor's library).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Picked<C, H> {
    Cuda(C),
    Hip(H),
}

/// The open order, as pure logic: CUDA first; HIP only where CUDA found no
/// device at all (no driver library, or a driver with no device), so a
/// broken NVIDIA setup (no NVRTC, an arch NVRTC cannot target) is reported
/// as itself rather than hidden behind "no HIP either". `force` (the value
/// of `M3_GPU_RUNTIME`) opens that runtime only. HIP is opened lazily: a
/// CUDA machine never loads ROCm's libraries. When neither opens the
/// error names both reasons.
pub(crate) fn pick<C, H>(
    force: Option<&str>,
    cuda: impl FnOnce() -> crate::Result<C>,
    hip: impl FnOnce() -> crate::Result<H>,
) -> crate::Result<Picked<C, H>> {
    match force.map(str::trim) {
        None | Some("") => {}
        Some(f) if f.eq_ignore_ascii_case("cuda") => return cuda().map(Picked::Cuda),
        Some(f) if f.eq_ignore_ascii_case("hip") => return hip().map(Picked::Hip),
        Some(f) => {
            return Err(GpuError::input(
                "M3_GPU_RUNTIME",
                format!("{f:?} is none of cuda, hip, sim, sim-cuda"),
            ))
        }
    }
    match cuda() {
        Ok(c) => Ok(Picked::Cuda(c)),
        Err(c @ (GpuError::NoDriver(_) | GpuError::NoDevice(_))) => match hip() {
            Ok(h) => Ok(Picked::Hip(h)),
            Err(h) => Err(GpuError::NoGpu {
                cuda: Box::new(c),
                hip: Box::new(h),
            }),
        },
        Err(c) => Err(c),
    }
}

/// GPU errors as backend errors naming the op.
trait OpCtx<T> {
    fn op(self, name: &'static str) -> Result<T, BackendError>;
}

impl<T> OpCtx<T> for crate::Result<T> {
    fn op(self, name: &'static str) -> Result<T, BackendError> {
        self.map_err(|e| BackendError::Other(format!("gpu {name}: {e}")))
    }
}

fn shape(op: &'static str, what: String) -> BackendError {
    BackendError::Shape { op, what }
}

/// FNV-1a over a few byte windows.
fn fingerprint(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        let head = &p[..p.len().min(64)];
        let tail = &p[p.len().saturating_sub(64)..];
        for &b in head.iter().chain(tail) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= p.len() as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn weight_key(w: &LinearWeight) -> WeightKey {
    let (addr, len, fp) = match w {
        LinearWeight::Bf16 { data, .. } => (
            data.as_ptr() as usize,
            data.len(),
            fingerprint(&[bytemuck::cast_slice(data)]),
        ),
        LinearWeight::F32 { data, .. } => (
            data.as_ptr() as usize,
            data.len(),
            fingerprint(&[bytemuck::cast_slice(data)]),
        ),
        LinearWeight::Mx(t) => (
            t.codes().as_ptr() as usize,
            t.codes().len(),
            fingerprint(&[t.codes(), t.scales(), &[t.elem() as u8]]),
        ),
        LinearWeight::Nvfp4(t) => (
            t.codes().as_ptr() as usize,
            t.codes().len(),
            fingerprint(&[t.codes(), t.scales(), &t.global().to_le_bytes()]),
        ),
    };
    (addr, len, w.rows(), w.cols(), fp)
}

/// The bytes of a cache tensor as stored: the elements (bf16 bits, E4M3
/// codes, packed E2M1 codes), NVFP4's block scales, and how to read them.
fn cache_parts(c: &CacheTensor) -> (&[u8], Option<&[u8]>, CacheKind) {
    match &c.data {
        CacheData::Bf16(d) => (bytemuck::cast_slice(d), None, CacheKind::Bf16),
        CacheData::Fp8(d) => (d, None, CacheKind::Fp8),
        CacheData::Nvfp4 { codes, scales } => (codes, Some(scales), CacheKind::Nvfp4),
    }
}

impl GpuBackend {
    /// Open a GPU: CUDA device 0, or where CUDA finds no device, HIP device
    /// 0 (see [`pick`]; `M3_GPU_RUNTIME=cuda|hip` opens that one only, and
    /// `M3_GPU_RUNTIME=sim|sim-cuda` the simulator on this machine's CPU,
    /// `runtime::sim`).
    /// Any error means "no usable GPU here" and says why, for both vendors.
    pub fn open() -> crate::Result<Self> {
        let force = std::env::var("M3_GPU_RUNTIME").ok();
        if let Some(sim) = crate::runtime::sim::from_env() {
            return sim.map(Self::new_hip);
        }
        Ok(
            match pick(force.as_deref(), || CudaGpu::open(0), HipGpu::open)? {
                Picked::Cuda(c) => Self::new(c),
                Picked::Hip(h) => Self::new_hip(h),
            },
        )
    }

    /// Wrap an opened CUDA device (the engine and the op harness).
    pub fn new(gpu: CudaGpu) -> Self {
        Self::with(Opened::Cuda(Box::new(Harness {
            gpu,
            generic: Mutex::new(HashMap::new()),
            fast: Mutex::new(HashMap::new()),
        })))
    }

    /// Wrap an opened HIP device (the engine only; `run_op` refuses).
    pub fn new_hip(gpu: HipGpu) -> Self {
        Self::with(Opened::Hip(gpu))
    }

    fn with(device: Opened) -> Self {
        GpuBackend {
            device,
            path_options: crate::standard::PathOptions::default(),
        }
    }

    /// The device, as the runtime line sees it (either vendor).
    pub fn gpu(&self) -> &dyn Gpu {
        match &self.device {
            Opened::Cuda(h) => &h.gpu,
            Opened::Hip(h) => h,
        }
    }

    /// The CUDA device, where this backend holds one (the op harness's;
    /// `bench`'s kernels).
    pub fn cuda(&self) -> Option<&CudaGpu> {
        match &self.device {
            Opened::Cuda(h) => Some(&h.gpu),
            Opened::Hip(_) => None,
        }
    }

    /// Which runtime the device is on.
    pub fn runtime(&self) -> Runtime {
        match &self.device {
            Opened::Cuda(_) => Runtime::Cuda,
            Opened::Hip(_) => Runtime::Hip,
        }
    }

    /// One line naming the device for logs: vendor, name (CUDA's; HIP's
    /// is not read by the binding) and architecture.
    pub fn describe(&self) -> String {
        match &self.device {
            Opened::Cuda(h) => {
                let i = h.gpu.info();
                format!("CUDA, {}, {}", i.name, i.arch)
            }
            Opened::Hip(h) => match h.sim_flavour() {
                Some(f) => {
                    format!("the kernel simulator on this CPU ({f} flavour; slow, for checking)")
                }
                None => format!("HIP, {}, never run on AMD hardware", h.arch),
            },
        }
    }

    /// Drop every cached device weight (call when host weights were freed
    /// and others may be allocated at the same addresses). Nothing on HIP.
    pub fn forget_weights(&self) {
        if let Opened::Cuda(h) = &self.device {
            h.forget_weights();
        }
    }

    /// Device bytes held by the op harness's cached weights (0 on HIP).
    pub fn weight_bytes(&self) -> usize {
        match &self.device {
            Opened::Cuda(h) => h.weight_bytes(),
            Opened::Hip(_) => 0,
        }
    }
}

impl Harness {
    fn forget_weights(&self) {
        if let Ok(mut g) = self.generic.lock() {
            g.clear();
        }
        if let Ok(mut f) = self.fast.lock() {
            f.clear();
        }
    }

    fn weight_bytes(&self) -> usize {
        let g: usize = self
            .generic
            .lock()
            .map(|m| m.values().map(|w| w.bytes()).sum())
            .unwrap_or(0);
        let f: usize = self
            .fast
            .lock()
            .map(|m| m.values().map(|w| w.bytes()).sum())
            .unwrap_or(0);
        g + f
    }

    fn generic(&self, w: &LinearWeight) -> Result<Arc<DeviceWeight>, BackendError> {
        let key = weight_key(w);
        if let Some(d) = self.generic.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(d);
        }
        let d = Arc::new(self.gpu.upload_weight(w).op("upload weight")?);
        if let Ok(mut m) = self.generic.lock() {
            m.insert(key, d.clone());
        }
        Ok(d)
    }

    fn fast(&self, w: &LinearWeight) -> Result<Arc<DeviceLinear>, BackendError> {
        let key = weight_key(w);
        if let Some(d) = self.fast.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(d);
        }
        let d = match w {
            LinearWeight::Bf16 { rows, cols, data } => {
                self.gpu.upload_linear_bf16(*rows, *cols, data)
            }
            LinearWeight::Mx(t) => self.gpu.upload_linear_mx(t),
            LinearWeight::Nvfp4(t) => self.gpu.upload_linear_nvfp4(t),
            LinearWeight::F32 { .. } => {
                return Err(shape(
                    "linear",
                    "f32 weights take the generic kernel".into(),
                ))
            }
        };
        let d = Arc::new(d.op("upload weight")?);
        if let Ok(mut m) = self.fast.lock() {
            m.insert(key, d.clone());
        }
        Ok(d)
    }

    fn up<T: DeviceRepr + ValidAsZeroBits>(&self, x: &[T]) -> Result<CudaSlice<T>, BackendError> {
        if x.is_empty() {
            return self.gpu.zeros::<T>(1).op("upload");
        }
        self.gpu.upload(x).op("upload")
    }

    fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, BackendError> {
        self.gpu.zeros::<T>(n).op("alloc")
    }

    /// Download the first `n` elements into `out`.
    fn down_into<T: DeviceRepr + Copy>(
        &self,
        x: &CudaSlice<T>,
        out: &mut [T],
    ) -> Result<(), BackendError> {
        let v = self.gpu.download(x).op("download")?;
        let n = out.len();
        if v.len() < n {
            return Err(BackendError::Other(format!(
                "gpu download: {} values for {n}",
                v.len()
            )));
        }
        out.copy_from_slice(&v[..n]);
        Ok(())
    }

    fn down<T: DeviceRepr + Copy + Default>(
        &self,
        x: &CudaSlice<T>,
        n: usize,
    ) -> Result<Vec<T>, BackendError> {
        let mut v = vec![T::default(); n];
        self.down_into(x, &mut v)?;
        Ok(v)
    }

    /// MXFP4 fake-quantization (`even` rule) of `bf16(x)` in rows of `cols`,
    /// on the runtime's format kernels.
    fn act_quant(&self, x: &[f32], cols: usize) -> Result<Vec<f32>, BackendError> {
        if cols == 0 || !cols.is_multiple_of(32) || !x.len().is_multiple_of(cols) {
            return Err(shape(
                "act_quant_mxfp4",
                format!(
                    "row width {cols} must be a positive multiple of 32 dividing {}",
                    x.len()
                ),
            ));
        }
        if x.is_empty() {
            return Ok(Vec::new());
        }
        let rows = x.len() / cols;
        let xb: Vec<f32> = x.iter().map(|&v| bf16::to_f32(bf16::from_f32(v))).collect();
        let q = self
            .gpu
            .mx_quantize(&xb, rows, cols, MxElem::Fp4E2M1, ScaleRule::Even)
            .op("act_quant_mxfp4")?;
        self.gpu
            .mx_dequantize(MxElem::Fp4E2M1, &q.codes, &q.scales, rows, cols)
            .op("act_quant_mxfp4")
    }

    /// `y = x W^T` on device rows `x` `[rows, K]` -> `[rows, N]` f32.
    fn lin(
        &self,
        w: &LinearWeight,
        x: &CudaSlice<f32>,
        rows: usize,
        input: LinearInput,
        round_out: bool,
    ) -> Result<CudaSlice<f32>, BackendError> {
        let (n, k) = (w.rows(), w.cols());
        let quantized;
        let (x, input) = if input == LinearInput::Mxfp4 {
            let xh = self.down(x, rows * k)?;
            quantized = self.up(&self.act_quant(&xh, k)?)?;
            // MXFP4 values are exact in bf16.
            (&quantized, LinearInput::Bf16)
        } else {
            (x, input)
        };
        let mut y = self.zeros::<f32>(rows * n)?;
        if rows == 0 {
            return Ok(y);
        }
        let fast = input == LinearInput::Bf16
            && round_out
            && !matches!(w, LinearWeight::F32 { .. })
            && k > 0
            && k.is_multiple_of(32);
        if fast {
            let dw = self.fast(w)?;
            let mut xb = self.zeros::<u16>(rows * k)?;
            self.gpu.to_bf16_dev(x, &mut xb, rows * k).op("linear")?;
            let mut yb = self.zeros::<u16>(rows * n)?;
            self.gpu.linear_into(&dw, &xb, rows, &mut yb).op("linear")?;
            self.gpu.from_bf16_dev(&yb, &mut y, rows * n).op("linear")?;
        } else {
            let dw = self.generic(w)?;
            self.gpu
                .linear_generic_dev(&dw, x, rows, input == LinearInput::Bf16, round_out, &mut y)
                .op("linear")?;
        }
        Ok(y)
    }

    /// One SwiGLU-OAI MLP on device rows.
    fn mlp(
        &self,
        x: &CudaSlice<f32>,
        rows: usize,
        w: &MlpWeights,
        input: LinearInput,
        alpha: f32,
        limit: f32,
    ) -> Result<CudaSlice<f32>, BackendError> {
        let width = w.gate.rows();
        let g = self.lin(&w.gate, x, rows, input, true)?;
        let u = self.lin(&w.up, x, rows, input, true)?;
        let mut a = self.zeros::<f32>(rows * width)?;
        self.gpu
            .swiglu_dev(&g, &u, alpha, limit, &mut a, rows * width)
            .op("swiglu")?;
        self.lin(&w.down, &a, rows, input, true)
    }

    /// Upload the step's tables. The kernels index without bounds checks:
    /// `Op::check` (run first in `run_op`) has refused malformed steps.
    fn device_step(
        &self,
        op: &'static str,
        step: &StepBatch,
        page: usize,
    ) -> Result<DeviceStep, BackendError> {
        let tables: Vec<&[u32]> = step.seqs.iter().map(|s| s.block_table.as_slice()).collect();
        self.gpu
            .upload_step(&step.positions, &step.row_seq, &tables, page)
            .op(op)
    }

    fn device_cache(&self, c: &CacheTensor) -> Result<DeviceCache, BackendError> {
        let (data, scales, kind) = cache_parts(c);
        Ok(DeviceCache {
            data: self.up(data)?,
            scales: scales.map(|s| self.up(s)).transpose()?,
            kind,
            scale: c.scale,
        })
    }

    fn embed(
        &self,
        table: &LinearWeight,
        tokens: &[u32],
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        if out.is_empty() {
            return Ok(());
        }
        let w = self.generic(table)?;
        let ids = self.up(tokens)?;
        let mut y = self.zeros::<f32>(out.len())?;
        self.gpu
            .decode_rows_dev(&w, &ids, tokens.len(), &mut y)
            .op("embed")?;
        self.down_into(&y, out)
    }

    fn linear(
        &self,
        x: &[f32],
        rows: usize,
        w: &LinearWeight,
        input: LinearInput,
        round_out: bool,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        if out.is_empty() {
            return Ok(());
        }
        let xd = self.up(x)?;
        let y = self.lin(w, &xd, rows, input, round_out)?;
        self.down_into(&y, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut [f32],
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
        theta: f64,
        positions: &[u32],
        round_out: bool,
    ) -> Result<(), BackendError> {
        if x.is_empty() {
            return Ok(());
        }
        let mut xd = self.up(x)?;
        let pd = self.up(positions)?;
        self.gpu
            .rope_dev(
                &mut xd,
                &pd,
                theta,
                heads,
                head_dim,
                rotary_dim,
                positions.len(),
                round_out,
            )
            .op("rope")?;
        self.down_into(&xd, x)
    }

    fn cache_write(
        &self,
        cache: &mut CacheTensor,
        slots: &[u32],
        x: &[f32],
    ) -> Result<(), BackendError> {
        let w = cache.width;
        if x.is_empty() {
            return Ok(());
        }
        if let CacheData::Nvfp4 { codes, scales } = &mut cache.data {
            return self.cache_write_nvfp4(w, cache.scale, codes, scales, slots, x);
        }
        let fp8 = matches!(cache.data, CacheData::Fp8(_));
        let xd = self.up(x)?;
        let mut o16 = self.zeros::<u16>(if fp8 { 1 } else { x.len() })?;
        let mut o8 = self.zeros::<u8>(if fp8 { x.len() } else { 1 })?;
        self.gpu
            .cache_encode_dev(&xd, x.len(), fp8, cache.scale, &mut o16, &mut o8)
            .op("cache_write")?;
        match &mut cache.data {
            CacheData::Bf16(d) => {
                let v = self.down(&o16, x.len())?;
                for (t, &s) in slots.iter().enumerate() {
                    let s = s as usize;
                    d[s * w..(s + 1) * w].copy_from_slice(&v[t * w..(t + 1) * w]);
                }
            }
            CacheData::Fp8(d) => {
                let v = self.down(&o8, x.len())?;
                for (t, &s) in slots.iter().enumerate() {
                    let s = s as usize;
                    d[s * w..(s + 1) * w].copy_from_slice(&v[t * w..(t + 1) * w]);
                }
            }
            // stored by cache_write_nvfp4 (returned above)
            CacheData::Nvfp4 { .. } => {}
        }
        Ok(())
    }

    /// NVFP4 cache write: every row of `x` encoded on the device
    /// (`m3_cache_encode_nvfp4`), then its codes and block scales copied to
    /// `slots` of the host tensor's two arrays (`CacheTensor::write`'s
    /// layout). `Op::check` has checked the rows and slots.
    fn cache_write_nvfp4(
        &self,
        w: usize,
        g: f32,
        codes: &mut [u8],
        scales: &mut [u8],
        slots: &[u32],
        x: &[f32],
    ) -> Result<(), BackendError> {
        let b = CacheDtype::Nvfp4.block();
        if w == 0 || !w.is_multiple_of(b) || x.len() != slots.len() * w {
            return Err(BackendError::Unsupported {
                op: "cache_write",
                backend: "gpu".into(),
                what: format!(
                    "{} values for {} NVFP4 rows of {w} (a multiple of {b})",
                    x.len(),
                    slots.len()
                ),
            });
        }
        let nblocks = x.len() / b;
        let xd = self.up(x)?;
        let mut cd = self.zeros::<u8>(x.len() / 2)?;
        let mut sd = self.zeros::<u8>(nblocks)?;
        self.gpu
            .cache_encode_nvfp4_dev(&xd, nblocks, g, &mut cd, &mut sd)
            .op("cache_write")?;
        let (c, s) = (self.down(&cd, x.len() / 2)?, self.down(&sd, nblocks)?);
        let (cw, sw) = (w / 2, w / b);
        for (t, &slot) in slots.iter().enumerate() {
            let slot = slot as usize;
            let dst = codes.get_mut(slot * cw..(slot + 1) * cw);
            let sdst = scales.get_mut(slot * sw..(slot + 1) * sw);
            let (Some(dst), Some(sdst)) = (dst, sdst) else {
                return Err(BackendError::Unsupported {
                    op: "cache_write",
                    backend: "gpu".into(),
                    what: format!("slot {slot} outside the NVFP4 cache"),
                });
            };
            dst.copy_from_slice(&c[t * cw..(t + 1) * cw]);
            sdst.copy_from_slice(&s[t * sw..(t + 1) * sw]);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn index_scores(
        &self,
        q: &[f32],
        heads: usize,
        dim: usize,
        cache: &CacheTensor,
        step: &StepBatch,
        page: usize,
        bs: usize,
        nb: usize,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let ds = self.device_step("index_scores", step, page)?;
        if out.is_empty() {
            return Ok(());
        }
        let qd = self.up(q)?;
        let cd = self.device_cache(cache)?;
        let mut y = self.zeros::<f32>(out.len())?;
        self.gpu
            .index_scores_dev(&qd, heads, dim, &cd, &ds, bs, nb, &mut y)
            .op("index_scores")?;
        self.down_into(&y, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn block_topk(
        &self,
        scores: &[f32],
        heads: usize,
        nb: usize,
        positions: &[u32],
        bs: usize,
        topk: usize,
        init: usize,
        local: usize,
        selection: IndexSelection,
        kv_heads: usize,
        out: &mut [i32],
    ) -> Result<(), BackendError> {
        let t_rows = positions.len();
        let shared = selection == IndexSelection::Shared;
        if out.is_empty() {
            return Ok(());
        }
        let sd = self.up(scores)?;
        let pd = self.up(positions)?;
        let mut y = self.zeros::<i32>(out.len())?;
        self.gpu
            .block_topk_dev(
                &sd, heads, nb, &pd, t_rows, bs, topk, init, local, shared, kv_heads, &mut y,
            )
            .op("block_topk")?;
        self.down_into(&y, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &[f32],
        heads: usize,
        kv_heads: usize,
        d: usize,
        k: &CacheTensor,
        v: &CacheTensor,
        step: &StepBatch,
        page: usize,
        blocks: Option<BlockSelection<'_>>,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        if d > MAX_HEAD_DIM || k.dtype() != v.dtype() {
            return Err(BackendError::Unsupported {
                op: "attention",
                backend: "gpu".into(),
                what: format!(
                    "head_dim {d} (max {MAX_HEAD_DIM}), K {:?} / V {:?}",
                    k.dtype(),
                    v.dtype()
                ),
            });
        }
        let ds = self.device_step("attention", step, page)?;
        if out.is_empty() {
            return Ok(());
        }
        let qd = self.up(q)?;
        let kd = self.device_cache(k)?;
        let vd = self.device_cache(v)?;
        let ids = match &blocks {
            Some(b) => Some((self.up(b.blocks)?, b.topk, b.block_size)),
            None => None,
        };
        let mut y = self.zeros::<f32>(out.len())?;
        self.gpu
            .attention_dev(
                &qd,
                heads,
                kv_heads,
                d,
                &kd,
                &vd,
                &ds,
                ids.as_ref().map(|(i, k, b)| (i, *k, *b)),
                &mut y,
            )
            .op("attention")?;
        self.down_into(&y, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn router(
        &self,
        x: &[f32],
        rows: usize,
        w: &LinearWeight,
        bias: &[f32],
        top_k: usize,
        scaling: f32,
        ids: &mut [i32],
        weights: &mut [f32],
    ) -> Result<(), BackendError> {
        let ne = w.rows();
        if rows == 0 {
            return Ok(());
        }
        let xd = self.up(x)?;
        let z = self.lin(w, &xd, rows, LinearInput::F32, false)?;
        let bd = self.up(bias)?;
        let mut di = self.zeros::<i32>(rows * top_k)?;
        let mut dw = self.zeros::<f32>(rows * top_k)?;
        self.gpu
            .router_select_dev(&z, &bd, ne, top_k, scaling, rows, &mut di, &mut dw)
            .op("router")?;
        self.down_into(&di, ids)?;
        self.down_into(&dw, weights)
    }

    fn swiglu(
        &self,
        gate: &[f32],
        up: &[f32],
        alpha: f32,
        limit: f32,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        if out.is_empty() {
            return Ok(());
        }
        let (g, u) = (self.up(gate)?, self.up(up)?);
        let mut y = self.zeros::<f32>(out.len())?;
        self.gpu
            .swiglu_dev(&g, &u, alpha, limit, &mut y, out.len())
            .op("swiglu")?;
        self.down_into(&y, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn mlp_op(
        &self,
        x: &[f32],
        rows: usize,
        w: &MlpWeights,
        alpha: f32,
        limit: f32,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        if out.is_empty() {
            return Ok(());
        }
        let xd = self.up(x)?;
        let y = self.mlp(&xd, rows, w, LinearInput::Bf16, alpha, limit)?;
        self.down_into(&y, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn experts(
        &self,
        x: &[f32],
        rows: usize,
        moe: &MoeWeights,
        ids: &[i32],
        weights: &[f32],
        top_k: usize,
        act: ActMode,
        alpha: f32,
        limit: f32,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let ne = moe.experts.len();
        if rows == 0 {
            return Ok(());
        }
        let h = x.len() / rows;
        let input = match act {
            ActMode::Bf16 => LinearInput::Bf16,
            ActMode::Mxfp4 => LinearInput::Mxfp4,
        };
        // Rows per expert, ascending; each expert runs once on its rows.
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); ne];
        for t in 0..rows {
            for i in 0..top_k {
                groups[ids[t * top_k + i] as usize].push(t);
            }
        }
        let mut base = vec![0usize; ne];
        let mut y_all: Vec<f32> = Vec::with_capacity(rows * top_k * h);
        for (e, rs) in groups.iter().enumerate() {
            base[e] = y_all.len() / h.max(1);
            if rs.is_empty() {
                continue;
            }
            let mut xe = Vec::with_capacity(rs.len() * h);
            for &t in rs {
                xe.extend_from_slice(&x[t * h..(t + 1) * h]);
            }
            let xd = self.up(&xe)?;
            let yd = self.mlp(&xd, rs.len(), &moe.experts[e], input, alpha, limit)?;
            y_all.extend(self.down(&yd, rs.len() * h)?);
        }
        // Per row: chosen experts ascending, each pointing at its output row.
        let mut src = vec![0u32; rows * top_k];
        let mut wts = vec![0.0f32; rows * top_k];
        let mut cursor = vec![0usize; ne];
        for t in 0..rows {
            let mut chosen: Vec<(usize, f32)> = (0..top_k)
                .map(|i| (ids[t * top_k + i] as usize, weights[t * top_k + i]))
                .collect();
            chosen.sort_by_key(|&(e, _)| e);
            for (i, &(e, we)) in chosen.iter().enumerate() {
                src[t * top_k + i] = (base[e] + cursor[e]) as u32;
                cursor[e] += 1;
                wts[t * top_k + i] = we;
            }
        }
        let xd = self.up(x)?;
        let shared = match &moe.shared {
            Some(sw) => Some(self.mlp(&xd, rows, sw, LinearInput::Bf16, alpha, limit)?),
            None => None,
        };
        let (yd, sd, wd) = (self.up(&y_all)?, self.up(&src)?, self.up(&wts)?);
        let mut od = self.zeros::<f32>(rows * h)?;
        self.gpu
            .moe_combine_dev(&yd, &sd, &wd, shared.as_ref(), rows, top_k, h, &mut od)
            .op("experts")?;
        self.down_into(&od, out)
    }

    fn add(&self, acc: &mut [f32], x: &[f32]) -> Result<(), BackendError> {
        if acc.is_empty() {
            return Ok(());
        }
        let mut a = self.up(acc)?;
        let b = self.up(x)?;
        self.gpu.add_dev(&mut a, &b, x.len()).op("add")?;
        self.down_into(&a, acc)
    }

    fn sample(
        &self,
        logits: &[f32],
        vocab: usize,
        params: &[sample::SampleParams],
        positions: &[u32],
        out: &mut [u32],
    ) -> Result<(), BackendError> {
        let rows = out.len();
        if params.iter().any(|p| p.is_greedy()) {
            let ld = self.up(logits)?;
            let mut od = self.zeros::<u32>(rows)?;
            self.gpu
                .argmax_dev(&ld, rows, vocab, &mut od)
                .op("sample")?;
            self.down_into(&od, out)?;
        }
        for (r, o) in out.iter_mut().enumerate() {
            if !params[r].is_greedy() {
                // Stochastic sampling: the host implementation (MODEL.md 4).
                *o = sample::sample(
                    &logits[r * vocab..(r + 1) * vocab],
                    &params[r],
                    positions[r],
                );
            }
        }
        Ok(())
    }

    fn dequantize(&self, w: &LinearWeight, out: &mut [f32]) -> Result<(), BackendError> {
        let n = w.rows();
        if out.is_empty() {
            return Ok(());
        }
        let dw = self.generic(w)?;
        let ids: Vec<u32> = (0..n as u32).collect();
        let idd = self.up(&ids)?;
        let mut y = self.zeros::<f32>(out.len())?;
        self.gpu
            .decode_rows_dev(&dw, &idd, n, &mut y)
            .op("dequantize")?;
        self.down_into(&y, out)
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> &str {
        "gpu"
    }

    /// The device-resident engine: weights streamed to the device, the
    /// paged caches, graph-captured steps ([`crate::GpuRunner`]).
    fn load<'b>(
        &'b self,
        source: ModelSource<'_>,
        spec: &LoadSpec,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<BoxedRunner<'b>, BackendError> {
        Ok(Box::new(crate::GpuRunner::load(
            self.gpu(),
            source,
            spec,
            self.path_options,
            progress,
        )?))
    }

    /// The op harness on CUDA; on HIP every op is refused by name (the
    /// engine, `load`, runs whole steps there).
    fn run_op(&self, op: Op<'_>) -> Result<(), BackendError> {
        match &self.device {
            Opened::Cuda(h) => h.run_op(op),
            Opened::Hip(g) => Err(BackendError::Unsupported {
                op: op.name(),
                backend: self.name().into(),
                what: format!(
                    "the op-by-op harness is CUDA only and this device is HIP ({}); \
                     whole models run on HIP through the device-resident engine \
                     (--backend gpu), not op by op",
                    g.arch
                ),
            }),
        }
    }
}

impl Harness {
    fn run_op(&self, op: Op<'_>) -> Result<(), BackendError> {
        op.check()?;
        match op {
            Op::Embed { table, tokens, out } => self.embed(table, tokens, out),
            Op::Linear {
                x,
                rows,
                w,
                input,
                round_out,
                out,
            } => self.linear(x, rows, w, input, round_out, out),
            Op::RmsNorm {
                x,
                width,
                weight,
                eps,
                round_out,
                out,
            } => {
                let (y, yb) = self
                    .gpu
                    .rmsnorm(x, weight, eps, x.len() / width, width)
                    .op("rmsnorm")?;
                if round_out {
                    for (o, &b) in out.iter_mut().zip(&yb) {
                        *o = bf16::to_f32(b);
                    }
                } else {
                    out.copy_from_slice(&y[..out.len()]);
                }
                Ok(())
            }
            Op::Rope {
                x,
                heads,
                head_dim,
                rotary_dim,
                theta,
                positions,
                round_out,
            } => self.rope(x, heads, head_dim, rotary_dim, theta, positions, round_out),
            Op::CacheWrite { cache, slots, x } => self.cache_write(cache, slots, x),
            Op::IndexScores {
                q,
                heads,
                dim,
                cache,
                step,
                page_size,
                block_size,
                nb,
                out,
            } => self.index_scores(q, heads, dim, cache, step, page_size, block_size, nb, out),
            Op::BlockTopK {
                scores,
                heads,
                nb,
                positions,
                block_size,
                topk,
                init_blocks,
                local_blocks,
                selection,
                kv_heads,
                out,
            } => self.block_topk(
                scores,
                heads,
                nb,
                positions,
                block_size,
                topk,
                init_blocks,
                local_blocks,
                selection,
                kv_heads,
                out,
            ),
            Op::Attention {
                q,
                heads,
                kv_heads,
                head_dim,
                k,
                v,
                step,
                page_size,
                blocks,
                out,
            } => self.attention(
                q, heads, kv_heads, head_dim, k, v, step, page_size, blocks, out,
            ),
            Op::Router {
                x,
                rows,
                router,
                bias,
                top_k,
                scaling,
                ids,
                weights,
            } => self.router(x, rows, router, bias, top_k, scaling, ids, weights),
            Op::SwiGlu {
                gate,
                up,
                alpha,
                limit,
                out,
            } => self.swiglu(gate, up, alpha, limit, out),
            Op::Mlp {
                x,
                rows,
                w,
                alpha,
                limit,
                out,
            } => self.mlp_op(x, rows, w, alpha, limit, out),
            Op::Experts {
                x,
                rows,
                moe,
                ids,
                weights,
                top_k,
                act,
                alpha,
                limit,
                out,
            } => self.experts(x, rows, moe, ids, weights, top_k, act, alpha, limit, out),
            Op::Add { acc, x } => self.add(acc, x),
            Op::Sample {
                logits,
                vocab,
                params,
                positions,
                out,
            } => self.sample(logits, vocab, params, positions, out),
            Op::QuantizeMx {
                x,
                rows,
                cols,
                elem,
                rule,
                out,
            } => {
                let q = self
                    .gpu
                    .mx_quantize(x, rows, cols, elem, rule)
                    .op("quantize_mx")?;
                *out = Some(MxTensor::from_parts(elem, rows, cols, q.codes, q.scales)?);
                Ok(())
            }
            Op::QuantizeNvfp4 { x, rows, cols, out } => {
                let q = self
                    .gpu
                    .nvfp4_quantize(x, rows, cols)
                    .op("quantize_nvfp4")?;
                *out = Some(Nvfp4Tensor::from_parts(
                    rows, cols, q.codes, q.scales, q.global,
                )?);
                Ok(())
            }
            Op::Dequantize { w, out } => self.dequantize(w, out),
            Op::ConvertNvfp4ToMxfp4 { w, rule, out } => {
                let (rows, cols) = (w.rows(), w.cols());
                let q = self
                    .gpu
                    .nvfp4_to_mxfp4(w.codes(), w.scales(), w.global(), rows, cols, rule)
                    .op("convert_nvfp4_to_mxfp4")?;
                *out = Some(MxTensor::from_parts(
                    MxElem::Fp4E2M1,
                    rows,
                    cols,
                    q.codes,
                    q.scales,
                )?);
                Ok(())
            }
            Op::ActQuantMxfp4 { x, out } => {
                let cols = if x.len().is_multiple_of(32) { 32 } else { 0 };
                out.copy_from_slice(&self.act_quant(x, cols)?);
                Ok(())
            }
        }
    }
}

/// `GpuBackend` is shared across threads (`Box<dyn Backend + Sync>`).
const _: fn() = || {
    fn is_sync<T: Sync + Send>() {}
    is_sync::<GpuBackend>();
};

#[cfg(test)]
mod tests {
    //! The open order as pure logic, and a `GpuBackend` on the recording
    //! HIP stub (`runtime::hip::stub`): no GPU, no ROCm.

    use std::sync::Arc;

    use m3_core::backend::{
        Backend, BackendError, KvBudget, LoadSpec, ModelSource, Op, Path, ReadBack, StepBatch,
        StepInput, StepSeq,
    };
    use m3_core::config::ModelConfig;
    use m3_core::kv::CacheDtype;
    use m3_core::sample::SampleParams;
    use m3_cpu_ref::synthetic::{self, Formats};

    use super::{pick, GpuBackend, Picked, Runtime};
    use crate::error::GpuError;
    use crate::runtime::hip::stub;

    type P = crate::Result<Picked<&'static str, &'static str>>;

    fn no_driver(who: &str) -> crate::Result<&'static str> {
        Err(GpuError::NoDriver(format!("{who} library absent")))
    }

    #[test]
    fn cuda_first_and_hip_never_opened_beside_it() {
        let p: P = pick(None, || Ok("cuda"), || panic!("HIP opened on a CUDA box"));
        assert_eq!(p.ok(), Some(Picked::Cuda("cuda")));
    }

    #[test]
    fn hip_where_cuda_finds_no_device() {
        let p: P = pick(None, || no_driver("libcuda"), || Ok("hip"));
        assert_eq!(p.ok(), Some(Picked::Hip("hip")));
        let p: P = pick(
            None,
            || Err(GpuError::NoDevice("0 devices".into())),
            || Ok("hip"),
        );
        assert_eq!(p.ok(), Some(Picked::Hip("hip")));
    }

    #[test]
    fn neither_names_both_reasons() {
        let p: P = pick(None, || no_driver("libcuda"), || no_driver("libamdhip64"));
        let e = p.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            e,
            "CUDA: no GPU driver: libcuda library absent; \
             HIP: no GPU driver: libamdhip64 library absent"
        );
    }

    /// A CUDA device that opened but cannot be used is reported as itself,
    /// not hidden behind HIP.
    #[test]
    fn a_broken_cuda_setup_is_not_masked_by_hip() {
        let p: P = pick(
            None,
            || {
                Err(GpuError::UnsupportedArch {
                    arch: "sm_99".into(),
                    why: "old NVRTC".into(),
                })
            },
            || panic!("HIP tried after a CUDA device was found"),
        );
        let e = p.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.starts_with("device architecture sm_99"), "{e}");
    }

    #[test]
    fn m3_gpu_runtime_forces_one_vendor() {
        let p: P = pick(Some("hip"), || panic!("CUDA tried"), || Ok("hip"));
        assert_eq!(p.ok(), Some(Picked::Hip("hip")));
        let p: P = pick(Some(" CUDA "), || Ok("cuda"), || panic!("HIP tried"));
        assert_eq!(p.ok(), Some(Picked::Cuda("cuda")));
        let p: P = pick(Some("cuda"), || no_driver("libcuda"), || Ok("hip"));
        assert!(
            matches!(p, Err(GpuError::NoDriver(_))),
            "forced: no fallback"
        );
        let p: P = pick(Some(""), || no_driver("libcuda"), || Ok("hip"));
        assert_eq!(p.ok(), Some(Picked::Hip("hip")), "empty: the default order");
        let p: P = pick(Some("rocm"), || Ok("cuda"), || Ok("hip"));
        let e = p.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("M3_GPU_RUNTIME") && e.contains("rocm"), "{e}");
    }

    /// On a HIP device the op harness refuses every op by name, and the
    /// engine loads a model and runs a decode step (on the stub).
    #[test]
    fn a_hip_backend_refuses_ops_and_runs_the_engine() {
        let be = GpuBackend::new_hip(stub::gpu());
        assert_eq!(be.runtime(), Runtime::Hip);
        assert!(be.cuda().is_none());
        assert_eq!(be.describe(), "HIP, gfx950, never run on AMD hardware");
        assert_eq!(be.weight_bytes(), 0);

        let mut acc = vec![0.0f32; 4];
        let e = be.run_op(Op::Add {
            acc: &mut acc,
            x: &[1.0; 4],
        });
        match e {
            Err(BackendError::Unsupported { op, what, .. }) => {
                assert_eq!(op, "add");
                assert!(
                    what.contains("CUDA only") && what.contains("gfx950"),
                    "{what}"
                );
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }

        let c = ModelConfig::preset("tiny").expect("tiny preset");
        let w = synthetic::model(&c, Formats::default(), 7).expect("synthetic tiny");
        let spec = LoadSpec {
            cache_dtype: CacheDtype::Bf16,
            block_size: 16,
            kv: KvBudget::Blocks(4),
            max_rows: 4,
            max_seqs: 1,
            max_context: 32,
            act: m3_core::backend::ActMode::Bf16,
            selection: None,
        };
        let mut runner = be
            .load(ModelSource::Weights(Arc::new(w)), &spec, &mut |_| {})
            .unwrap_or_else(|e| panic!("GpuRunner on the HIP stub: {e}"));
        let batch = StepBatch {
            tokens: vec![3],
            positions: vec![0],
            slot_mapping: vec![0],
            row_seq: vec![0],
            seqs: vec![StepSeq {
                request_id: 1,
                block_table: vec![0],
                context_len: 1,
            }],
            logits_rows: vec![0],
            decode_only: true,
        };
        let out = runner
            .step(&StepInput {
                batch: &batch,
                path: Path::Standard,
                sampling: &[SampleParams::default()],
                read: &ReadBack::default(),
                teacher: None,
            })
            .unwrap_or_else(|e| panic!("a step on the HIP stub: {e}"));
        assert_eq!(out.tokens.len(), 1);
        let calls = stub::take_calls();
        assert!(
            calls.iter().any(|c| matches!(c, stub::Call::Launch(_))),
            "the step launched kernels through the HIP table"
        );
        assert!(
            !calls.iter().any(|c| matches!(c, stub::Call::Bad(_))),
            "the stub refused a call"
        );
        drop(runner);

        // an NVFP4 cache is refused at load, by name, not trapped at the
        // first attention launch (its HIP entry points trap)
        let w = synthetic::model(&c, Formats::default(), 7).expect("synthetic tiny");
        let nv = LoadSpec {
            cache_dtype: CacheDtype::Nvfp4,
            ..spec
        };
        let loaded = be
            .load(ModelSource::Weights(Arc::new(w)), &nv, &mut |_| {})
            .map(|_| ());
        match loaded {
            Err(e) => assert!(
                e.to_string().contains("NVFP4 KV cache runs on CUDA only"),
                "{e}"
            ),
            Ok(()) => panic!("the HIP route loaded an NVFP4 cache"),
        }
    }
}
