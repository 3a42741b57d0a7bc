// The drafter's block attention in kernels of our own: each block of 16 queries attends to the
// context keys of its span (its document's keys before its anchor) and to its own 16 block keys,
// and nothing else is computed (the tiled sdpa path computes about four times the visible pairs:
// its tiles' whole windows and every block key of a tile). Forward and backward as a libtorch
// autograd function, so the drafter's training step calls it like any op.
//
// Layout: q [b, 16a, hq, 128], k and v [b, s + 16a, hkv, 128] (the s context keys, then the
// blocks' own keys), bf16, contiguous; spans [b, a, 4] int32: the block's context keys
// [start, end), its document id, and whether it is a real block (a padding block sees nothing and
// its output is zero); docs [b, s] int32: each context key's document (a key inside the span but
// of another document is not seen, as the dense mask says).
//
// The kernels run on the tensor cores through mma.sync (bf16 in, f32 accumulated), one warp per
// query head and block in the forward and dq kernels (the head's 16 queries against tiles of 64
// keys held in shared memory by the block's KV head), one warp per 16 keys in the dk/dv kernel
// (each tile of 64 keys against every block that sees it). A KV head's query heads (its group:
// 4 at Qwen3-8B's shapes, 5 at 14B's, 8 at 32B's) go four at a time at most (a chunk), split as
// evenly as that allows (14B's 5 as 3 + 2): a forward or dq block takes one chunk, and the dk/dv
// kernel steps through a seeing block's chunks one after another. Where the chunks are uneven,
// the last chunk's spare warps (fewer than the chunks) repeat its last head's work and write
// nothing. No atomics: every output element is
// written by one warp. Operands come from shared memory through ldmatrix, and each kernel copies
// its next tile (cp.async) into a second set of shared tiles while it computes on the current
// one. Compiled at run time (runtime_kernels.h).
#include <ATen/ATen.h>
#include <algorithm>
#include <torch/csrc/autograd/custom_function.h>

#include "runtime_kernels.h"

namespace {

constexpr char kSource[] = R"(
#include "bf16.h"

#define D 128
#define KT 64
#define SP 136
#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ unsigned pack(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned ld32(const bf16* p) {
  return *reinterpret_cast<const unsigned*>(p);
}

