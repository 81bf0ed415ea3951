//! Raw device allocations (weights, caches, step buffers).
//!
//! The standard path hands kernels plain device addresses (`u64`), never
//! cudarc slices: slices record events on every launch, which a CUDA graph
//! would capture and which would make a replayed step depend on host-side
//! bookkeeping. A `DevBuf` is one allocation of the runtime line's
//! [`Device`] (`cuMemAlloc` / `hipMalloc`) freed on drop.

use crate::error::{GpuError, Result};
use crate::runtime::api::{Device, Stream};

/// One device allocation of `bytes` bytes.
pub struct DevBuf {
    ptr: u64,
    bytes: usize,
    dev: Device,
}

impl DevBuf {
    /// Allocate `bytes` (at least 1) uninitialised bytes.
    pub fn new(dev: &Device, bytes: usize) -> Result<Self> {
        dev.bind()?;
        // freed exactly once, in Drop
        let ptr = dev.alloc(bytes.max(1))?;
        Ok(DevBuf {
            ptr,
            bytes,
            dev: dev.clone(),
        })
    }

    /// Allocate and zero.
    pub fn zeroed(dev: &Device, bytes: usize) -> Result<Self> {
        let b = Self::new(dev, bytes)?;
        // SAFETY: the range lies inside the allocation just made.
        unsafe { dev.zero(b.ptr, bytes.max(1)) }?;
        Ok(b)
    }

    /// Allocate and copy `data` in (synchronous).
    pub fn from_slice<T: bytemuck::Pod>(dev: &Device, data: &[T]) -> Result<Self> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let b = Self::new(dev, bytes.len())?;
        if !bytes.is_empty() {
            // SAFETY: `bytes.len()` bytes fit the allocation.
            unsafe { dev.htod(b.ptr, bytes) }?;
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
        self.dev.bind()?;
        // SAFETY: bounds checked above; the copy completes before return.
        unsafe { self.dev.htod(self.ptr + off as u64, bytes) }
    }

    /// Copy `data` to byte offset `off`, ordered on `stream`.
    pub fn write_async<T: bytemuck::Pod>(
        &self,
        stream: &Stream,
        off: usize,
        data: &[T],
    ) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        if !self.in_bounds("device write", off, bytes.len())? {
            return Ok(());
        }
        // SAFETY: bounds checked above; the source is consumed before return
        // (`Stream::htod`).
        unsafe { stream.htod(self.ptr + off as u64, bytes) }
    }

    /// Copy `out.len()` elements from byte offset `off` (waits for `stream`).
    pub fn read<T: bytemuck::Pod>(&self, stream: &Stream, off: usize, out: &mut [T]) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let nonempty = self.in_bounds("device read", off, bytes.len())?;
        stream.sync()?;
        if !nonempty {
            return Ok(());
        }
        // SAFETY: bounds checked above; the stream is idle.
        unsafe { self.dev.dtoh(bytes, self.ptr + off as u64) }
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: allocated by `Device::alloc` in `new`, freed once.
            unsafe { self.dev.free(self.ptr) };
        }
    }
}
