// Kernels of our own compiled at run time: a program of CUDA C is compiled with NVRTC for the
// device's architecture on first use and launched through the CUDA driver. Both libraries are
// opened with dlopen (they come with the PyTorch wheel and the GPU driver), so nothing here is
// linked and a machine without them still runs the ops the kernels replace.
//
// Used by target_kernels.cpp (the target's forward), optimizer_kernels.cpp (AdamW over bf16
// weights) and attention_kernels.cpp (the drafter's block attention).
#pragma once

#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "shim_common.h"

namespace dflash::rtc {

// What every program may `#include "bf16.h"`: bf16 as its bits, widened to f32 (`up`) and
// rounded to nearest even from f32 (`down`, NaN kept a NaN), as libtorch rounds.
inline const char* kBf16Header = R"(
typedef unsigned short bf16;
__device__ float up(bf16 h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ bf16 down(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16)(u >> 16);
}
)";

// A program: its name (in messages, and as the file name NVRTC reports) and its CUDA C.
struct Program {
  const char* name;
  const char* source;
};

// The driver and NVRTC entry points used here.
struct Api {
  decltype(&nvrtcCreateProgram) createProgram;
  decltype(&nvrtcCompileProgram) compileProgram;
  decltype(&nvrtcGetProgramLogSize) getProgramLogSize;
  decltype(&nvrtcGetProgramLog) getProgramLog;
  decltype(&nvrtcGetCUBINSize) getCUBINSize;
  decltype(&nvrtcGetCUBIN) getCUBIN;
  decltype(&nvrtcDestroyProgram) destroyProgram;
  decltype(&cuModuleLoadData) moduleLoadData;
  decltype(&cuModuleGetFunction) moduleGetFunction;
  decltype(&cuLaunchKernel) launchKernel;
  decltype(&cuFuncSetAttribute) funcSetAttribute;
};