// Four 8 x 8 matrices of a shared tile in one ldmatrix, each lane giving the address of one of
// their rows (`row` and `col` from its lane).
__device__ __forceinline__ void ldsm(unsigned* r, const bf16* p) {
  unsigned at = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

__device__ __forceinline__ void ldsm_t(unsigned* r, const bf16* p) {
  unsigned at = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

// The A fragment of the 16 x 16 piece at `p` of a shared tile.
__device__ __forceinline__ void smem_a(unsigned* a, const bf16* p, int lane) {
  ldsm(a, p + (lane & 15) * SP + (lane >> 4) * 8);
}

// B fragments where the tile holds B transposed (a row per n, k along the row): (b0, b1) of
// k steps 0 and 1 of the 8 x 32 piece at `p` (n rows, k columns).
__device__ __forceinline__ void smem_bt(unsigned* b, const bf16* p, int lane) {
  ldsm(b, p + (lane & 7) * SP + (lane >> 3) * 8);
}

// B fragments where the tile holds B as it is (a row per k): (b0, b1) of n-tiles 0 and 1 of the
// 16 x 16 piece at `p` (k rows, n columns).
__device__ __forceinline__ void smem_b(unsigned* b, const bf16* p, int lane) {
  ldsm_t(b, p + (lane & 15) * SP + (lane >> 4) * 8);
}

// The A fragment of the 16 x 16 piece at `p` of a row-major matrix with `pitch` elements a row.
__device__ __forceinline__ void load_a(unsigned* a, const bf16* p, long long pitch, int g, int t) {
  a[0] = ld32(p + g * pitch + 2 * t);
  a[1] = ld32(p + (g + 8) * pitch + 2 * t);
  a[2] = ld32(p + g * pitch + 8 + 2 * t);
  a[3] = ld32(p + (g + 8) * pitch + 8 + 2 * t);
}

// Two products of one n-tile over the 128 of k: c1 += a1 B1 and c2 += a2 B2, where a1 and a2
// are A fragments of 8 k steps and B1, B2 are stored transposed at `b1` and `b2` (8 n rows).
__device__ __forceinline__ void two_products(float* c1, const unsigned (*a1)[4], const bf16* b1,
                                             float* c2, const unsigned (*a2)[4], const bf16* b2,
                                             int lane) {
#pragma unroll
  for (int kk = 0; kk < 8; kk += 2) {
    unsigned x[4], y[4];
    smem_bt(x, b1 + kk * 16, lane);
    smem_bt(y, b2 + kk * 16, lane);
    mma(c1, a1[kk], x[0], x[1]);
    mma(c1, a1[kk + 1], x[2], x[3]);
    mma(c2, a2[kk], y[0], y[1]);
    mma(c2, a2[kk + 1], y[2], y[3]);
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Copies of 16 bytes from global to shared memory that run while the warps compute
// (cp.async); `full` false writes 16 zero bytes instead.
__device__ __forceinline__ void cp16(void* dst, const void* src, bool full) {
  unsigned at = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src),
               "r"(full ? 16 : 0));
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits for all but the latest group of copies (the one just started for the next tile).
__device__ __forceinline__ void cp_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Starts copying `kn` keys from `at` (elements, a key every `pitch`) into the shared tiles,
// zeros after; `ok` says which the block sees (`docs` null: all `kn`, else those of document
// `doc`), written at once.
__device__ void load_tile(bf16* ks, bf16* vs, unsigned char* ok, const bf16* k, const bf16* v,
                          long long at, long long pitch, int kn, const int* docs, int doc) {
  for (int i = threadIdx.x; i < KT * (D / 8); i += blockDim.x) {
    const int r = i >> 4, c = (i & 15) * 8;
    const bool in = r < kn;
    const long long from = at + (in ? r * pitch + c : 0);
    cp16(ks + r * SP + c, k + from, in);
    cp16(vs + r * SP + c, v + from, in);
  }
  for (int r = threadIdx.x; r < KT; r += blockDim.x)
    ok[r] = r < kn && (docs == 0 || docs[r] == doc);
}

// At most this many query heads a block: the forward and dq kernels' 128 threads, and the dk/dv
// kernel's 64 rows a set of shared tiles. The host reads this line at compile time (kChunk).
#define CHUNK 4

// A KV head's chunks, and its query heads a chunk: the group split as evenly as chunks of CHUNK
// at most allow (5 as 3 + 2, 9 as 3 + 3 + 3), so a last chunk has fewer spare warps than there
// are chunks.
__device__ __forceinline__ int chunks_of(int group) {
  return (group + CHUNK - 1) / CHUNK;
}
__device__ __forceinline__ int chunk_heads(int group) {
  return (group + chunks_of(group) - 1) / chunks_of(group);
}

// What a block's warps share: where its queries are, its span, and its tiles of keys. `head` is
// the warp's query head, `writes` false for a spare warp of a group's last chunk (it repeats the
// chunk's last head).
struct Block {
  int j, kvh, row, head, warp, g, t;
  bool writes;
  long long lq, lk, qpitch, kpitch;
  int start, end, doc, own, ctx_tiles, tiles;
};

__device__ Block block_of(const int* spans, int a, int s, int hq, int hkv) {
  Block b;
  const int group = hq / hkv, chunks = chunks_of(group);
  b.j = blockIdx.x;
  b.kvh = blockIdx.y / chunks;
  b.row = blockIdx.z;
  b.warp = threadIdx.x >> 5;
  b.g = (threadIdx.x & 31) >> 2;
  b.t = threadIdx.x & 3;
  const int in_group = (blockIdx.y % chunks) * chunk_heads(group) + b.warp;
  b.writes = in_group < group;
  b.head = b.kvh * group + min(in_group, group - 1);
  b.lq = 16LL * a;
  b.lk = s + b.lq;
  b.qpitch = (long long)hq * D;
  b.kpitch = (long long)hkv * D;
  const int* sp = spans + ((long long)b.row * a + b.j) * 4;
  b.start = sp[0];
  b.end = sp[1];
  b.doc = sp[2];
  b.own = sp[3];
  b.ctx_tiles = b.end > b.start ? (b.end - b.start + KT - 1) / KT : 0;
  b.tiles = b.ctx_tiles + (b.own ? 1 : 0);
  return b;
}

// The shared tiles of the forward and dq kernels: two sets of keys, values and visibility, one
// being computed on while the next tile's copies land in the other.
struct Tiles {
  unsigned char* smem;
  __device__ bf16* ks(int set) const { return reinterpret_cast<bf16*>(smem) + set * 2 * KT * SP; }
  __device__ bf16* vs(int set) const { return ks(set) + KT * SP; }
  __device__ unsigned char* ok(int set) const {
    return reinterpret_cast<unsigned char*>(reinterpret_cast<bf16*>(smem) + 4 * KT * SP) +
           set * KT;
  }
};

__device__ Tiles tiles_in(unsigned char* smem) {
  Tiles x;
  x.smem = smem;
  return x;
}

// Starts loading tile `it` of the block's keys (its context tiles, then its own keys) into set
// `it % 2` of the tiles; nothing past the last tile. Always commits a group of copies.
__device__ void start_tile(const Block& b, int it, const Tiles& x, const bf16* k, const bf16* v,
                           const int* docs, int s) {
  if (it < b.tiles) {
    const bool own = it == b.ctx_tiles;
    const int k0 = own ? s + 16 * b.j : b.start + it * KT;
    const int kn = own ? 16 : min(KT, b.end - k0);
    load_tile(x.ks(it & 1), x.vs(it & 1), x.ok(it & 1), k, v,
              (b.row * b.lk + k0) * b.kpitch + b.kvh * D, b.kpitch, kn,
              own ? 0 : docs + (long long)b.row * s + k0, b.doc);
  }
  cp_commit();
}

// Tile `it` ready in set `it % 2` (the next one's copies started behind it).
__device__ void next_tile(const Block& b, int it, const Tiles& x, const bf16* k, const bf16* v,
                          const int* docs, int s) {
  start_tile(b, it + 1, x, k, v, docs, s);
  cp_wait_one();
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(128) block_attention_fwd(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
    const int* __restrict__ spans, const int* __restrict__ docs, bf16* __restrict__ out,
    float* __restrict__ lse, int a, int s, int hq, int hkv, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem[];
  const Tiles x = tiles_in(smem);
  const Block b = block_of(spans, a, s, hq, hkv);
  const int g = b.g, t = b.t, lane = threadIdx.x & 31;
  start_tile(b, 0, x, k, v, docs, s);
  const bf16* qb = q + ((b.row * b.lq + 16LL * b.j) * hq + b.head) * D;
  unsigned qa[8][4];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) load_a(qa[kk], qb + 16 * kk, b.qpitch, g, t);
  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  for (int it = 0; it < b.tiles; ++it) {
    next_tile(b, it, x, k, v, docs, s);
    const bf16 *ks = x.ks(it & 1), *vs = x.vs(it & 1);
    const unsigned char* ok = x.ok(it & 1);
    const bool own = it == b.ctx_tiles;
    const int nts = own ? 2 : 8;
    float sc[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
      if (nt < nts) {
#pragma unroll
        for (int kk = 0; kk < 8; kk += 2) {
          unsigned kb[4];
          smem_bt(kb, ks + nt * 8 * SP + kk * 16, lane);
          mma(sc[nt], qa[kk], kb[0], kb[1]);
          mma(sc[nt], qa[kk + 1], kb[2], kb[3]);
        }
      }
    }
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool seen = ok[nt * 8 + 2 * t + e];
        sc[nt][e] = seen ? sc[nt][e] * scale_log2 : -INFINITY;
        sc[nt][2 + e] = seen ? sc[nt][2 + e] * scale_log2 : -INFINITY;
        mx0 = fmaxf(mx0, sc[nt][e]);
        mx1 = fmaxf(mx1, sc[nt][2 + e]);
      }
    }
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    const float base0 = mx0 == -INFINITY ? 0.f : mx0, base1 = mx1 == -INFINITY ? 0.f : mx1;
    const float al0 = ex2(m0 - base0), al1 = ex2(m1 - base1);
    float r0 = 0.f, r1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sc[nt][e] = ex2(sc[nt][e] - base0);
        sc[nt][2 + e] = ex2(sc[nt][2 + e] - base1);
        r0 += sc[nt][e];
        r1 += sc[nt][2 + e];
      }
    }
    l0 = l0 * al0 + r0;
    l1 = l1 * al1 + r1;
    m0 = mx0;
    m1 = mx1;
#pragma unroll
    for (int dt = 0; dt < 16; ++dt) {
      o[dt][0] *= al0;
      o[dt][1] *= al0;
      o[dt][2] *= al1;
      o[dt][3] *= al1;
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (kk * 2 >= nts) continue;
      const unsigned pa[4] = {pack(sc[2 * kk][0], sc[2 * kk][1]), pack(sc[2 * kk][2], sc[2 * kk][3]),
                              pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < 16; dt += 2) {
        unsigned vb[4];
        smem_b(vb, vs + 16 * kk * SP + 8 * dt, lane);
        mma(o[dt], pa, vb[0], vb[1]);
        mma(o[dt + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();
  }
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  if (!b.writes) return;
  bf16* ob = out + ((b.row * b.lq + 16LL * b.j) * hq + b.head) * D;
#pragma unroll
  for (int dt = 0; dt < 16; ++dt) {
    *reinterpret_cast<unsigned*>(ob + g * b.qpitch + 8 * dt + 2 * t) =
        pack(o[dt][0] * inv0, o[dt][1] * inv0);
    *reinterpret_cast<unsigned*>(ob + (g + 8) * b.qpitch + 8 * dt + 2 * t) =
        pack(o[dt][2] * inv1, o[dt][3] * inv1);
  }
  if (t == 0) {
    float* lb = lse + (b.row * b.lq + 16LL * b.j) * hq + b.head;
    lb[g * hq] = l0 > 0.f ? m0 + log2f(l0) : INFINITY;
    lb[(g + 8) * hq] = l1 > 0.f ? m1 + log2f(l1) : INFINITY;
  }
}

// dq = scale * dS K over the block's tiles, dS = P (dP - delta), dP = dO V^T, P from the
// forward's log-sum-exp (log2 units of the scaled scores; +inf for a row that saw nothing).
extern "C" __global__ void __launch_bounds__(128) block_attention_dq(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
    const bf16* __restrict__ dout, const float* __restrict__ lse,
    const float* __restrict__ delta, const int* __restrict__ spans, const int* __restrict__ docs,
    bf16* __restrict__ dq, int a, int s, int hq, int hkv, float scale_log2, float scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  const Tiles x = tiles_in(smem);
  const Block b = block_of(spans, a, s, hq, hkv);
  const int g = b.g, t = b.t, lane = threadIdx.x & 31;
  start_tile(b, 0, x, k, v, docs, s);
  const long long q0 = (b.row * b.lq + 16LL * b.j) * hq + b.head;
  unsigned qa[8][4], da[8][4];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    load_a(qa[kk], q + q0 * D + 16 * kk, b.qpitch, g, t);
    load_a(da[kk], dout + q0 * D + 16 * kk, b.qpitch, g, t);
  }
  const float L0 = lse[q0 + g * hq], L1 = lse[q0 + (g + 8) * hq];
  const float D0 = delta[q0 + g * hq], D1 = delta[q0 + (g + 8) * hq];
  float acc[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  for (int it = 0; it < b.tiles; ++it) {
    next_tile(b, it, x, k, v, docs, s);
    const bf16 *ks = x.ks(it & 1), *vs = x.vs(it & 1);
    const unsigned char* ok = x.ok(it & 1);
    const bool own = it == b.ctx_tiles;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (own && half == 1) continue;
      float sc[4][4], dp[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
        dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.f;
        if (own && n >= 2) continue;
        const int nt = half * 4 + n;
        two_products(sc[n], qa, ks + nt * 8 * SP, dp[n], da, vs + nt * 8 * SP, lane);
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool seen = ok[(half * 4 + n) * 8 + 2 * t + e];
          const float p0 = seen ? ex2(sc[n][e] * scale_log2 - L0) : 0.f;
          const float p1 = seen ? ex2(sc[n][2 + e] * scale_log2 - L1) : 0.f;
          sc[n][e] = p0 * (dp[n][e] - D0);
          sc[n][2 + e] = p1 * (dp[n][2 + e] - D1);
        }
      }
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        if (own && kk == 1) continue;
        const unsigned pa[4] = {pack(sc[2 * kk][0], sc[2 * kk][1]),
                                pack(sc[2 * kk][2], sc[2 * kk][3]),
                                pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int dt = 0; dt < 16; dt += 2) {
          unsigned kb[4];
          smem_b(kb, ks + (half * 32 + 16 * kk) * SP + 8 * dt, lane);
          mma(acc[dt], pa, kb[0], kb[1]);
          mma(acc[dt + 1], pa, kb[2], kb[3]);
        }
      }
    }
    __syncthreads();
  }
  if (!b.writes) return;
  bf16* ob = dq + q0 * D;
#pragma unroll
  for (int dt = 0; dt < 16; ++dt) {
    *reinterpret_cast<unsigned*>(ob + g * b.qpitch + 8 * dt + 2 * t) =
        pack(acc[dt][0] * scale, acc[dt][1] * scale);
    *reinterpret_cast<unsigned*>(ob + (g + 8) * b.qpitch + 8 * dt + 2 * t) =
        pack(acc[dt][2] * scale, acc[dt][3] * scale);
  }
}

