//! Link details that decide whether CUDA works (../shared/GPU.md): keep libtorch_cuda although
//! nothing references it by symbol, and add an rpath so the binary runs without LD_LIBRARY_PATH.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let Ok(libtorch) = std::env::var("LIBTORCH") else {
        return;
    };
    let lib = PathBuf::from(libtorch).join("lib");
    let lib = lib.canonicalize().unwrap_or(lib);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
