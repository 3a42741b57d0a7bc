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
//
// With `--optimizer-states bf16` the moments are read and written in bf16, rounded
// stochastically by a hash of each element's index and the step: the bits
// src/engine/train/optim/moments.rs draws for the same element and step.
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

// MurmurHash3's 32-bit finaliser.
__device__ unsigned int fmix32(unsigned int h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}

// Element `i`'s noise under `key` (see moments.rs).
__device__ unsigned int noise(long long i, unsigned int key) {
  unsigned int high = (unsigned int)((unsigned long long)i >> 32);
  return fmix32((unsigned int)i ^ fmix32(key ^ high * 0x9e3779b9u));
}

// f32 to bf16, up with the probability of the dropped low half (infinities and NaN to nearest).
__device__ bf16 down_stochastic(float f, unsigned int r) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return down(f);
  return (bf16)((u + (r & 0xffffu)) >> 16);
}

// The moments in f32, read and written as they are: four at `at` (16-byte loads) or one.
struct F32Moments {
  float* m;
  float* v;
  __device__ void load4(long long at, float* a, float* b) const {
    *reinterpret_cast<float4*>(a) = *reinterpret_cast<const float4*>(m + at);
    *reinterpret_cast<float4*>(b) = *reinterpret_cast<const float4*>(v + at);
  }
  __device__ void store4(long long at, const float* a, const float* b) const {
    *reinterpret_cast<float4*>(m + at) = *reinterpret_cast<const float4*>(a);
    *reinterpret_cast<float4*>(v + at) = *reinterpret_cast<const float4*>(b);
  }
  __device__ void load1(long long i, float& a, float& b) const { a = m[i]; b = v[i]; }
  __device__ void store1(long long i, float a, float b) const { m[i] = a; v[i] = b; }
};

// The moments in bf16: widened on load, rounded stochastically under `key_m` and `key_v` on
// store (8-byte loads and stores for four).
struct Bf16Moments {
  bf16* m;
  bf16* v;
  unsigned int key_m, key_v;
  __device__ void load4(long long at, float* a, float* b) const {
    uint2 av = *reinterpret_cast<const uint2*>(m + at);
    uint2 bv = *reinterpret_cast<const uint2*>(v + at);
    const bf16* as = reinterpret_cast<const bf16*>(&av);
    const bf16* bs = reinterpret_cast<const bf16*>(&bv);
    for (int i = 0; i < 4; ++i) { a[i] = up(as[i]); b[i] = up(bs[i]); }
  }
  __device__ void store4(long long at, const float* a, const float* b) const {
    uint2 av, bv;
    bf16* as = reinterpret_cast<bf16*>(&av);
    bf16* bs = reinterpret_cast<bf16*>(&bv);
    for (int i = 0; i < 4; ++i) {
      as[i] = down_stochastic(a[i], noise(at + i, key_m));
      bs[i] = down_stochastic(b[i], noise(at + i, key_v));
    }
    *reinterpret_cast<uint2*>(m + at) = av;
    *reinterpret_cast<uint2*>(v + at) = bv;
  }
  __device__ void load1(long long i, float& a, float& b) const { a = up(m[i]); b = up(v[i]); }
  __device__ void store1(long long i, float a, float b) const {
    m[i] = down_stochastic(a, noise(i, key_m));
    v[i] = down_stochastic(b, noise(i, key_v));
  }
};