// dk = scale * dS^T Q and dv = P^T dO for a tile of 64 keys (a warp's 16 each), over every block
// that sees one of them: blocks whose span meets the tile (context keys), or the tile's own
// blocks (block keys). Every key of k and v gets its gradient written, zero where none sees it.
extern "C" __global__ void __launch_bounds__(128) block_attention_dkdv(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
    const bf16* __restrict__ dout, const float* __restrict__ lse,
    const float* __restrict__ delta, const int* __restrict__ spans, const int* __restrict__ docs,
    bf16* __restrict__ dk, bf16* __restrict__ dv, int a, int s, int hq, int hkv,
    float scale_log2, float scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + KT * SP;
  // Two sets of a block's rows of a chunk of heads (q, dO, their log-sum-exp and delta) and of
  // the tile keys' visibility to it: one computed on while the next chunk's or seeing block's
  // copies land in the other.
  bf16* rows_at = vs + KT * SP;
  auto qs_of = [&](int set) { return rows_at + set * 2 * 64 * SP; };
  auto dos_of = [&](int set) { return qs_of(set) + 64 * SP; };
  float* stats = reinterpret_cast<float*>(rows_at + 4 * 64 * SP);
  auto ls_of = [&](int set) { return stats + set * 128; };
  auto ds_of = [&](int set) { return stats + set * 128 + 64; };
  auto ok_of = [&](int set) { return reinterpret_cast<unsigned char*>(stats + 256) + set * KT; };
  const int tile = blockIdx.x, kvh = blockIdx.y, row = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int group = hq / hkv, per = chunk_heads(group), chunks = chunks_of(group);
  const long long lq = 16LL * a, lk = s + lq, kpitch = (long long)hkv * D;
  const int ctx_tiles = (s + KT - 1) / KT;
  const bool block_keys = tile >= ctx_tiles;
  const int k0 = block_keys ? s + (tile - ctx_tiles) * KT : tile * KT;
  const int kn = block_keys ? (int)min((long long)KT, lk - k0) : min(KT, s - k0);
  const int* spans_row = spans + (long long)row * a * 4;
  const int* docs_row = docs + (long long)row * s;
  load_tile(ks, vs, ok_of(1), k, v, (row * lk + k0) * kpitch + kvh * D, kpitch, kn, 0, 0);
  cp_commit();
  const int jlo = block_keys ? (k0 - s) / 16 : 0;
  const int jhi = block_keys ? min(a, (k0 - s + kn) / 16) : a;
  // The first block from `jj` on that sees a key of the tile (its own keys for block keys, its
  // span meeting the tile for context keys); jhi where none does.
  auto next_seeing = [&](int jj) {
    for (; jj < jhi; ++jj) {
      const int* sp = spans_row + jj * 4;
      if (block_keys ? sp[3] != 0 : (sp[1] > sp[0] && sp[0] < k0 + kn && sp[1] > k0)) break;
    }
    return jj;
  };
  // Starts loading the rows of chunk `ch` of block jj's query heads into `set` (nothing past
  // jhi); always commits a group.
  auto start_rows = [&](int jj, int ch, int set) {
    if (jj < jhi) {
      const int* sp = spans_row + jj * 4;
      const int st = sp[0], en = sp[1], dc = sp[2];
      unsigned char* ok = ok_of(set);
      for (int r = threadIdx.x; r < KT; r += blockDim.x) {
        const int key = k0 + r;
        ok[r] = r < kn && (block_keys ? (key >= s + 16 * jj && key < s + 16 * jj + 16)
                                      : (key >= st && key < en && docs_row[key] == dc));
      }
      bf16 *qs = qs_of(set), *dos = dos_of(set);
      const int h0 = kvh * group + ch * per, rows = 16 * min(per, group - ch * per);
      for (int i = threadIdx.x; i < rows * (D / 8); i += blockDim.x) {
        const int r = i >> 4, c = (i & 15) * 8;
        const long long at = ((row * lq + 16LL * jj + (r & 15)) * hq + h0 + (r >> 4)) * D + c;
        cp16(qs + r * SP + c, q + at, true);
        cp16(dos + r * SP + c, dout + at, true);
      }
      float *ls = ls_of(set), *ds = ds_of(set);
      for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const long long at = (row * lq + 16LL * jj + (r & 15)) * hq + h0 + (r >> 4);
        ls[r] = lse[at];
        ds[r] = delta[at];
      }
    }
    cp_commit();
  };
  int jj = next_seeing(jlo), ch = 0;
  start_rows(jj, 0, 0);
  cp_wait_all();
  __syncthreads();
  // The warp's 16 keys and values as A fragments, for every block.
  unsigned ka[8][4], va[8][4];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    smem_a(ka[kk], ks + 16 * warp * SP + 16 * kk, lane);
    smem_a(va[kk], vs + 16 * warp * SP + 16 * kk, lane);
  }
  float dka[16][4], dva[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    dka[i][0] = dka[i][1] = dka[i][2] = dka[i][3] = 0.f;
    dva[i][0] = dva[i][1] = dva[i][2] = dva[i][3] = 0.f;
  }
  for (int set = 0; jj < jhi; set ^= 1) {
    // Next: this block's next chunk of heads, else the next seeing block's first.
    const int cn = ch + 1 < chunks ? ch + 1 : 0;
    const int jn = cn ? jj : next_seeing(jj + 1);
    start_rows(jn, cn, set ^ 1);
    cp_wait_one();
    __syncthreads();
    const bf16 *qs = qs_of(set), *dos = dos_of(set);
    const float *Ls = ls_of(set), *Ds = ds_of(set);
    const unsigned char* ok = ok_of(set);
    const bool seen0 = ok[16 * warp + g], seen1 = ok[16 * warp + g + 8];
    const bool warp_sees = __any_sync(0xffffffffu, seen0 || seen1);
    const int heads = min(per, group - ch * per);
    for (int hh = 0; hh < (warp_sees ? heads : 0); ++hh) {
      const bf16* qh = qs + hh * 16 * SP;
      const bf16* dh = dos + hh * 16 * SP;
      float st_[2][4], dpt[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        st_[n][0] = st_[n][1] = st_[n][2] = st_[n][3] = 0.f;
        dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.f;
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
        two_products(st_[n], ka, qh + 8 * n * SP, dpt[n], va, dh + 8 * n * SP, lane);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = hh * 16 + 8 * n + 2 * t + e;
          const float L = Ls[r], Dr = Ds[r];
          const float pa = seen0 ? ex2(st_[n][e] * scale_log2 - L) : 0.f;
          const float pb = seen1 ? ex2(st_[n][2 + e] * scale_log2 - L) : 0.f;
          st_[n][e] = pa;
          st_[n][2 + e] = pb;
          dpt[n][e] = pa * (dpt[n][e] - Dr);
          dpt[n][2 + e] = pb * (dpt[n][2 + e] - Dr);
        }
      }
      const unsigned pa[4] = {pack(st_[0][0], st_[0][1]), pack(st_[0][2], st_[0][3]),
                              pack(st_[1][0], st_[1][1]), pack(st_[1][2], st_[1][3])};
      const unsigned sa[4] = {pack(dpt[0][0], dpt[0][1]), pack(dpt[0][2], dpt[0][3]),
                              pack(dpt[1][0], dpt[1][1]), pack(dpt[1][2], dpt[1][3])};
#pragma unroll
      for (int dt = 0; dt < 16; dt += 2) {
        unsigned db[4], qb[4];
        smem_b(db, dh + 8 * dt, lane);
        smem_b(qb, qh + 8 * dt, lane);
        mma(dva[dt], pa, db[0], db[1]);
        mma(dva[dt + 1], pa, db[2], db[3]);
        mma(dka[dt], sa, qb[0], qb[1]);
        mma(dka[dt + 1], sa, qb[2], qb[3]);
      }
    }
    __syncthreads();
    jj = jn;
    ch = cn;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = 16 * warp + g + 8 * half;
    if (key >= kn) continue;
    const long long at = ((row * lk + k0 + key) * hkv + kvh) * D;
