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
        build_nccl_shim(&lib);
    }
}

/// The NCCL shim needs libtorch's c10d headers, NCCL's and CUDA's (all in the PyTorch wheel's
/// site-packages). Without them the build goes on without it and multi-GPU replicas say so.
fn build_nccl_shim(lib: &std::path::Path) {
    println!("cargo:rerun-if-changed=src/engine/cxx/nccl_shim.cpp");
    let torch = lib.parent().expect("lib has a parent");
    let site = torch.parent().expect("torch has a parent");
    let includes = [
        torch.join("include"),
        torch.join("include/torch/csrc/api/include"),
        site.join("nvidia/nccl/include"),
        site.join("nvidia/cu13/include"),
    ];
    // CUDA's crt/ and CCCL's nv/ headers come in their own wheels (nvidia-cuda-crt, -cccl).
    let cuda = site.join("nvidia/cu13/include");
    let needed = [cuda.join("crt/host_config.h"), cuda.join("nv/target")];
    if !includes.iter().chain(needed.iter()).all(|p| p.exists()) {
        println!("cargo:warning=NCCL or CUDA headers not found: building without the NCCL shim");
        return;
    }
    let mut b = cc::Build::new();
    b.cpp(true)
        .file("src/engine/cxx/nccl_shim.cpp")
        .flag("-std=c++17")
        .flag("-w")
        .define("USE_C10D_NCCL", None)
        .define("_GLIBCXX_USE_CXX11_ABI", "1");
    for i in &includes {
        b.include(i);
    }
    b.compile("dflash_nccl_shim");
    println!("cargo:rustc-cfg=nccl_shim");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
}
