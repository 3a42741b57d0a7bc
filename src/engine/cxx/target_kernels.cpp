// Kernels of our own for the frozen target's forward, where libtorch runs several full passes
// over a large tensor that one pass can do:
// - norm_rope: the attention's q/k RMSNorm and RoPE. Unfused they are a norm, a roll, a multiply
//   and a multiply-add per tensor, each a full pass over q (25 MB a layer at 8B shapes): about
//   8% of a layer's time. Here each (token, head) row of 128 is read once from the fused q/k/v
//   projection, normalised and scaled in f32, rotated and written once.
// - silu_mul: the MLP's silu(gate) * up, one pass instead of two (and no silu tensor).
// - add_rms_norm: a residual add and the RMSNorm after it (the block's post-attention norm, the
//   next layer's input norm) in one pass: the sum is written and normalised without being read
//   back from memory by a second kernel.
// Each rounds where the ops it replaces round, so the two agree to the bit or nearly. They are
// compiled at run time (runtime_kernels.h).
//
// norm_rope and silu_mul also serve the drafter's training step, as autograd ops (`NormRope`,
// whose q/k norms are trained, and `SiluMul`) with a backward kernel each: norm_rope_backward
// takes each row's gradient through the rotation and the norm in one pass, and the norm weight's
// gradient as one partial sum a block (summed after, in a fixed order: the same inputs give the
// same gradient bit for bit); silu_mul_backward both inputs' gradients in one pass. So does
// add_rms_norm (`AddRmsNorm`: the drafter's residual adds and the norms after them, trained):
// add_rms_norm_backward takes the norm's gradient, adds the one the sum gets from the residual
// stream in the same pass (where autograd would add the two after), and the weight's gradient
// as partial sums a block.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <initializer_list>

#include "runtime_kernels.h"