#pragma unroll
    for (int dt = 0; dt < 16; ++dt) {
      *reinterpret_cast<unsigned*>(dk + at + 8 * dt + 2 * t) =
          pack(dka[dt][2 * half] * scale, dka[dt][2 * half + 1] * scale);
      *reinterpret_cast<unsigned*>(dv + at + 8 * dt + 2 * t) =
          pack(dva[dt][2 * half], dva[dt][2 * half + 1]);
    }
  }
}

// delta [rows] = each (query, head) row's sum over its 128 of dO * O in f32, for the backward
// kernels (one pass over both; a warp a row, 4 elements a lane).
extern "C" __global__ void block_attention_delta(const bf16* dout, const bf16* out, float* delta,
                                                 long long rows) {
  long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  uint2 dv = *reinterpret_cast<const uint2*>(dout + row * D + lane * 4);
  uint2 ov = *reinterpret_cast<const uint2*>(out + row * D + lane * 4);
  const bf16* ds = reinterpret_cast<const bf16*>(&dv);
  const bf16* os = reinterpret_cast<const bf16*>(&ov);
  float sum = 0.f;
  for (int i = 0; i < 4; ++i) sum += up(ds[i]) * up(os[i]);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) delta[row] = sum;
}
)";

const dflash::rtc::Program kProgram{"attention_kernels.cu", kSource};

