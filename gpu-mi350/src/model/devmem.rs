//! Raw device allocations (weights, caches, step buffers).
//!
//! The standard path hands kernels plain device addresses (`u64`), never
//! cudarc slices: slices record events on every launch, which a CUDA graph
//! would capture and which would make a replayed step depend on host-side
//! bookkeeping. A `DevBuf` is one `cuMemAlloc` freed on drop.

use std::sync::Arc;

use cudarc::driver::{result, CudaContext, CudaStream};

use crate::error::{GpuError, Result};

/// One device allocation of `bytes` bytes.
pub struct DevBuf {
    ptr: u64,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DevBuf {
    /// Allocate `bytes` (at least 1) uninitialised bytes.
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| GpuError::driver("cuCtxSetCurrent", e))?;
        // SAFETY: a plain allocation; the pointer is freed exactly once in Drop.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }
            .map_err(|e| GpuError::driver("cuMemAlloc", format!("{bytes} bytes: {e}")))?;
        Ok(DevBuf {
            ptr,
            bytes,
            ctx: ctx.clone(),
        })
    }

    /// Allocate and zero.
    pub fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        let b = Self::new(ctx, bytes)?;
        // SAFETY: the range lies inside the allocation just made.
        unsafe { result::memset_d8_sync(b.ptr, 0, bytes.max(1)) }
            .map_err(|e| GpuError::driver("cuMemsetD8", e))?;
        Ok(b)
    }

    /// Allocate and copy `data` in (synchronous).
    pub fn from_slice<T: bytemuck::Pod>(ctx: &Arc<CudaContext>, data: &[T]) -> Result<Self> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let b = Self::new(ctx, bytes.len())?;
        if !bytes.is_empty() {
            // SAFETY: `bytes.len()` bytes fit the allocation.
            unsafe { result::memcpy_htod_sync(b.ptr, bytes) }
                .map_err(|e| GpuError::driver("cuMemcpyHtoD", e))?;
        }
        Ok(b)
    }

    /// Device address (pass to kernels as `u64`).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Device address of byte `off`.
    pub fn at(&self, off: usize) -> u64 {
        self.ptr + off as u64
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether `[off, off + len)` is a non-empty range inside the buffer;
    /// an error (naming `what`) when it runs past the end.
    fn in_bounds(&self, what: &'static str, off: usize, len: usize) -> Result<bool> {
        if off.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(GpuError::input(
                what,
                format!("{len} bytes at {off} past a buffer of {}", self.bytes),
            ));
        }
        Ok(len > 0)
    }

    /// Copy `bytes` to byte offset `off`, synchronously (weight loading:
    /// the source may be a mapped file page that is released right after).
    pub fn write_sync(&self, off: usize, bytes: &[u8]) -> Result<()> {
        if !self.in_bounds("device write", off, bytes.len())? {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| GpuError::driver("cuCtxSetCurrent", e))?;
        // SAFETY: bounds checked above; the copy completes before return.
        unsafe { result::memcpy_htod_sync(self.ptr + off as u64, bytes) }
            .map_err(|e| GpuError::driver("cuMemcpyHtoD", e))
    }

    /// Copy `data` to byte offset `off`, ordered on `stream`.
    pub fn write_async<T: bytemuck::Pod>(
        &self,
        stream: &CudaStream,
        off: usize,
        data: &[T],
    ) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        if !self.in_bounds("device write", off, bytes.len())? {
            return Ok(());
        }
        // SAFETY: bounds checked above; pageable source is staged before return.
        unsafe { result::memcpy_htod_async(self.ptr + off as u64, bytes, stream.cu_stream()) }
            .map_err(|e| GpuError::driver("cuMemcpyHtoDAsync", e))
    }

    /// Copy `out.len()` elements from byte offset `off` (waits for `stream`).
    pub fn read<T: bytemuck::Pod>(
        &self,
        stream: &CudaStream,
        off: usize,
        out: &mut [T],
    ) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let nonempty = self.in_bounds("device read", off, bytes.len())?;
        stream
            .synchronize()
            .map_err(|e| GpuError::driver("cuStreamSynchronize", e))?;
        if !nonempty {
            return Ok(());
        }
        // SAFETY: bounds checked above; the stream is idle.
        unsafe { result::memcpy_dtoh_sync(bytes, self.ptr + off as u64) }
            .map_err(|e| GpuError::driver("cuMemcpyDtoH", e))
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync in `new`, freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}