namespace {

const char* kSource = R"(
#include "bf16.h"
__device__ float r(float f) { return up(down(f)); }

// One warp per (token, head) row of 128: lane l holds elements 4l..4l+3, and the partner of
// element c in the rotation, c + 64 mod 128, is in lane l ^ 16.
extern "C" __global__ void norm_rope(const bf16* x, long long token_stride, int col0, int heads,
                                     const bf16* w, const bf16* cos_t, const bf16* sin_t,
                                     bf16* out, long long rows, float eps) {
  long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  long long t = row / heads;
  int h = (int)(row % heads);
  const bf16* src = x + t * token_stride + col0 + h * 128 + lane * 4;
  float v[4], ss = 0.f;
  for (int i = 0; i < 4; ++i) { v[i] = up(src[i]); ss += v[i] * v[i]; }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  float inv = rsqrtf(ss / 128.f + eps);
  float n[4], p[4];
  for (int i = 0; i < 4; ++i) n[i] = r(v[i] * inv * up(w[lane * 4 + i]));
  for (int i = 0; i < 4; ++i) p[i] = __shfl_xor_sync(0xffffffffu, n[i], 16);
  const bf16* c = cos_t + t * 128 + lane * 4;
  const bf16* s = sin_t + t * 128 + lane * 4;
  bf16* dst = out + row * 128 + lane * 4;
  for (int i = 0; i < 4; ++i) dst[i] = down(r(n[i] * up(c[i])) + p[i] * up(s[i]));
}

// The gradient of norm_rope over rows [tokens, heads, 128] (x contiguous as such): with
// n = x * inv * w (inv = rsqrt(mean(x^2) + eps)) and out[c] = n[c] cos[c] + n[c^64] sin[c],
// dn[c] = dy[c] cos[c] + dy[c^64] sin[c^64]; dx = inv (dn w) - x inv^3 sum(dn w x) / 128; and
// dw[c] = sum over rows of dn[c] x[c] inv, one partial sum a block in dw_part [blocks, 128].
// Blocks of 256 threads (8 warps), a warp a row at a time, rows strided by the grid.
extern "C" __global__ void norm_rope_backward(const bf16* x, const bf16* w, const bf16* cos_t,
                                              const bf16* sin_t, const bf16* dy, bf16* dx,
                                              float* dw_part, long long rows, int heads,
                                              float eps) {
  __shared__ float part[8][128];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float wl[4], acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < 4; ++i) wl[i] = up(w[lane * 4 + i]);
  for (long long row = (long long)blockIdx.x * 8 + warp; row < rows;
       row += (long long)gridDim.x * 8) {
    long long t = row / heads;
    long long at = row * 128 + lane * 4;
    float v[4], d[4], ds[4], c[4], ss = 0.f;
    for (int i = 0; i < 4; ++i) {
      v[i] = up(x[at + i]);
      ss += v[i] * v[i];
      d[i] = up(dy[at + i]);
      c[i] = up(cos_t[t * 128 + lane * 4 + i]);
      ds[i] = d[i] * up(sin_t[t * 128 + lane * 4 + i]);
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float inv = rsqrtf(ss / 128.f + eps);
    float g[4], dot = 0.f;
    for (int i = 0; i < 4; ++i) {
      float dn = d[i] * c[i] + __shfl_xor_sync(0xffffffffu, ds[i], 16);
      acc[i] += dn * v[i] * inv;
      g[i] = dn * wl[i];
      dot += g[i] * v[i];
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    float k = inv * inv * inv * dot / 128.f;
    for (int i = 0; i < 4; ++i) dx[at + i] = down(inv * g[i] - v[i] * k);
  }
  for (int i = 0; i < 4; ++i) part[warp][lane * 4 + i] = acc[i];
  __syncthreads();
  if (threadIdx.x < 128) {
    float sum = 0.f;
    for (int j = 0; j < 8; ++j) sum += part[j][threadIdx.x];
    dw_part[(long long)blockIdx.x * 128 + threadIdx.x] = sum;
  }
}

// out = silu(g) * u elementwise, 8 elements a thread (n a multiple of 8, 16-byte aligned).
extern "C" __global__ void silu_mul(const bf16* g, const bf16* u, bf16* out, long long n) {
  long long at = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * 8;
  if (at >= n) return;
  uint4 gv = *reinterpret_cast<const uint4*>(g + at);
  uint4 uv = *reinterpret_cast<const uint4*>(u + at);
  const bf16* gs = reinterpret_cast<const bf16*>(&gv);
  const bf16* us = reinterpret_cast<const bf16*>(&uv);
  uint4 ov;
  bf16* os = reinterpret_cast<bf16*>(&ov);
  for (int i = 0; i < 8; ++i) {
    float x = up(gs[i]);
    os[i] = down(r(x / (1.0f + expf(-x))) * up(us[i]));
  }
  *reinterpret_cast<uint4*>(out + at) = ov;
}

// The gradients of out = silu(g) * u: with s = sigmoid(g), du = dy silu(g) (silu rounded to bf16
// first, as the forward multiplies it) and dg = dy u s (1 + g (1 - s)), in f32, each rounded once.
// 8 elements a thread (n a multiple of 8, 16-byte aligned).
extern "C" __global__ void silu_mul_backward(const bf16* g, const bf16* u, const bf16* dy,
                                             bf16* dg, bf16* du, long long n) {
  long long at = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * 8;
  if (at >= n) return;
  uint4 gv = *reinterpret_cast<const uint4*>(g + at);
  uint4 uv = *reinterpret_cast<const uint4*>(u + at);
  uint4 dv = *reinterpret_cast<const uint4*>(dy + at);
  const bf16* gs = reinterpret_cast<const bf16*>(&gv);
  const bf16* us = reinterpret_cast<const bf16*>(&uv);
  const bf16* ds = reinterpret_cast<const bf16*>(&dv);
  uint4 gout, uout;
  bf16* go = reinterpret_cast<bf16*>(&gout);
  bf16* uo = reinterpret_cast<bf16*>(&uout);
  for (int i = 0; i < 8; ++i) {
    float x = up(gs[i]), d = up(ds[i]);
    float s = 1.0f / (1.0f + expf(-x));
    uo[i] = down(d * r(x * s));
    go[i] = down(d * up(us[i]) * s * (1.0f + x * (1.0f - s)));
  }
  *reinterpret_cast<uint4*>(dg + at) = gout;
  *reinterpret_cast<uint4*>(du + at) = uout;
}

// sum = x + d, rounded as the bf16 add rounds; out = sum * rsqrt(mean(sum^2) + eps) * w in f32,
// rounded once (libtorch's fused rms_norm). One block of 256 threads a row of `cols` (a multiple
// of 8), 8 elements at a time; the second pass reads the row's sum back from cache.
extern "C" __global__ void add_rms_norm(const bf16* x, const bf16* d, const bf16* w, bf16* sum,
                                        bf16* out, int cols, float eps) {
  long long base = (long long)blockIdx.x * cols;
  float ss = 0.f;
  for (int at = threadIdx.x * 8; at < cols; at += blockDim.x * 8) {
    uint4 xv = *reinterpret_cast<const uint4*>(x + base + at);
    uint4 dv = *reinterpret_cast<const uint4*>(d + base + at);
    const bf16* xs = reinterpret_cast<const bf16*>(&xv);
    const bf16* ds = reinterpret_cast<const bf16*>(&dv);
    uint4 sv;
    bf16* ss8 = reinterpret_cast<bf16*>(&sv);
    for (int i = 0; i < 8; ++i) {
      ss8[i] = down(up(xs[i]) + up(ds[i]));
      float v = up(ss8[i]);
      ss += v * v;
    }
    *reinterpret_cast<uint4*>(sum + base + at) = sv;
  }
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if ((threadIdx.x & 31) == 0) partial[warp] = ss;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < warps; ++i) total += partial[i];
  float inv = rsqrtf(total / cols + eps);
  for (int at = threadIdx.x * 8; at < cols; at += blockDim.x * 8) {
    uint4 sv = *reinterpret_cast<const uint4*>(sum + base + at);
    uint4 wv = *reinterpret_cast<const uint4*>(w + at);
    const bf16* ss8 = reinterpret_cast<const bf16*>(&sv);
    const bf16* ws = reinterpret_cast<const bf16*>(&wv);
    uint4 ov;
    bf16* os = reinterpret_cast<bf16*>(&ov);
    for (int i = 0; i < 8; ++i) os[i] = down(up(ss8[i]) * inv * up(ws[i]));
    *reinterpret_cast<uint4*>(out + base + at) = ov;
  }
}

// The gradient of add_rms_norm, trained: with s the forward's sum, inv = rsqrt(mean(s^2) + eps)
// and g = dout w, the sum's gradient is dsum (what it gets elsewhere: the residual stream; null
// for none) + inv g - s inv^3 sum(g s) / cols, in f32 and rounded once, written to dx (x's and
// d's gradient both); dw = sum over rows of dout s inv, one partial sum a block in dw_part
// [blocks, cols]. Blocks of 256 threads (8 warps), a block a row at a time, rows strided by the
// grid; a thread holds the 8 columns at threadIdx.x * 8 + k * 2048, k < 4 (cols <= 8192, a
// multiple of 8, rows 16-byte aligned).
#define NORM_CHUNKS 4
extern "C" __global__ void __launch_bounds__(256) add_rms_norm_backward(
    const bf16* s, const bf16* w, const bf16* dout, const bf16* dsum, bf16* dx, float* dw_part,
    long long rows, int cols, float eps) {
  __shared__ float red[2][2][8];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // The row's values are kept as loaded (8 bf16 in a uint4): half the registers of floats.
  uint4 wv[NORM_CHUNKS], sv[NORM_CHUNKS], dv[NORM_CHUNKS];
  float acc[NORM_CHUNKS][8];
  for (int k = 0; k < NORM_CHUNKS; ++k) {
    int at = threadIdx.x * 8 + k * 2048;
    wv[k] = at < cols ? *reinterpret_cast<const uint4*>(w + at) : make_uint4(0, 0, 0, 0);
    for (int i = 0; i < 8; ++i) acc[k][i] = 0.f;
  }
  int turn = 0;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x, turn ^= 1) {
    long long base = row * cols;
    float ss = 0.f, dot = 0.f;
    for (int k = 0; k < NORM_CHUNKS; ++k) {
      int at = threadIdx.x * 8 + k * 2048;
      if (at >= cols) continue;
      sv[k] = *reinterpret_cast<const uint4*>(s + base + at);
      dv[k] = *reinterpret_cast<const uint4*>(dout + base + at);
      const bf16* s8 = reinterpret_cast<const bf16*>(&sv[k]);
      const bf16* d8 = reinterpret_cast<const bf16*>(&dv[k]);
      const bf16* w8 = reinterpret_cast<const bf16*>(&wv[k]);
      for (int i = 0; i < 8; ++i) {
        float v = up(s8[i]);
        ss += v * v;
        dot += up(d8[i]) * up(w8[i]) * v;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      ss += __shfl_xor_sync(0xffffffffu, ss, o);
      dot += __shfl_xor_sync(0xffffffffu, dot, o);
    }
    // Two sets of slots taken in turn: a row's writes never meet the reads of the row before.
    if (lane == 0) {
      red[turn][0][warp] = ss;
      red[turn][1][warp] = dot;
    }
    __syncthreads();
    float total = 0.f, gs = 0.f;
    for (int i = 0; i < 8; ++i) {
      total += red[turn][0][i];
      gs += red[turn][1][i];
    }
    float inv = rsqrtf(total / cols + eps);
    float kk = inv * inv * inv * gs / cols;
    for (int k = 0; k < NORM_CHUNKS; ++k) {
      int at = threadIdx.x * 8 + k * 2048;
      if (at >= cols) continue;
      uint4 ev = dsum != nullptr ? *reinterpret_cast<const uint4*>(dsum + base + at)
                                 : make_uint4(0, 0, 0, 0);
      const bf16* e8 = reinterpret_cast<const bf16*>(&ev);
      const bf16* s8 = reinterpret_cast<const bf16*>(&sv[k]);
      const bf16* d8 = reinterpret_cast<const bf16*>(&dv[k]);
      const bf16* w8 = reinterpret_cast<const bf16*>(&wv[k]);
      uint4 ov;
      bf16* o8 = reinterpret_cast<bf16*>(&ov);
      for (int i = 0; i < 8; ++i) {
        float v = up(s8[i]), d = up(d8[i]);
        o8[i] = down(up(e8[i]) + inv * d * up(w8[i]) - v * kk);
        acc[k][i] += d * v * inv;
      }
      *reinterpret_cast<uint4*>(dx + base + at) = ov;
    }
  }
  for (int k = 0; k < NORM_CHUNKS; ++k) {
    int at = threadIdx.x * 8 + k * 2048;
    if (at >= cols) continue;
    for (int i = 0; i < 8; ++i) dw_part[(long long)blockIdx.x * cols + at + i] = acc[k][i];
  }
}
)";