// The single-digit value of `#define NAME d` in a kernel source, read at compile time; 0 where
// there is none.
constexpr int defined_digit(const char* source, const char* name) {
  for (const char* at = source; *at; ++at) {
    const char* d = "#define ";
    const char* p = at;
    while (*d && *p == *d) ++d, ++p;
    if (*d) continue;
    const char* n = name;
    while (*n && *p == *n) ++n, ++p;
    if (!*n && *p == ' ' && p[1] >= '1' && p[1] <= '9' && (p[2] == '\n' || p[2] == ' '))
      return p[1] - '0';
  }
  return 0;
}

// Query heads a block at most: the kernels' CHUNK.
constexpr int kChunk = defined_digit(kSource, "CHUNK");
static_assert(kChunk > 0, "the kernel source defines CHUNK as one digit");

constexpr int kTile = 64;
constexpr int kPitch = 136;
// The forward and dq kernels' shared memory: two sets of key and value tiles and the keys'
// visibility.
constexpr unsigned kBlockShared = 4 * kTile * kPitch * 2 + 2 * kTile;
// The dk/dv kernel's: the key and value tiles, then two sets of a block's q and dO rows (64 at
// most), their log-sum-exp and delta, and the keys' visibility.
constexpr unsigned kDkdvShared = 2 * kTile * kPitch * 2 + 2 * (2 * 64 * kPitch * 2 + 2 * 64 * 4 + kTile);

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The shapes every kernel takes: a, s, hq, hkv.
struct Dims {
  int a, s, hq, hkv;
};

