// What the shim's translation units share: the error convention of their C entry points (0, or 1
// with the message for dflash_cuda_last_error) and a guard that makes a device current.
#pragma once

#include <c10/cuda/CUDAFunctions.h>

#include <exception>

extern "C" void dflash_set_last_error(const char* msg);

namespace dflash {

// Runs `f`; an exception becomes 1 and the calling thread's last error.
template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    dflash_set_last_error(e.what());
    return 1;
  }
}

// `device` current for the guard's life (the thread's device put back after). c10's CUDAGuard
// would pull CUDA runtime symbols into the shim; libc10_cuda's calls do not.
struct OnDevice {
  c10::DeviceIndex before;
  explicit OnDevice(int device) : before(c10::cuda::current_device()) {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  }
  ~OnDevice() { c10::cuda::set_device(before); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
};

}  // namespace dflash