const dflash::rtc::Program kProgram{"target_kernels.cu", kSource};

// FP8 for the frozen target (`--target-precision fp8`), a program of its own: the e4m3
// conversion instruction exists from sm_89 on, and an older card must still compile the kernels
// above.
const char* kFp8Source = R"(
#include "bf16.h"
// Each row of x [rows, cols] (cols a multiple of 8) in e4m3 with a scale of its own: scale =
// max(amax, min_amax) / max_e4m3, q = x / scale rounded to nearest even, saturated to the finite
// range. One block of 256 threads a row; the second pass reads the row back from cache. Rounds as
// the ATen ops of `quantize_rows_ops` (src/engine/model/fp8.rs) do: f32 divisions, one rounding.
extern "C" __global__ void quantize_rows_e4m3(const bf16* x, unsigned char* q, float* scale,
                                              int cols, float min_amax, float max_e4m3) {
  long long base = (long long)blockIdx.x * cols;
  float m = 0.f;
  for (int at = threadIdx.x * 8; at < cols; at += blockDim.x * 8) {
    uint4 xv = *reinterpret_cast<const uint4*>(x + base + at);
    const bf16* xs = reinterpret_cast<const bf16*>(&xv);
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(up(xs[i])));
  }
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if ((threadIdx.x & 31) == 0) partial[warp] = m;
  __syncthreads();
  float amax = 0.f;
  for (int i = 0; i < warps; ++i) amax = fmaxf(amax, partial[i]);
  float s = fmaxf(amax, min_amax) / max_e4m3;
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
  for (int at = threadIdx.x * 8; at < cols; at += blockDim.x * 8) {
    uint4 xv = *reinterpret_cast<const uint4*>(x + base + at);
    const bf16* xs = reinterpret_cast<const bf16*>(&xv);
    unsigned short pairs[4];
    for (int i = 0; i < 4; ++i) {
      float lo = up(xs[2 * i]) / s, hi = up(xs[2 * i + 1]) / s;
      // The first source lands in the upper byte: element 2i+1 above element 2i, as in memory.
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pairs[i]) : "f"(hi), "f"(lo));
    }
    *reinterpret_cast<uint2*>(q + base + at) = *reinterpret_cast<const uint2*>(pairs);
  }
}
)";