Dims check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& spans, const at::Tensor& docs) {
  TORCH_CHECK(q.is_cuda() && q.scalar_type() == at::kBFloat16 && q.dim() == 4 &&
                  q.size(3) == 128 && q.is_contiguous(),
              "block attention: q bf16 [b, 16a, hq, 128], contiguous, on a GPU");
  TORCH_CHECK(q.size(1) % 16 == 0, "block attention: 16 queries a block");
  for (const at::Tensor* t : {&k, &v}) {
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kBFloat16 && t->dim() == 4 &&
                    t->size(0) == q.size(0) && t->size(1) > q.size(1) && t->size(3) == 128 &&
                    t->is_contiguous() && t->get_device() == q.get_device(),
                "block attention: k and v bf16 [b, s + 16a, hkv, 128], contiguous, on q's GPU");
  }
  TORCH_CHECK(k.sizes() == v.sizes(), "block attention: k and v of one shape");
  Dims d{static_cast<int>(q.size(1) / 16), static_cast<int>(k.size(1) - q.size(1)),
         static_cast<int>(q.size(2)), static_cast<int>(k.size(2))};
  TORCH_CHECK(d.hkv > 0 && d.hq % d.hkv == 0,
              "block attention: query heads a whole multiple of the KV heads");
  TORCH_CHECK(spans.is_cuda() && spans.scalar_type() == at::kInt && spans.is_contiguous() &&
                  spans.dim() == 3 && spans.size(0) == q.size(0) && spans.size(1) == d.a &&
                  spans.size(2) == 4,
              "block attention: spans int32 [b, a, 4], contiguous, on a GPU");
  TORCH_CHECK(docs.is_cuda() && docs.scalar_type() == at::kInt && docs.is_contiguous() &&
                  docs.dim() == 2 && docs.size(0) == q.size(0) && docs.size(1) == d.s,
              "block attention: docs int32 [b, s], contiguous, on a GPU");
  return d;
}

