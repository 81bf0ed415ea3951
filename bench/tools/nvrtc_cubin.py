#!/usr/bin/env python3
"""Compile the mono translation unit (or any kernel source) to a cubin with
a chosen NVRTC, as the engine does at run time, for static SASS checks.

Usage: NVRTC_LIB=/path/libnvrtc.so.13 [NVRTC_OPTS="-lineinfo ..."] nvrtc_cubin.py OUT.cubin "DEFINES" FILE...
  FILES are concatenated after gpu-mi350/kernels/compat.h and the defines
  (e.g. "#define S_MMA_WARPS 4\\n#define S_MMA_MAXBT 2" for the small-step
  variant; the mono TU is mono_prelude.h standard_decode.cu
  standard_attention.cu mono.cu, and the engine puts the mono build's own
  defaults first: add "#define S_H_PIPE_TILE 30\\n#define S_H_PIPE_ONE 4\\n#define S_F32W_ROWS 1"
  (gpu-mi350/src/standard/mono.rs MONO_DEFAULTS) to see its SASS). sm_90.
"""
import ctypes
import os
import sys

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../gpu-mi350/kernels")


def program_log(lib, prog):
    """The program's NVRTC log (errors, warnings, ptxas -v), "" if none."""
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(max(n.value, 1))
    lib.nvrtcGetProgramLog(prog, log)
    return log.value.decode()


def main():
    out, defines, files = sys.argv[1], sys.argv[2].replace("\\n", "\n"), sys.argv[3:]
    lib = ctypes.CDLL(os.environ["NVRTC_LIB"])
    src = open(os.path.join(KERNELS, "compat.h")).read() + "\n" + defines + "\n"
    src += "".join(open(os.path.join(KERNELS, f)).read() + "\n" for f in files)
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"x.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=sm_90", b"--std=c++17"] + [o.encode() for o in os.environ.get("NVRTC_OPTS", "").split()]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    if rc != 0:
        sys.exit(program_log(lib, prog)[-4000:])
    # ptxas -v's report (NVRTC_OPTS="--ptxas-options=-v"), warnings
    sys.stderr.write(program_log(lib, prog))
    n = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    b = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, b)
    open(out, "wb").write(b.raw)


if __name__ == "__main__":
    main()