const dflash::rtc::Program kFp8Program{"fp8_kernels.cu", kFp8Source};

void launch(int device, const char* name, long long threads_needed, void** args) {
  dflash::rtc::launch(kProgram, device, name, threads_needed, args);
}

const at::Tensor& tensor(void* p) { return *static_cast<at::Tensor*>(p); }

void check_bf16_cuda(std::initializer_list<const at::Tensor*> ts) {
  for (const at::Tensor* t : ts) {
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kBFloat16, "bf16 tensors on CUDA");
  }
}

// The kernels read and write 8 bf16 at a time (16 bytes): a view at an odd offset would fault.
void check_aligned(std::initializer_list<const at::Tensor*> ts) {
  for (const at::Tensor* t : ts) {
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, "tensors 16-byte aligned");
  }
}

// Blocks of norm_rope_backward at most: enough to fill a card, few partial sums to add.
constexpr long long kBackwardBlocks = 1024;

// out [tokens, heads, 128] = norm_rope of the heads at feature `col0` of every token of x
// [.., tokens, features] (contiguous), on the current stream of x's GPU; checks the shapes.
void norm_rope_into(const at::Tensor& xt, long long col0, long long heads, const at::Tensor& wt,
                    const at::Tensor& ct, const at::Tensor& st, const at::Tensor& ot, double eps) {
  check_bf16_cuda({&xt, &wt, &ct, &st, &ot});
  TORCH_CHECK(xt.is_contiguous() && xt.dim() >= 2, "x: contiguous rows of features");
  long long token_stride = xt.size(-1);
  long long tokens = token_stride > 0 ? xt.numel() / token_stride : 0;
  TORCH_CHECK(col0 % 4 == 0 && token_stride % 4 == 0 && col0 + heads * 128 <= token_stride,
              "x: the heads inside a row, aligned to 4 elements");
  TORCH_CHECK(wt.numel() == 128 && wt.is_contiguous() && ct.is_contiguous() &&
                  st.is_contiguous() && ct.numel() == tokens * 128 && st.numel() == tokens * 128,
              "weight [128], cos and sin [tokens, 128]");
  TORCH_CHECK(ot.is_contiguous() && ot.numel() == tokens * heads * 128, "out [tokens, heads, 128]");
  long long rows = tokens * heads;
  if (rows == 0) return;
  const void *xp = xt.data_ptr(), *wp = wt.data_ptr(), *cp = ct.data_ptr(), *sp = st.data_ptr();
  void* op = ot.data_ptr();
  int c0 = static_cast<int>(col0), h = static_cast<int>(heads);
  float e = static_cast<float>(eps);
  void* args[] = {&xp, &token_stride, &c0, &h, &wp, &cp, &sp, &op, &rows, &e};
  launch(xt.get_device(), "norm_rope", rows * 32, args);
}