constexpr float kLog2e = 1.4426950408889634f;

// The forward and dq kernels' grid over `rows` rows: a block of 16 queries by a KV head's chunk
// of query heads (CHUNK in the kernels: four at most, a warp each) by a row.
dflash::rtc::Shape query_grid(const Dims& d, unsigned rows) {
  static_assert(kChunk * 16 <= kTile, "the dk/dv kernel's shared sets hold 64 rows");
  const int group = d.hq / d.hkv;
  const int chunks = (group + kChunk - 1) / kChunk, per = (group + chunks - 1) / chunks;
  return dflash::rtc::Shape{static_cast<unsigned>(d.a), static_cast<unsigned>(d.hkv * chunks),
                            rows, static_cast<unsigned>(32 * per), kBlockShared};
}

struct BlockAttention : public torch::autograd::Function<BlockAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& spans, const at::Tensor& docs) {
    Dims d = check_inputs(q, k, v, spans, docs);
    auto out = at::empty_like(q);
    auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    float scale_log2 = kLog2e / std::sqrt(128.f);
    const void *qp = q.data_ptr(), *kp = k.data_ptr(), *vp = v.data_ptr(),
               *sp = spans.data_ptr(), *dp = docs.data_ptr();
    void *op = out.data_ptr(), *lp = lse.data_ptr();
    void* args[] = {&qp, &kp, &vp, &sp, &dp, &op, &lp, &d.a, &d.s, &d.hq, &d.hkv, &scale_log2};
    auto grid = query_grid(d, static_cast<unsigned>(q.size(0)));
    if (q.numel() > 0) {
      // The backward's kernels compiled now: a failure then shows here, where the caller can
      // take another path, not inside backward.
      for (const char* name : {"block_attention_delta", "block_attention_dq",
                               "block_attention_dkdv"})
        dflash::rtc::kernel_for(kProgram, q.get_device(), name);
      dflash::rtc::launch_shaped(kProgram, q.get_device(), "block_attention_fwd", grid, args);
    }
    ctx->save_for_backward({q, k, v, out, lse, spans, docs});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3],
                     &lse = saved[4], &spans = saved[5], &docs = saved[6];
    Dims d = check_inputs(q, k, v, spans, docs);
    at::Tensor dout = grads[0].to(at::kBFloat16).contiguous();
    at::Tensor delta = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    auto dq = at::empty_like(q);
    auto dk = at::empty_like(k);
    auto dv = at::empty_like(v);
    float scale = 1.f / std::sqrt(128.f);
    float scale_log2 = kLog2e * scale;
    const void *qp = q.data_ptr(), *kp = k.data_ptr(), *vp = v.data_ptr(),
               *gp = dout.data_ptr(), *lp = lse.data_ptr(), *ep = delta.data_ptr(),
               *sp = spans.data_ptr(), *dp = docs.data_ptr();
    void *dqp = dq.data_ptr(), *dkp = dk.data_ptr(), *dvp = dv.data_ptr();
    const unsigned rows = static_cast<unsigned>(q.size(0));
    if (q.numel() > 0) {
      long long rows_of_128 = q.numel() / 128;
      const void* op = out.data_ptr();
      void* dp_out = delta.data_ptr();
      void* delta_args[] = {&gp, &op, &dp_out, &rows_of_128};
      // The delta kernel reads 8 bytes at a time; a gradient that is a view at an odd offset
      // takes the ops.
      if (reinterpret_cast<uintptr_t>(gp) % 8 == 0)
        dflash::rtc::launch(kProgram, q.get_device(), "block_attention_delta", rows_of_128 * 32,
                            delta_args);
      else
        delta.copy_((dout.to(at::kFloat) * out.to(at::kFloat)).sum(-1));
      void* dq_args[] = {&qp, &kp, &vp, &gp, &lp, &ep, &sp, &dp, &dqp,
                         &d.a, &d.s, &d.hq, &d.hkv, &scale_log2, &scale};
      dflash::rtc::launch_shaped(kProgram, q.get_device(), "block_attention_dq",
                                 query_grid(d, rows), dq_args);
      void* kv_args[] = {&qp, &kp, &vp, &gp, &lp, &ep, &sp, &dp, &dkp, &dvp,
                         &d.a, &d.s, &d.hq, &d.hkv, &scale_log2, &scale};
      unsigned key_tiles = static_cast<unsigned>((d.s + kTile - 1) / kTile +
                                                 (16 * d.a + kTile - 1) / kTile);
      dflash::rtc::launch_shaped(
          kProgram, q.get_device(), "block_attention_dkdv",
          dflash::rtc::Shape{key_tiles, static_cast<unsigned>(d.hkv), rows, 128, kDkdvShared},
          kv_args);
    }
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

const at::Tensor& tensor(void* p) { return *static_cast<at::Tensor*>(p); }

}  // namespace

extern "C" {

// The block attention of q over k and v (see the top of this file): a new tensor in `out`,
// differentiable in q, k and v.
int dflash_block_attention(void* q, void* k, void* v, void* spans, void* docs, void** out) {
  return dflash::guarded([&] {
    *out = new at::Tensor(
        BlockAttention::apply(tensor(q), tensor(k), tensor(v), tensor(spans), tensor(docs)));
  });
}
}
