// A small C shim over libtorch's CUDA stream pool and c10::Event, which tch does not expose:
// one stream per worker thread, CUDA events at phase marks (device time per phase, read back
// without blocking), and the cross-stream hand-off of hidden states (an event the consumer's
// stream waits on, and record_stream so the producer's allocator does not reuse the memory early).
// Every function catches c10 errors and returns a status; the message is kept per thread.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/_fused_adamw.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "shim_common.h"

namespace {
thread_local std::string last_error;

using dflash::guarded;
using dflash::OnDevice;

c10::cuda::CUDAStream& stream_of(void* s) { return *static_cast<c10::cuda::CUDAStream*>(s); }
c10::Event& event_of(void* e) { return *static_cast<c10::Event*>(e); }
}  // namespace

extern "C" {

const char* dflash_cuda_last_error() { return last_error.c_str(); }

// For the shim's other translation units (target_kernels.cpp): the calling thread's error message.
void dflash_set_last_error(const char* msg) { last_error = msg; }

// A stream from libtorch's pool on `device` (a copy of the handle, freed with _stream_free).
int dflash_stream_from_pool(int device, void** out) {
  return guarded([&] {
    auto s = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
    *out = new c10::cuda::CUDAStream(s);
  });
}

// The calling thread's current stream on `device`.
int dflash_stream_current(int device, void** out) {
  return guarded([&] {
    auto s = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
    *out = new c10::cuda::CUDAStream(s);
  });
}

void dflash_stream_free(void* s) { delete static_cast<c10::cuda::CUDAStream*>(s); }

// Makes `s` the calling thread's current stream on its device: libtorch ops of this thread
// then run on it.
int dflash_stream_set_current(void* s) {
  return guarded([&] { c10::cuda::setCurrentCUDAStream(stream_of(s)); });
}

int dflash_stream_synchronize(void* s) {
  return guarded([&] { stream_of(s).synchronize(); });
}

// 1 when all work queued on `s` has finished, 0 when some is pending.
int dflash_stream_query(void* s, int* done) {
  return guarded([&] { *done = stream_of(s).query() ? 1 : 0; });
}

// A CUDA event; `timing` 1 enables elapsed-time queries. The CUDA event itself is created on
// the first record.
int dflash_event_new(int timing, void** out) {
  return guarded([&] {
    auto flag = timing ? c10::EventFlag::BACKEND_DEFAULT : c10::EventFlag::PYTORCH_DEFAULT;
    *out = new c10::Event(c10::DeviceType::CUDA, flag);
  });
}

void dflash_event_free(void* e) { delete static_cast<c10::Event*>(e); }

int dflash_event_record(void* e, void* s) {
  return guarded([&] { event_of(e).record(stream_of(s).unwrap()); });
}

// 1 when the work before the event's last record has finished.
int dflash_event_query(void* e, int* done) {
  return guarded([&] { *done = event_of(e).query() ? 1 : 0; });
}

// Milliseconds from `a` to `b` on the device (both recorded, both complete).
int dflash_event_elapsed_ms(void* a, void* b, double* ms) {
  return guarded([&] { *ms = event_of(a).elapsedTime(event_of(b)); });
}

// Makes stream `s` wait (on the device, not the host) for the work before event `e`.
int dflash_stream_wait_event(void* s, void* e) {
  return guarded([&] { event_of(e).block(stream_of(s).unwrap()); });
}

// Tells the caching allocator that `tensor` is used on stream `s`, so its memory is not
// handed out again before the work queued there has finished.
int dflash_tensor_record_stream(void* tensor, void* s) {
  return guarded([&] { static_cast<at::Tensor*>(tensor)->record_stream(stream_of(s).unwrap()); });
}

// A pinned host copy of `tensor` (libtorch's caching host allocator). Through the shim because
// tch passes a device to `pin_memory`, which libtorch 2.11 warns about as deprecated.
int dflash_pin_memory(void* tensor, void** out) {
  return guarded([&] { *out = new at::Tensor(static_cast<at::Tensor*>(tensor)->pin_memory()); });
}

// Makes `grad` (a view into a flat gradient buffer, shaped like `param`) the `.grad` of `param`:
// backward then accumulates into it in place.
int dflash_set_grad(void* param, void* grad) {
  return guarded([&] {
    auto& p = *static_cast<at::Tensor*>(param);
    const auto& g = *static_cast<at::Tensor*>(grad);
    TORCH_CHECK(p.sizes() == g.sizes(), "gradient view shaped unlike its parameter");
    p.mutable_grad() = g;
  });
}

// The PCI bus id ("0000:18:00.0") and UUID bytes of CUDA device `device` as this process sees
// it (after CUDA_VISIBLE_DEVICES), to match NVML's devices.
int dflash_device_pci(int device, char* bus_id, size_t len, unsigned char* uuid16) {
  return guarded([&] {
    auto* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
    std::snprintf(bus_id, len, "%08x:%02x:%02x.0", p->pciDomainID, p->pciBusID, p->pciDeviceID);
    std::memcpy(uuid16, p->uuid.bytes, 16);
  });
}

// Causal flash attention over packed variable-length sequences (no mask tensor: the kernel skips
// what causality hides). q [total, hq, d], k/v [total, hkv, d] (GQA when hkv < hq), cu_seqlens
// int32 [n + 1] on the device, `window` < 0 for none, else keys with i - j < window only.
// The output [total, hq, d] is a new tensor handed to the caller (tch takes ownership).
int dflash_flash_varlen(void* q, void* k, void* v, void* cu_seqlens, int64_t max_len,
                        int64_t window, void** out) {
  return guarded([&] {
    auto& cu = *static_cast<at::Tensor*>(cu_seqlens);
    std::optional<int64_t> left;
    std::optional<int64_t> right;
    if (window > 0) {
      left = window - 1;
      right = 0;
    }
    auto res = at::_flash_attention_forward(
        *static_cast<at::Tensor*>(q), *static_cast<at::Tensor*>(k), *static_cast<at::Tensor*>(v),
        cu, cu, max_len, max_len, 0.0, true, false, std::nullopt, left, right);
    *out = new at::Tensor(std::get<0>(res));
  });
}

// The caching allocator's peak of allocated bytes on `device` since the last reset, and reset.
int dflash_memory_peak(int device, int reset, uint64_t* peak) {
  return guarded([&] {
    auto idx = static_cast<c10::DeviceIndex>(device);
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(idx);
    *peak = static_cast<uint64_t>(stats.allocated_bytes[0].peak);
    if (reset) c10::cuda::CUDACachingAllocator::resetPeakStats(idx);
  });
}

// The caching allocator's figures on `device` (libtorch's own statistics): reserved and
// allocated bytes and segments now, and since the start the device allocations (cudaMalloc or
// mapped), frees (cudaFree or unmapped) and allocation retries (a failed cudaMalloc that freed
// the cache and tried again). `out` holds six: in that order.
int dflash_allocator_stats(int device, int64_t* out) {
  return guarded([&] {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out[0] = stats.reserved_bytes[all].current;
    out[1] = stats.allocated_bytes[all].current;
    out[2] = stats.segment[all].current;
    out[3] = stats.num_device_alloc;
    out[4] = stats.num_device_free;
    out[5] = stats.num_alloc_retries;
  });
}

// Hands the caching allocator's unused cached blocks back to the device (`emptyCache`, what
// torch.cuda.empty_cache() does).
int dflash_empty_cache() {
  return guarded([&] { c10::cuda::CUDACachingAllocator::emptyCache(); });
}

// The device's memory in bytes.
int dflash_memory_total(int device, uint64_t* total) {
  return guarded([&] {
    auto* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
    *total = static_cast<uint64_t>(props->totalGlobalMem);
  });
}

// The device's compute capability (9.0 on an H100 or H200).
int dflash_compute_capability(int device, int* major, int* minor) {
  return guarded([&] {
    auto* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
    *major = props->major;
    *minor = props->minor;
  });
}

// CUDA graphs: the work a thread queues on its current (non-default) stream between
// capture_begin and capture_end is recorded once and replayed with one launch. Thread-local
// capture mode, so other threads keep using the device meanwhile.
int dflash_graph_new(void** out) {
  return guarded([&] { *out = new at::cuda::CUDAGraph(); });
}

void dflash_graph_free(void* g) { delete static_cast<at::cuda::CUDAGraph*>(g); }

// The capture takes the current stream of the current device: `device` is made current for the
// call (a worker's stream on another GPU than the thread's current device would not be found).
// `share`: a graph whose memory pool this one's allocations come from (null: a pool of its own).
int dflash_graph_capture_begin(void* g, int device, void* share) {
  return guarded([&] {
    OnDevice on(device);
    at::cuda::MempoolId_t pool = {0, 0};
    if (share) pool = static_cast<at::cuda::CUDAGraph*>(share)->pool();
    static_cast<at::cuda::CUDAGraph*>(g)->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
  });
}

int dflash_graph_capture_end(void* g, int device) {
  return guarded([&] {
    OnDevice on(device);
    static_cast<at::cuda::CUDAGraph*>(g)->capture_end();
  });
}

int dflash_graph_replay(void* g, int device) {
  return guarded([&] {
    OnDevice on(device);
    static_cast<at::cuda::CUDAGraph*>(g)->replay();
  });
}

// One AdamW step over one flat parameter tensor as libtorch's fused kernel: every element read
// and written once. `step` is a float tensor holding the step count (bias corrections are taken
// from it on the device); grads are divided by `grad_scale` first when it is given (the clip);
// a non-zero `found_inf` leaves parameters and moments untouched (the non-finite gate).
int dflash_fused_adamw(void* param, void* grad, void* m, void* v, void* step, double lr,
                       double beta1, double beta2, double weight_decay, double eps,
                       void* grad_scale, void* found_inf) {
  return guarded([&] {
    auto t = [](void* p) { return *static_cast<at::Tensor*>(p); };
    std::optional<at::Tensor> scale;
    std::optional<at::Tensor> inf;
    if (grad_scale) scale = t(grad_scale);
    if (found_inf) inf = t(found_inf);
    at::_fused_adamw_({t(param)}, {t(grad)}, {t(m)}, {t(v)}, {}, {t(step)}, lr, beta1, beta2,
                      weight_decay, eps, false, false, scale, inf);
  });
}
}