// norm_rope as an autograd op over x [.., tokens, heads, 128] (contiguous), differentiable in x
// and the norm weight w [128]; cos and sin [.., tokens, 128] are constants.
struct NormRope : public torch::autograd::Function<NormRope> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, const at::Tensor& cos, const at::Tensor& sin,
                            double eps) {
    TORCH_CHECK(x.dim() >= 3 && x.size(-1) == 128 && x.is_contiguous(),
                "norm_rope: x [.., tokens, heads, 128], contiguous");
    long long heads = x.size(-2);
    auto out = at::empty_like(x);
    if (x.numel() > 0) {
      // The backward's kernel compiled now: a failure then shows here, where the caller can
      // take the ops, not inside backward.
      dflash::rtc::kernel_for(kProgram, x.get_device(), "norm_rope_backward");
      norm_rope_into(x.view({-1, heads * 128}), 0, heads, w, cos, sin, out, eps);
    }
    ctx->save_for_backward({x, w, cos, sin});
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &cos = saved[2], &sin = saved[3];
    float eps = static_cast<float>(ctx->saved_data["eps"].toDouble());
    at::Tensor dy = grads[0].to(at::kBFloat16).contiguous();
    auto dx = at::empty_like(x);
    long long rows = x.numel() / 128;
    int heads = static_cast<int>(x.size(-2));
    long long blocks = std::min(kBackwardBlocks, std::max(1LL, (rows + 7) / 8));
    // Every block writes its row of partial sums; with no rows no block runs, and the sum is 0.
    auto part = rows > 0 ? at::empty({blocks, 128}, x.options().dtype(at::kFloat))
                         : at::zeros({blocks, 128}, x.options().dtype(at::kFloat));
    if (rows > 0) {
      const void *xp = x.data_ptr(), *wp = w.data_ptr(), *cp = cos.data_ptr(),
                 *sp = sin.data_ptr(), *gp = dy.data_ptr();
      void *dxp = dx.data_ptr(), *pp = part.data_ptr();
      void* args[] = {&xp, &wp, &cp, &sp, &gp, &dxp, &pp, &rows, &heads, &eps};
      dflash::rtc::launch_shaped(
          kProgram, x.get_device(), "norm_rope_backward",
          dflash::rtc::Shape{static_cast<unsigned>(blocks), 1, 1, 256, 0}, args);
    }
    return {dx, part.sum(0).to(w.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// out = silu(g) * u, all bf16, contiguous, of one size (a multiple of 8) on one GPU, on its
// current stream; checks the shapes.
void silu_mul_into(const at::Tensor& gt, const at::Tensor& ut, const at::Tensor& ot) {
  check_bf16_cuda({&gt, &ut, &ot});
  TORCH_CHECK(gt.is_contiguous() && ut.is_contiguous() && ot.is_contiguous() &&
                  gt.numel() == ut.numel() && gt.numel() == ot.numel() && gt.numel() % 8 == 0,
              "silu_mul: contiguous tensors of one size, a multiple of 8");
  check_aligned({&gt, &ut, &ot});
  long long n = gt.numel();
  if (n == 0) return;
  const void *gp = gt.data_ptr(), *up = ut.data_ptr();
  void* op = ot.data_ptr();
  void* args[] = {&gp, &up, &op, &n};
  launch(gt.get_device(), "silu_mul", n / 8, args);
}

// silu(g) * u as an autograd op over g and u (bf16 on one GPU, contiguous, of one size, a
// multiple of 8): the forward keeps g and u, not silu(g), for its backward.
struct SiluMul : public torch::autograd::Function<SiluMul> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& g,
                            const at::Tensor& u) {
    TORCH_CHECK(g.sizes() == u.sizes(), "silu_mul: gate and up of one shape");
    auto out = at::empty_like(g);
    if (g.numel() > 0) {
      dflash::rtc::kernel_for(kProgram, g.get_device(), "silu_mul_backward");
    }
    silu_mul_into(g, u, out);
    ctx->save_for_backward({g, u});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &u = saved[1];
    at::Tensor dy = grads[0].to(at::kBFloat16).contiguous();
    // Read 8 at a time: a gradient that is a view at an odd offset is copied first.
    if (reinterpret_cast<uintptr_t>(dy.data_ptr()) % 16 != 0) dy = dy.clone();
    auto dg = at::empty_like(g);
    auto du = at::empty_like(u);
    long long n = g.numel();
    if (n > 0) {
      const void *gp = g.data_ptr(), *up = u.data_ptr(), *dp = dy.data_ptr();
      void *dgp = dg.data_ptr(), *dup = du.data_ptr();
      void* args[] = {&gp, &up, &dp, &dgp, &dup, &n};
      launch(g.get_device(), "silu_mul_backward", n / 8, args);
    }
    return {dg, du};
  }
};

// sum = x + d and out = rms_norm(sum) * w (see dflash_add_rms_norm), on the current stream of
// x's GPU; checks the shapes.
void add_rms_norm_into(const at::Tensor& xt, const at::Tensor& dt, const at::Tensor& wt,
                       const at::Tensor& st, const at::Tensor& ot, double eps) {
  check_bf16_cuda({&xt, &dt, &wt, &st, &ot});
  long long cols = xt.dim() > 0 ? xt.size(-1) : 0;
  for (const at::Tensor* t : {&xt, &dt, &st, &ot}) {
    TORCH_CHECK(t->is_contiguous() && t->sizes() == xt.sizes(),
                "add_rms_norm: x, d, sum and out contiguous of one shape");
  }
  TORCH_CHECK(cols > 0 && cols % 8 == 0 && wt.is_contiguous() && wt.numel() == cols,
              "add_rms_norm: rows a multiple of 8 wide, weight of one row's width");
  check_aligned({&xt, &dt, &wt, &st, &ot});
  long long rows = xt.numel() / cols;
  if (rows == 0) return;
  const void *xp = xt.data_ptr(), *dp = dt.data_ptr(), *wp = wt.data_ptr();
  void *sp = st.data_ptr(), *op = ot.data_ptr();
  int c = static_cast<int>(cols);
  float e = static_cast<float>(eps);
  void* args[] = {&xp, &dp, &wp, &sp, &op, &c, &e};
  launch(xt.get_device(), "add_rms_norm", rows * 256, args);
}

// Blocks of add_rms_norm_backward at most: a few a multiprocessor, few partial sums to add.
constexpr long long kNormBackwardBlocks = 512;

// add_rms_norm as an autograd op over x and d [.., cols] and the trained weight w [cols] (bf16
// on one GPU, contiguous, cols a multiple of 8 up to 8192): (sum, out), both differentiable;
// the backward's kernel adds the gradient the sum gets elsewhere in the pass that takes the
// norm's, and the weight's as partial sums added in a fixed order.
struct AddRmsNorm : public torch::autograd::Function<AddRmsNorm> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& d,
                                                const at::Tensor& w, double eps) {
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) <= 8192, "add_rms_norm: rows of at most 8192");
    auto sum = at::empty_like(x);
    auto out = at::empty_like(x);
    if (x.numel() > 0) {
      dflash::rtc::kernel_for(kProgram, x.get_device(), "add_rms_norm_backward");
    }
    add_rms_norm_into(x, d, w, sum, out, eps);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({sum, w});
    ctx->saved_data["eps"] = eps;
    return {sum, out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &sum = saved[0], &w = saved[1];
    float eps = static_cast<float>(ctx->saved_data["eps"].toDouble());
    long long cols = sum.size(-1), rows = sum.numel() / cols;
    // Read 8 at a time: a gradient that is a view at an odd offset is copied first.
    auto dense = [](const at::Tensor& g) {
      at::Tensor t = g.to(at::kBFloat16).contiguous();
      return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
    };
    at::Tensor dsum = grads[0].defined() ? dense(grads[0]) : at::Tensor();
    if (!grads[1].defined()) {
      at::Tensor through = dsum.defined() ? dsum : at::zeros_like(sum);
      return {through, through, at::Tensor(), at::Tensor()};
    }
    at::Tensor dout = dense(grads[1]);
    auto dx = at::empty_like(sum);
    long long blocks = std::min(kNormBackwardBlocks, std::max(1LL, rows));
    auto part = rows > 0 ? at::empty({blocks, cols}, sum.options().dtype(at::kFloat))
                         : at::zeros({blocks, cols}, sum.options().dtype(at::kFloat));
    if (rows > 0) {
      const void *sp = sum.data_ptr(), *wp = w.data_ptr(), *op = dout.data_ptr(),
                 *ep = dsum.defined() ? dsum.data_ptr() : nullptr;
      void *dxp = dx.data_ptr(), *pp = part.data_ptr();
      int c = static_cast<int>(cols);
      void* args[] = {&sp, &wp, &op, &ep, &dxp, &pp, &rows, &c, &eps};
      dflash::rtc::launch_shaped(
          kProgram, sum.get_device(), "add_rms_norm_backward",
          dflash::rtc::Shape{static_cast<unsigned>(blocks), 1, 1, 256, 0}, args);
    }
    return {dx, dx, part.sum(0).to(w.scalar_type()), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// SiluMul (above) on g and u: a new tensor in `out`, differentiable in both.
int dflash_silu_mul_trained(void* g, void* u, void** out) {
  return dflash::guarded([&] { *out = new at::Tensor(SiluMul::apply(tensor(g), tensor(u))); });
}

// NormRope (above) on x, w, cos and sin: a new tensor in `out`, differentiable in x and w.
int dflash_norm_rope_trained(void* x, void* w, void* cos, void* sin, double eps, void** out) {
  return dflash::guarded([&] {
    *out = new at::Tensor(NormRope::apply(tensor(x), tensor(w), tensor(cos), tensor(sin), eps));
  });
}

// out [tokens, heads, 128] = rope(rms_norm(x[token, col0 + head * 128 ..][:128]) * w) for every
// token and head; x [.., tokens, >= col0 + heads * 128] contiguous, cos and sin [tokens, 128]
// (sin's first half negated, as `rope_tables` makes it), all bf16 on one GPU; on the current
// stream of that GPU.
int dflash_norm_rope(void* x, long long col0, long long heads, void* w, void* cos, void* sin,
                     void* out, double eps) {
  return dflash::guarded([&] {
    norm_rope_into(tensor(x), col0, heads, tensor(w), tensor(cos), tensor(sin), tensor(out), eps);
  });
}

// out = silu(g) * u, all bf16, contiguous, of one size (a multiple of 8) on one GPU.
int dflash_silu_mul(void* g, void* u, void* out) {
  return dflash::guarded([&] { silu_mul_into(tensor(g), tensor(u), tensor(out)); });
}

// sum = x + d and out = rms_norm(sum) * w over the last axis: x, d, sum and out contiguous of
// one shape [.., cols], w [cols], cols a multiple of 8, all bf16 on one GPU.
int dflash_add_rms_norm(void* x, void* d, void* w, void* sum, void* out, double eps) {
  return dflash::guarded([&] {
    add_rms_norm_into(tensor(x), tensor(d), tensor(w), tensor(sum), tensor(out), eps);
  });
}

// AddRmsNorm (above) on x, d and w: the sum and the normed sum, new tensors in `sum` and `out`,
// differentiable in all three.
int dflash_add_rms_norm_trained(void* x, void* d, void* w, double eps, void** sum, void** out) {
  return dflash::guarded([&] {
    auto both = AddRmsNorm::apply(tensor(x), tensor(d), tensor(w), eps);
    *sum = new at::Tensor(std::move(both[0]));
    *out = new at::Tensor(std::move(both[1]));
  });
}

// q [rows, cols] e4m3 and scale [rows, 1] f32 from x [rows, cols] bf16 (cols a multiple of 8),
// all contiguous on one GPU: each row over its largest magnitude (at least `min_amax`) times
// `max_e4m3`, rounded to nearest even and saturated.
int dflash_quantize_rows_e4m3(void* x, void* q, void* scale, double min_amax, double max_e4m3) {
  return dflash::guarded([&] {
    const at::Tensor &xt = tensor(x), &qt = tensor(q), &st = tensor(scale);
    check_bf16_cuda({&xt});
    TORCH_CHECK(xt.dim() == 2 && xt.is_contiguous() && xt.size(1) % 8 == 0 && xt.size(1) > 0,
                "quantize_rows: x contiguous [rows, cols], cols a multiple of 8");
    TORCH_CHECK(qt.scalar_type() == at::kFloat8_e4m3fn && qt.is_contiguous() &&
                    qt.sizes() == xt.sizes() && qt.device() == xt.device(),
                "quantize_rows: q e4m3 of x's shape on its GPU");
    TORCH_CHECK(st.scalar_type() == at::kFloat && st.is_contiguous() &&
                    st.numel() == xt.size(0) && st.device() == xt.device(),
                "quantize_rows: scale f32 [rows, 1] on x's GPU");
    check_aligned({&xt});
    TORCH_CHECK(reinterpret_cast<uintptr_t>(qt.data_ptr()) % 8 == 0, "q 8-byte aligned");
    long long rows = xt.size(0);
    if (rows == 0) return;
    const void* xp = xt.data_ptr();
    void *qp = qt.data_ptr(), *sp = st.data_ptr();
    int c = static_cast<int>(xt.size(1));
    float lo = static_cast<float>(min_amax), top = static_cast<float>(max_e4m3);
    void* args[] = {&xp, &qp, &sp, &c, &lo, &top};
    dflash::rtc::launch(kFp8Program, xt.get_device(), "quantize_rows_e4m3", rows * 256, args);
  });
}
}