// libnvrtc next to the wheel's other CUDA libraries (torch/../nvidia/cu13/lib), else wherever
// the loader finds it. Its builtins library is opened first from the same folder: NVRTC opens it
// by name, which the loader finds only on its path or once it is loaded.
inline void* open_nvrtc() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&c10::cuda::device_count), &info) && info.dli_fname) {
    std::string dir(info.dli_fname);
    dir = dir.substr(0, dir.rfind('/'));
    for (const char* rel : {"/../../nvidia/cu13/lib/", "/"}) {
      std::string at = dir + rel;
      dlopen((at + "libnvrtc-builtins.so.13.0").c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (void* h = dlopen((at + "libnvrtc.so.13").c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
    }
  }
  return dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_GLOBAL);
}

template <typename T>
void bind(void* lib, const char* name, T& out) {
  out = reinterpret_cast<T>(dlsym(lib, name));
  if (!out) throw std::runtime_error(std::string("missing ") + name);
}

inline const Api& api() {
  static std::once_flag once;
  static Api a;
  static std::string failure;
  std::call_once(once, [] {
    void* nvrtc = open_nvrtc();
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!nvrtc || !cuda) {
      failure = nvrtc ? "the CUDA driver library (libcuda.so.1) is not there"
                      : "NVRTC (libnvrtc.so.13) is not there";
      return;
    }
    try {
      bind(nvrtc, "nvrtcCreateProgram", a.createProgram);
      bind(nvrtc, "nvrtcCompileProgram", a.compileProgram);
      bind(nvrtc, "nvrtcGetProgramLogSize", a.getProgramLogSize);
      bind(nvrtc, "nvrtcGetProgramLog", a.getProgramLog);
      bind(nvrtc, "nvrtcGetCUBINSize", a.getCUBINSize);
      bind(nvrtc, "nvrtcGetCUBIN", a.getCUBIN);
      bind(nvrtc, "nvrtcDestroyProgram", a.destroyProgram);
      bind(cuda, "cuModuleLoadData", a.moduleLoadData);
      bind(cuda, "cuModuleGetFunction", a.moduleGetFunction);
      bind(cuda, "cuLaunchKernel", a.launchKernel);
      bind(cuda, "cuFuncSetAttribute", a.funcSetAttribute);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw std::runtime_error(failure);
  return a;
}

// `program` as a CUBIN for `device`'s architecture.
inline std::vector<char> compile(const Api& a, const Program& program, int device) {
  auto* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
  std::string arch = "-arch=sm_" + std::to_string(props->major * 10 + props->minor);
  nvrtcProgram prog;
  const char* headers[] = {kBf16Header};
  const char* header_names[] = {"bf16.h"};
  if (a.createProgram(&prog, program.source, program.name, 1, headers, header_names) !=
      NVRTC_SUCCESS)
    throw std::runtime_error(std::string("NVRTC could not create ") + program.name);
  const char* opts[] = {arch.c_str()};
  if (a.compileProgram(prog, 1, opts) != NVRTC_SUCCESS) {
    size_t n = 0;
    a.getProgramLogSize(prog, &n);
    std::string log(n, '\0');
    a.getProgramLog(prog, log.data());
    a.destroyProgram(&prog);
    throw std::runtime_error(std::string("NVRTC could not compile ") + program.name + ": " + log);
  }
  size_t size = 0;
  a.getCUBINSize(prog, &size);
  std::vector<char> cubin(size);
  a.getCUBIN(prog, cubin.data());
  a.destroyProgram(&prog);
  return cubin;
}

// Kernel `name` of `program`, compiled for `device`'s architecture and loaded into its primary
// context (each program once a device).
inline CUfunction kernel_for(const Program& program, int device, const char* name) {
  static std::mutex m;
  static std::map<std::pair<int, std::string>, CUmodule> modules;
  static std::map<std::tuple<int, std::string, std::string>, CUfunction> functions;
  std::lock_guard<std::mutex> lock(m);
  auto key = std::make_tuple(device, std::string(program.name), std::string(name));
  if (auto it = functions.find(key); it != functions.end()) return it->second;
  const Api& a = api();
  // Loaded with the device's primary context current.
  dflash::OnDevice on(device);
  auto module_key = std::make_pair(device, std::string(program.name));
  if (!modules.count(module_key)) {
    std::vector<char> cubin = compile(a, program, device);
    CUmodule module;
    if (a.moduleLoadData(&module, cubin.data()) != CUDA_SUCCESS)
      throw std::runtime_error(std::string("the CUDA driver could not load ") + program.name);
    modules[module_key] = module;
  }
  CUfunction fn;
  if (a.moduleGetFunction(&fn, modules[module_key], name) != CUDA_SUCCESS)
    throw std::runtime_error(std::string("no kernel ") + name);
  functions[key] = fn;
  return fn;
}

// The shape of a launch: the grid, the threads of a block, and the dynamic shared memory of a
// block in bytes.
struct Shape {
  unsigned int grid_x, grid_y, grid_z;
  unsigned int threads;
  unsigned int shared_bytes;
};

// Launches kernel `name` of `program` in `shape` on the current stream of `device`.
inline void launch_shaped(const Program& program, int device, const char* name, Shape shape,
                          void** args) {
  CUfunction fn = kernel_for(program, device, name);
  // The kernel runs in `device`'s context, whichever device the calling thread has current (a
  // worker's tensors may be on another GPU than its thread's device).
  dflash::OnDevice on(device);
  // More than 48 KiB of dynamic shared memory must be asked for (setting it again is harmless).
  if (shape.shared_bytes > 48 * 1024 &&
      api().funcSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                             static_cast<int>(shape.shared_bytes)) != CUDA_SUCCESS)
    throw std::runtime_error(std::string("the kernel ") + name + " cannot have " +
                             std::to_string(shape.shared_bytes) + " bytes of shared memory");
  auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  if (api().launchKernel(fn, shape.grid_x, shape.grid_y, shape.grid_z, shape.threads, 1, 1,
                         shape.shared_bytes, reinterpret_cast<CUstream>(stream), args,
                         nullptr) != CUDA_SUCCESS)
    throw std::runtime_error(std::string("the kernel ") + name + " did not launch");
}

// Launches kernel `name` of `program` with `threads_needed` threads (blocks of 256) on the
// current stream of `device`.
inline void launch(const Program& program, int device, const char* name,
                   long long threads_needed, void** args) {
  unsigned int threads = 256;
  auto blocks = static_cast<unsigned int>((threads_needed + threads - 1) / threads);
  launch_shaped(program, device, name, Shape{blocks, 1, 1, threads, 0}, args);
}

}  // namespace dflash::rtc
