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
    build_c10d_shim(&lib);
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
        build_nccl_shim(&lib);
    }
}

/// Include directories of the wheel's torch, NCCL and CUDA headers, when all are there (with
/// CUDA's crt/ and CCCL's nv/ headers, which come in their own wheels: nvidia-cuda-crt, -cccl).
fn wheel_includes(lib: &std::path::Path) -> Option<Vec<PathBuf>> {
    let torch = lib.parent()?;
    let site = torch.parent()?;
    let includes = vec![
        torch.join("include"),
        torch.join("include/torch/csrc/api/include"),
        site.join("nvidia/nccl/include"),
        site.join("nvidia/cu13/include"),
    ];
    let cuda = site.join("nvidia/cu13/include");
    let needed = [cuda.join("crt/host_config.h"), cuda.join("nv/target")];
    includes
        .iter()
        .chain(needed.iter())
        .all(|p| p.exists())
        .then_some(includes)
}

fn shim_build(file: &str, includes: &[PathBuf]) -> cc::Build {
    println!("cargo:rerun-if-changed={file}");
    let mut b = cc::Build::new();
    b.cpp(true)
        .file(file)
        .flag("-std=c++17")
        .flag("-w")
        .define("_GLIBCXX_USE_CXX11_ABI", "1");
    for i in includes {
        b.include(i);
    }
    b
}

/// The store and the CPU process group of multi-process jobs (src/engine/cxx/c10d_shim.cpp) need
/// only libtorch's own headers, which every wheel ships (Gloo's few names are declared in
/// gloo_decls/): built whenever they are there, CUDA or not.
fn build_c10d_shim(lib: &std::path::Path) {
    let Some(torch) = lib.parent() else { return };
    let includes = [
        torch.join("include"),
        torch.join("include/torch/csrc/api/include"),
        PathBuf::from("src/engine/cxx/gloo_decls"),
    ];
    if !includes[0]
        .join("torch/csrc/distributed/c10d/TCPStore.hpp")
        .exists()
    {
        println!(
            "cargo:warning=libtorch's c10d headers not found: building without multi-process jobs"
        );
        return;
    }
    println!("cargo:rerun-if-changed=src/engine/cxx/gloo_decls");
    shim_build("src/engine/cxx/c10d_shim.cpp", &includes)
        .define("USE_C10D_GLOO", None)
        .compile("dflash_c10d_shim");
    println!("cargo:rustc-cfg=c10d_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}

/// The shims need libtorch's c10 / c10d headers, NCCL's and CUDA's (all in the PyTorch wheel's
/// site-packages). Without them the build goes on without them: one stream per worker, `events`
/// timing and multi-GPU replicas then say they are not built in.
fn build_nccl_shim(lib: &std::path::Path) {
    let Some(includes) = wheel_includes(lib) else {
        println!("cargo:warning=NCCL or CUDA headers not found: building without the CUDA shims");
        return;
    };
    shim_build("src/engine/cxx/cuda_shim.cpp", &includes)
        .file("src/engine/cxx/target_kernels.cpp")
        .file("src/engine/cxx/optimizer_kernels.cpp")
        .file("src/engine/cxx/attention_kernels.cpp")
        .file("src/engine/cxx/loss_kernels.cpp")
        .file("src/engine/cxx/projection_ops.cpp")
        .file("src/engine/cxx/kernel_profile.cpp")
        .compile("dflash_cuda_shim");
    for file in [
        "target_kernels.cpp",
        "optimizer_kernels.cpp",
        "attention_kernels.cpp",
        "loss_kernels.cpp",
        "projection_ops.cpp",
        "kernel_profile.cpp",
        "runtime_kernels.h",
    ] {
        println!("cargo:rerun-if-changed=src/engine/cxx/{file}");
    }
    println!("cargo:rerun-if-changed=src/engine/cxx/shim_common.h");
    println!("cargo:rustc-cfg=cuda_shim");
    shim_build("src/engine/cxx/nccl_shim.cpp", &includes)
        .define("USE_C10D_NCCL", None)
        .compile("dflash_nccl_shim");
    println!("cargo:rustc-cfg=nccl_shim");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
}
