// AdamW over bf16 weights kept beside f32 masters, in one pass: each element's bf16 gradient,
// f32 master weight and moments are read once, and the master, the moments and the bf16 weight
// the next forward reads are written once. libtorch's fused AdamW takes gradients of its
// parameters' dtype, so on its own it would need the gradients widened to f32 first (a pass and a
// buffer of 4 bytes a weight) and the weights narrowed to bf16 after (another pass).
//
// The arithmetic is libtorch's fused AdamW's (its ADAMW mode: decay, then the moments, then the
// update, in f32 with the hyper-parameters rounded to f32: an H200 run of it showed (1 - beta2)
// taken in f32), so the masters follow the same trajectory as through it. Compiled at run time
// (runtime_kernels.h).
#include <ATen/core/Tensor.h>

#include "runtime_kernels.h"

namespace {

const char* kSource = R"(
#include "bf16.h"

struct Hyper {
  float lr, beta1, beta2, weight_decay, eps, bias_correction1, bias_correction2_sqrt;
};

__device__ void adamw_one(float& param, float& exp_avg, float& exp_avg_sq, float grad,
                          const Hyper& h) {
  if (h.weight_decay != 0) param -= h.lr * h.weight_decay * param;
  exp_avg = h.beta1 * exp_avg + (1 - h.beta1) * grad;
  exp_avg_sq = h.beta2 * exp_avg_sq + (1 - h.beta2) * grad * grad;
  float step_size = h.lr / h.bias_correction1;
  float denom = (sqrtf(exp_avg_sq) / h.bias_correction2_sqrt) + h.eps;
  param -= step_size * exp_avg / denom;
}

// Four elements a thread: float4 and 8-byte loads where all four are there, one at a time at
// the end. A non-zero `found_inf` leaves everything as it was; `grad_scale` divides the
// gradients (the clip).
extern "C" __global__ void adamw_bf16(float* master, const bf16* grad, float* m, float* v,
                                      bf16* work, long long n, Hyper h, const float* grad_scale,
                                      const float* found_inf) {
  if (found_inf && *found_inf != 0.f) return;
  long long at = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * 4;
  if (at >= n) return;
  float scale = grad_scale ? *grad_scale : 1.f;
  if (at + 4 <= n) {
    float4 p = *reinterpret_cast<float4*>(master + at);
    float4 a = *reinterpret_cast<float4*>(m + at);
    float4 b = *reinterpret_cast<float4*>(v + at);
    uint2 gv = *reinterpret_cast<const uint2*>(grad + at);
    const bf16* g = reinterpret_cast<const bf16*>(&gv);
    float* ps = &p.x;
    float* as = &a.x;
    float* bs = &b.x;
    uint2 wv;
    bf16* w = reinterpret_cast<bf16*>(&wv);
    for (int i = 0; i < 4; ++i) {
      float gi = up(g[i]);
      if (grad_scale) gi /= scale;
      adamw_one(ps[i], as[i], bs[i], gi, h);
      w[i] = down(ps[i]);
    }
    *reinterpret_cast<float4*>(master + at) = p;
    *reinterpret_cast<float4*>(m + at) = a;
    *reinterpret_cast<float4*>(v + at) = b;
    *reinterpret_cast<uint2*>(work + at) = wv;
    return;
  }
  for (long long i = at; i < n; ++i) {
    float gi = up(grad[i]);
    if (grad_scale) gi /= scale;
    adamw_one(master[i], m[i], v[i], gi, h);
    work[i] = down(master[i]);
  }
}
)";

const dflash::rtc::Program kProgram{"optimizer_kernels.cu", kSource};

// Matches the kernel's `Hyper` (passed by value).
struct Hyper {
  float lr, beta1, beta2, weight_decay, eps, bias_correction1, bias_correction2_sqrt;
};

const at::Tensor& tensor(void* p) { return *static_cast<at::Tensor*>(p); }

}  // namespace

extern "C" {

// One AdamW step: `master`, `m`, `v` f32 and `grad`, `work` bf16, contiguous, of one length, on
// one GPU (16-byte aligned); `work` receives the updated masters in bf16. `grad_scale` and
// `found_inf` (f32 scalars on that GPU, or null) as libtorch's fused AdamW takes them.
// `hyper`: lr, beta1, beta2, weight decay, eps, 1 - beta1^step, sqrt(1 - beta2^step).
int dflash_adamw_bf16(void* master, void* grad, void* m, void* v, void* work, const double* hyper,
                      void* grad_scale, void* found_inf) {
  return dflash::guarded([&] {
    const at::Tensor &pt = tensor(master), &gt = tensor(grad), &mt = tensor(m), &vt = tensor(v),
                     &wt = tensor(work);
    long long n = pt.numel();
    for (const at::Tensor* t : {&pt, &mt, &vt}) {
      TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous() &&
                      t->numel() == n && t->get_device() == pt.get_device(),
                  "adamw_bf16: master, m and v f32, contiguous, one length, one GPU");
    }
    for (const at::Tensor* t : {&gt, &wt}) {
      TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kBFloat16 && t->is_contiguous() &&
                      t->numel() == n && t->get_device() == pt.get_device(),
                  "adamw_bf16: grad and work bf16, contiguous, of the masters' length and GPU");
    }
    for (const at::Tensor* t : {&pt, &mt, &vt, &gt, &wt}) {
      TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                  "adamw_bf16: tensors 16-byte aligned");
    }
    const float* scale = nullptr;
    const float* inf = nullptr;
    for (auto [p, out] : {std::make_pair(grad_scale, &scale), std::make_pair(found_inf, &inf)}) {
      if (!p) continue;
      const at::Tensor& s = tensor(p);
      TORCH_CHECK(s.is_cuda() && s.scalar_type() == at::kFloat && s.numel() == 1 &&
                      s.get_device() == pt.get_device(),
                  "adamw_bf16: grad_scale and found_inf f32 scalars on the masters' GPU");
      *out = static_cast<const float*>(s.data_ptr());
    }
    if (n == 0) return;
    auto f = [&](int i) { return static_cast<float>(hyper[i]); };
    Hyper h{f(0), f(1), f(2), f(3), f(4), f(5), f(6)};
    void *pp = pt.data_ptr(), *mp = mt.data_ptr(), *vp = vt.data_ptr(), *wp = wt.data_ptr();
    const void* gp = gt.data_ptr();
    void* args[] = {&pp, &gp, &mp, &vp, &wp, &n, &h, &scale, &inf};
    dflash::rtc::launch(kProgram, pt.get_device(), "adamw_bf16", (n + 3) / 4, args);
  });
}
}
