// Device time by kernel over a window of a run (`bench engine --kernels`), from libtorch's own
// profiler: Kineto reading CUPTI's activity records. Every kernel, copy and set that ran on a CUDA
// device between start and stop comes back with its name and device time; kernels replayed inside
// CUDA graphs are recorded one by one. src/engine/gpu/kernel_time.rs sorts them into classes.
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdint>
#include <set>

#include "shim_common.h"

namespace {
namespace profiler = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

impl::ProfilerConfig device_only() { return impl::ProfilerConfig(impl::ProfilerState::KINETO); }

const std::set<impl::ActivityType>& cuda_activities() {
  static const std::set<impl::ActivityType> cuda{impl::ActivityType::CUDA};
  return cuda;
}
}  // namespace

extern "C" {

int dflash_kernels_start() {
  return dflash::guarded([] {
    profiler::prepareProfiler(device_only(), cuda_activities());
    profiler::enableProfiler(device_only(), cuda_activities());
  });
}

// Stops the window; `each(ctx, name, device_ns)` for every event that ran on a CUDA device.
int dflash_kernels_stop(void (*each)(void*, const char*, uint64_t), void* ctx) {
  return dflash::guarded([&] {
    auto result = profiler::disableProfiler();
    if (!result) return;
    for (const auto& e : result->events()) {
      if (e.deviceType() != c10::DeviceType::CUDA) continue;
      each(ctx, e.name().c_str(), e.durationNs());
    }
  });
}

}  // extern "C"
