"""Compiles the CUDA C that src/engine/cxx/*.cpp hand to NVRTC at run time, here, without a GPU:
a kernel that does not compile is found before a device call is spent on it. Each raw string
`const char* kXxxSource = R"(...)";` (or `constexpr char kXxxSource[] = R"(...)";`) is compiled
for the architecture given, with the `bf16.h` header of runtime_kernels.h, and NVRTC's log
printed; `--ptxas` adds ptxas's report of each kernel's registers, spills and shared memory
(compiled for a real architecture, as the engine does).

    python3 tests/tools/nvrtc_check.py LIBNVRTC [--arch sm_90] [--ptxas] [FILE.cpp ...]

LIBNVRTC: a libnvrtc.so (e.g. from the nvidia-cuda-nvrtc wheel: nvidia/cu13/lib/libnvrtc.so.13).
Exit 1 when any program fails to compile.
"""

import argparse
import ctypes
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CXX = ROOT / "src" / "engine" / "cxx"
RAW = re.compile(
    r'(?:const char\*\s+|constexpr char\s+)(k\w*Source|k\w*Header)(?:\[\])?\s*=\s*R"\((.*?)\)";',
    re.S,
)


def sources(path):
    return {name: text for name, text in RAW.findall(path.read_text())}


def compile_one(nvrtc, name, source, header, arch, ptxas):
    prog = ctypes.c_void_p()
    names = (ctypes.c_char_p * 1)(b"bf16.h")
    texts = (ctypes.c_char_p * 1)(header.encode())
    rc = nvrtc.nvrtcCreateProgram(
        ctypes.byref(prog), source.encode(), name.encode(), 1, texts, names
    )
    if rc != 0:
        return False, f"nvrtcCreateProgram: {rc}"
    flags = [f"--gpu-architecture={arch}"] + (["--ptxas-options=-v"] if ptxas else [])
    opts = (ctypes.c_char_p * len(flags))(*[f.encode() for f in flags])
    rc = nvrtc.nvrtcCompileProgram(prog, len(flags), opts)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc == 0, log.value.decode(errors="replace").strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libnvrtc")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--ptxas", action="store_true", help="report registers and spills")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    nvrtc = ctypes.CDLL(args.libnvrtc)
    header = sources(CXX / "runtime_kernels.h")["kBf16Header"]
    files = [pathlib.Path(f) for f in args.files] or sorted(CXX.glob("*.cpp"))
    failed = 0
    for path in files:
        for name, text in sources(path).items():
            if not name.endswith("Source"):
                continue
            ok, log = compile_one(
                nvrtc, f"{path.name}:{name}", text, header, args.arch, args.ptxas
            )
            print(f"{path.name} {name}: {'compiled' if ok else 'FAILED'} for {args.arch}")
            if log:
                print("  " + log.replace("\n", "\n  "))
            failed += not ok
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
