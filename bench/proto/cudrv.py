"""The prototypes' line to the GPU: NVRTC and the CUDA driver through ctypes.

No torch here (a prototype brings its own memory): `compile_src` builds a
cubin for sm_90a and loads it, `launch` takes raw device addresses (ints),
floats, ("u64", v) pairs, or anything with `data_ptr()`, and can ask for
programmatic dependent launch (the engine's PDL edge). `--compile-only` runs
of a prototype need NVRTC alone (no driver, no GPU).
"""
import ctypes, glob, os, sys


def lib(names):
    for n in names:
        for v in ("", ".1", ".13", ".12"):
            try:
                return ctypes.CDLL(n + v)
            except OSError:
                pass
    pats = []
    for n in names:
        pats += [f"/usr/local/cuda*/lib64/{n}*", f"/usr/local/cuda*/targets/*/lib/{n}*",
                 f"/usr/lib/x86_64-linux-gnu/{n}*"]
        pats += [os.path.join(p, "**", n + "*") for p in sys.path if "site-packages" in p]
    for p in pats:
        for f in sorted(glob.glob(p, recursive=True)):
            try:
                return ctypes.CDLL(f)
            except OSError:
                pass
    raise SystemExit(f"no {names}")


nvrtc = lib(["libnvrtc.so"])
_cuda = None


def cuda():
    """The driver, opened on first use (a compile-only run never needs it)."""
    global _cuda
    if _cuda is None:
        _cuda = lib(["libcuda.so"])
    return _cuda


def check(r, what):
    if r != 0:
        raise SystemExit(f"{what}: error {r}")


def cubin(src, name=b"p.cu", arch=b"sm_90a"):
    """NVRTC: `src` to a cubin (bytes); the program log on failure."""
    prog = ctypes.c_void_p()
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name, 0, None, None), "create")
    opts = [b"--gpu-architecture=" + arch, b"--std=c++17"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    r = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    if r != 0:
        n = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        raise SystemExit(buf.value.decode())
    n = ctypes.c_size_t()
    check(nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(n)), "size")
    out = ctypes.create_string_buffer(n.value)
    check(nvrtc.nvrtcGetCUBIN(prog, out), "cubin")
    return out.raw


def compile_src(src):
    """`src` compiled and loaded as a module (needs the driver and a context)."""
    mod = ctypes.c_void_p()
    check(cuda().cuModuleLoadData(ctypes.byref(mod), cubin(src)), "load")
    return mod


def func(mod, name):
    """(function, registers a thread)."""
    f = ctypes.c_void_p()
    check(cuda().cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), name)
    regs = ctypes.c_int()
    cuda().cuFuncGetAttribute(ctypes.byref(regs), 4, f)  # CU_FUNC_ATTRIBUTE_NUM_REGS
    return f, regs.value


def set_smem(f, nbytes):
    """Allow `nbytes` of dynamic shared memory (past 48 KB needs the opt-in)."""
    check(cuda().cuFuncSetAttribute(f, 8, nbytes), "max dynamic smem")  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


def occupancy(f, block, smem):
    n = ctypes.c_int()
    check(cuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), f, block, ctypes.c_size_t(smem)), "occupancy")
    return n.value


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("val", ctypes.c_ubyte * 64)]


class _Cfg(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint),
                ("bx", ctypes.c_uint), ("by", ctypes.c_uint), ("bz", ctypes.c_uint),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("nattrs", ctypes.c_uint)]


def launch(f, grid, block, args, stream, smem=0, pdl=False):
    """One launch on `stream` (a raw CUstream). `pdl`: programmatic stream
    serialization (the kernel may start while the previous one drains; it
    must `griddepcontrol.wait` before reading what that one wrote)."""
    holders = []
    for a in args:
        if hasattr(a, "data_ptr"):
            holders.append(ctypes.c_uint64(a.data_ptr()))
        elif isinstance(a, float):
            holders.append(ctypes.c_float(a))
        elif isinstance(a, tuple):  # ("u64", v)
            holders.append(ctypes.c_uint64(a[1]))
        else:
            holders.append(ctypes.c_int(a))
    ptrs = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    if not pdl:
        check(cuda().cuLaunchKernel(f, grid, 1, 1, block, 1, 1, smem, ctypes.c_void_p(stream), ptrs, None), "launch")
        return
    attr = _Attr()
    attr.id = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.val[0] = 1
    cfg = _Cfg(grid, 1, 1, block, 1, 1, smem, ctypes.c_void_p(stream), ctypes.pointer(attr), 1)
    check(cuda().cuLaunchKernelEx(ctypes.byref(cfg), f, ptrs, None), "launch (pdl)")
