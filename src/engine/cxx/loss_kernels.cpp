// The drafter's loss over a chunk of logits in two passes a row, where libtorch's ops take five
// (argmax, softmax, the probabilities' sum, a gather and a scatter), each over [rows, vocab]
// (259 MB a chunk of 853 rows at Qwen3's 151,936 tokens):
// - loss_rows: one block of 1024 threads a row. The first pass reads the logits once for their
//   largest value, its first index and the sum of exp(logit - largest) (merged as it goes); the
//   second writes the probabilities, rounded to bf16 as softmax rounds them, over the logits, and
//   sums in f32 those of every token but the label. The label's entry becomes minus that sum
//   (`p - onehot(label)` without the cancellation of `p_label - 1` in bf16), and the row's
//   negative log-likelihood and whether its argmax is the label are written out
//   (src/engine/train/loss.rs says why the loss of a confident row is `-log1p(-others)`).
// Compiled at run time (runtime_kernels.h).
#include <ATen/ATen.h>

#include "runtime_kernels.h"

namespace {

const char* kSource = R"(
#include "bf16.h"
#define THREADS 1024
#define NEG_INF __int_as_float(0xff800000)

// (m, s, at): the largest value, the sum of exp(x - m), the first index of m.
__device__ void merge(float& m, float& s, long long& at, float m2, float s2, long long at2) {
  float top = fmaxf(m, m2);
  float a = (m == top) ? s : s * expf(m - top);
  float b = (m2 == top) ? s2 : s2 * expf(m2 - top);
  if (m2 > m || (m2 == m && at2 < at)) at = at2;
  m = top;
  s = a + b;
}

// logits [rows, vocab] bf16 (vocab a multiple of 8, rows 16-byte aligned) become the loss's
// gradient before its scale; nll [rows] f32, hit [rows] u8.
extern "C" __global__ void __launch_bounds__(THREADS) loss_rows(bf16* logits,
    const long long* labels, float* nll, unsigned char* hit, long long vocab) {
  __shared__ float sm[32], ss[32];
  __shared__ long long sat[32];
  __shared__ float others_part[32];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  bf16* row = logits + (long long)blockIdx.x * vocab;
  long long label = labels[blockIdx.x];
  float m = NEG_INF, s = 0.f;
  long long at = vocab;
  for (long long j = threadIdx.x * 8LL; j < vocab; j += THREADS * 8LL) {
    uint4 v = *reinterpret_cast<const uint4*>(row + j);
    const bf16* x = reinterpret_cast<const bf16*>(&v);
    for (int i = 0; i < 8; ++i) {
      float f = up(x[i]);
      if (f > m) {
        s = (m == NEG_INF) ? 1.f : s * expf(m - f) + 1.f;
        m = f;
        at = j + i;
      } else {
        s += expf(f - m);
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    long long at2 = __shfl_xor_sync(0xffffffffu, at, o);
    merge(m, s, at, m2, s2, at2);
  }
  if (lane == 0) { sm[warp] = m; ss[warp] = s; sat[warp] = at; }
  __syncthreads();
  m = sm[0]; s = ss[0]; at = sat[0];
  for (int w = 1; w < THREADS / 32; ++w) merge(m, s, at, sm[w], ss[w], sat[w]);
  float inv = 1.f / s;
  float others = 0.f;
  for (long long j = threadIdx.x * 8LL; j < vocab; j += THREADS * 8LL) {
    uint4 v = *reinterpret_cast<const uint4*>(row + j);
    bf16* x = reinterpret_cast<bf16*>(&v);
    for (int i = 0; i < 8; ++i) {
      bf16 p = down(expf(up(x[i]) - m) * inv);
      if (j + i != label) others += up(p);
      x[i] = p;
    }
    *reinterpret_cast<uint4*>(row + j) = v;
  }
  for (int o = 16; o > 0; o >>= 1) others += __shfl_xor_sync(0xffffffffu, others, o);
  if (lane == 0) others_part[warp] = others;
  __syncthreads();
  if (threadIdx.x == 0) {
    others = 0.f;
    for (int w = 0; w < THREADS / 32; ++w) others += others_part[w];
    // The label's probability as the softmax wrote it (this block wrote it above); a label out
    // of the vocabulary (the caller's to prevent) writes nothing there and has probability 0.
    bool inside = label >= 0 && label < vocab;
    float p_label = inside ? up(row[label]) : 0.f;
    nll[blockIdx.x] = p_label < 0.5f ? -logf(fmaxf(p_label, 1.17549435e-38f)) : -log1pf(-others);
    hit[blockIdx.x] = at == label;
    if (inside) row[label] = down(-others);
  }
}
)";

const dflash::rtc::Program kProgram{"loss_kernels.cu", kSource};

const at::Tensor& tensor(void* p) { return *static_cast<at::Tensor*>(p); }

}  // namespace

extern "C" {

// loss_rows (above) over logits [rows, vocab] bf16 in place, labels [rows] int64 (each below
// vocab), nll [rows] f32 and hit [rows] bool, contiguous on one GPU; on its current stream.
int dflash_loss_rows(void* logits, void* labels, void* nll, void* hit) {
  return dflash::guarded([&] {
    const at::Tensor &lt = tensor(logits), &yt = tensor(labels), &nt = tensor(nll),
                     &ht = tensor(hit);
    TORCH_CHECK(lt.is_cuda() && lt.scalar_type() == at::kBFloat16 && lt.dim() == 2 &&
                    lt.is_contiguous() && lt.size(1) % 8 == 0 && lt.size(1) > 0 &&
                    reinterpret_cast<uintptr_t>(lt.data_ptr()) % 16 == 0,
                "loss_rows: logits bf16 [rows, vocab], contiguous, vocab a multiple of 8");
    long long rows = lt.size(0), vocab = lt.size(1);
    TORCH_CHECK(yt.scalar_type() == at::kLong && yt.is_contiguous() && yt.numel() == rows,
                "loss_rows: labels int64 [rows]");
    TORCH_CHECK(nt.scalar_type() == at::kFloat && nt.is_contiguous() && nt.numel() == rows,
                "loss_rows: nll f32 [rows]");
    TORCH_CHECK(ht.scalar_type() == at::kBool && ht.is_contiguous() && ht.numel() == rows,
                "loss_rows: hit bool [rows]");
    for (const at::Tensor* t : {&yt, &nt, &ht})
      TORCH_CHECK(t->device() == lt.device(), "loss_rows: every tensor on the logits' GPU");
    if (rows == 0) return;
    void *lp = lt.data_ptr(), *yp = yt.data_ptr(), *np = nt.data_ptr(), *hp = ht.data_ptr();
    void* args[] = {&lp, &yp, &np, &hp, &vocab};
    dflash::rtc::launch_shaped(kProgram, lt.get_device(), "loss_rows",
                               dflash::rtc::Shape{static_cast<unsigned>(rows), 1, 1, 1024, 0},
                               args);
  });
}
}
