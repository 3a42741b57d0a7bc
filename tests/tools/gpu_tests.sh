#!/bin/sh
# The GPU-only tests (marked #[ignore] with a reason, so a machine without a GPU counts them as
# skipped) for a GPU host with no Rust toolchain: builds the two test binaries that hold them and
# strips them into .gpu/tests/ (about 60 MB together), and the release binary the seeded-warning
# test drives into .gpu/dflash-top. On the GPU host, from the repository root:
#   TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
#   LD_LIBRARY_PATH=$TL .gpu/tests/lib --include-ignored && LD_LIBRARY_PATH=$TL .gpu/tests/all --ignored
set -eu
mkdir -p .gpu/tests
cargo test --no-run --message-format=json --lib --test all |
    python3 -c '
import json, subprocess, sys
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable") if m.get("reason") == "compiler-artifact" else None
    if exe and m["profile"]["test"]:
        name = "lib" if "lib" in m["target"]["kind"] else m["target"]["name"]
        subprocess.run(["strip", "-o", f".gpu/tests/{name}", exe], check=True)
        print(f".gpu/tests/{name} <- {exe}")
'
cargo build --release
strip -o .gpu/dflash-top target/release/dflash-top
echo ".gpu/dflash-top <- target/release/dflash-top"