// Four elements a thread: 16- and 8-byte loads where all four are there, one at a time at the
// end. A non-zero `found_inf` leaves everything as it was; `grad_scale` divides the gradients
// (the clip). `Moments` reads and writes m and v (F32Moments, Bf16Moments).
template <class Moments>
__device__ void adamw_four(float* master, const bf16* grad, const Moments& mo, bf16* work,
                           long long n, const Hyper& h, const float* grad_scale,
                           const float* found_inf) {
  if (found_inf && *found_inf != 0.f) return;
  long long at = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * 4;
  if (at >= n) return;
  float scale = grad_scale ? *grad_scale : 1.f;
  if (at + 4 <= n) {
    float4 p = *reinterpret_cast<float4*>(master + at);
    uint2 gv = *reinterpret_cast<const uint2*>(grad + at);
    const bf16* g = reinterpret_cast<const bf16*>(&gv);
    __align__(16) float a[4];
    __align__(16) float b[4];
    mo.load4(at, a, b);
    float* ps = &p.x;
    uint2 wv;
    bf16* w = reinterpret_cast<bf16*>(&wv);
    for (int i = 0; i < 4; ++i) {
      float gi = up(g[i]);
      if (grad_scale) gi /= scale;
      adamw_one(ps[i], a[i], b[i], gi, h);
      w[i] = down(ps[i]);
    }
    *reinterpret_cast<float4*>(master + at) = p;
    mo.store4(at, a, b);
    *reinterpret_cast<uint2*>(work + at) = wv;
    return;
  }
  for (long long i = at; i < n; ++i) {
    float gi = up(grad[i]);
    if (grad_scale) gi /= scale;
    float a, b;
    mo.load1(i, a, b);
    adamw_one(master[i], a, b, gi, h);
    mo.store1(i, a, b);
    work[i] = down(master[i]);
  }
}

extern "C" __global__ void adamw_bf16(float* master, const bf16* grad, float* m, float* v,
                                      bf16* work, long long n, Hyper h, const float* grad_scale,
                                      const float* found_inf) {
  adamw_four(master, grad, F32Moments{m, v}, work, n, h, grad_scale, found_inf);
}

// adamw_bf16 with the moments in bf16: widened, stepped in f32, rounded stochastically under
// `key_m` and `key_v`.
extern "C" __global__ void adamw_bf16_states(float* master, const bf16* grad, bf16* m, bf16* v,
                                             bf16* work, long long n, Hyper h,
                                             const float* grad_scale, const float* found_inf,
                                             unsigned int key_m, unsigned int key_v) {
  adamw_four(master, grad, Bf16Moments{m, v, key_m, key_v}, work, n, h, grad_scale, found_inf);
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

// One AdamW step: `master` f32, `m` and `v` both f32 or both bf16 (rounded stochastically), and
// `grad`, `work` bf16, contiguous, of one length, on one GPU (16-byte aligned); `work` receives
// the updated masters in bf16. `grad_scale` and `found_inf` (f32 scalars on that GPU, or null)
// as libtorch's fused AdamW takes them. `hyper`: lr, beta1, beta2, weight decay, eps,
// 1 - beta1^step, sqrt(1 - beta2^step), the step (the bf16 moments' noise keys).
int dflash_adamw_bf16(void* master, void* grad, void* m, void* v, void* work, const double* hyper,
                      void* grad_scale, void* found_inf) {
  return dflash::guarded([&] {
    const at::Tensor &pt = tensor(master), &gt = tensor(grad), &mt = tensor(m), &vt = tensor(v),
                     &wt = tensor(work);
    long long n = pt.numel();
    TORCH_CHECK(pt.is_cuda() && pt.scalar_type() == at::kFloat && pt.is_contiguous(),
                "adamw_bf16: master f32, contiguous, on a GPU");
    const bool bf16_states = mt.scalar_type() == at::kBFloat16;
    const auto states = bf16_states ? at::kBFloat16 : at::kFloat;
    for (const at::Tensor* t : {&mt, &vt}) {
      TORCH_CHECK(t->is_cuda() && t->scalar_type() == states && t->is_contiguous() &&
                      t->numel() == n && t->get_device() == pt.get_device(),
                  "adamw_bf16: m and v both f32 or both bf16, contiguous, of the masters' "
                  "length and GPU");
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
    if (bf16_states) {
      unsigned int step = static_cast<unsigned int>(static_cast<long long>(hyper[7]));
      unsigned int key_m = step * 2u, key_v = step * 2u + 1u;
      void* args[] = {&pp, &gp, &mp, &vp, &wp, &n, &h, &scale, &inf, &key_m, &key_v};
      dflash::rtc::launch(kProgram, pt.get_device(), "adamw_bf16_states", (n + 3) / 4, args);
      return;
    }
    void* args[] = {&pp, &gp, &mp, &vp, &wp, &n, &h, &scale, &inf};
    dflash::rtc::launch(kProgram, pt.get_device(), "adamw_bf16", (n + 3) / 4, args);
  });
}
}
