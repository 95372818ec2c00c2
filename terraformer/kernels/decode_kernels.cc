// Fused CPU kernels for the batch-1 decoding step, called from jitted JAX
// code through XLA's FFI (jax.ffi.ffi_call).
//
//   tf_skinny_matmul:  y[t, s*N + n] = sum_k x[t,k] g[s,k] c[k] W[k,n] (+ b)
//     A few rows times a wide matrix: the multiplicative dense layer of
//     sparse QKV and of the sparse loss (paper §3.2, §3.3; S = rows of g) and
//     a plain dense layer (g = ones [1, K]). W is float32, bfloat16 or int8;
//     c holds int8's per-row scales (ones otherwise).
//   tf_sparse_ff:      the whole sparse FF block of one or a few tokens
//     (paper §3.1): controller (x C1) C2 + c, first argmax per block of N,
//     then only the selected rows of W1ᵀ and W2: y = b2 + sum_blocks
//     s2 relu(s1 <W1ᵀ[row], x>) W2[row].
//   tf_q8_matmul:      the same product as tf_skinny_matmul (without c) on
//     int8 weights repacked output-major AND int8 activations (quantized
//     once per call, per block of 32 inputs, like llama.cpp's Q8_0):
//     integer dot products (vpdpbusd, or maddubs + madd), the sums of 16
//     outputs held in registers for the whole K loop. See "The Q8 GEMV".
//   tf_cache_attention: causal softmax attention of the step's queries over
//     a key/value cache read in place, only its filled positions (no copy
//     of a cache bucket, as slicing the cache for XLA's dots makes).
//   tf_sparse_qkv:     sparse QKV's 'q8' step (paper §3.2): the
//     multiplicative layer and the Q/K and V convolutions in one call.
//   tf_sparse_qkv_attention: that step, the keys and values written into
//     their caches in place and the attention over them, in one call.
//   tf_terraformer_block: a whole Terraformer decoder block's step (both
//     sparse QKV attentions, the sparse FF block, the low-rank SRU path and
//     the reversible half-residual sums) in one call.
// tf_sparse_ff and tf_sparse_qkv_attention can first apply the LayerNorm
// that precedes them in a block (NormRows).
//
// Vectorized with AVX-512 (F/BW/VL) or AVX2+FMA, chosen at run time with
// __builtin_cpu_supports; plain loops otherwise (tf_q8_matmul: AVX-512
// VNNI, AVX2 or plain loops, chosen separately). Each function compiles
// with its own target attribute, so one library runs on every x86-64.
// Large products are split over XLA's intra-op thread pool (chunks taken
// from an atomic counter, so the call never waits for a task that has not
// started).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#define TF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TF_AVX2 __attribute__((target("avx2,fma")))

// ---------------------------------------------------------------------------
// Scalar loads of one weight as float.

inline float to_f32(float v) { return v; }
inline float to_f32(int8_t v) { return static_cast<float>(v); }
inline float to_f32(uint16_t v) {  // bfloat16: the high half of a float32.
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---------------------------------------------------------------------------
// 16-lane (AVX-512) loads of weights as float; `m` masks the tail.

TF_AVX512 inline __m512 load16(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
TF_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 m) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
TF_AVX512 inline __m512 load16(const int8_t* p, __mmask16 m) {
  __m128i q = _mm_maskz_loadu_epi8(m, p);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
}

// 8-lane (AVX2) loads, full vectors only.
TF_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
TF_AVX2 inline __m256 load8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
TF_AVX2 inline __m256 load8(const int8_t* p) {
  __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
}

// The instruction sets the kernels use, as this CPU has them.
struct CpuFeatures {
  bool avx2, avx512, avx512_vnni;
};

CpuFeatures ProbeCpu() {
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  const bool avx512 = fma && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  return {fma && __builtin_cpu_supports("avx2"), avx512,
          avx512 && __builtin_cpu_supports("avx512vnni")};
}

enum class Isa { kScalar, kAvx2, kAvx512 };

Isa DetectIsa() {
  const CpuFeatures cpu = ProbeCpu();
  return cpu.avx512 ? Isa::kAvx512 : cpu.avx2 ? Isa::kAvx2 : Isa::kScalar;
}

// Set by tf_set_isa (tests force the fallbacks); starts at the best one.
std::atomic<int> g_isa{static_cast<int>(DetectIsa())};

Isa CurrentIsa() { return static_cast<Isa>(g_isa.load()); }

// ---------------------------------------------------------------------------
// y[r, n] = sum_k xs[r, k] W[k, n] for n in [n0, n1); y rows of stride ldy.
// W [K, N] row-major. Columns go in panels of kPanel floats: 4 rows of W
// at a time stream through a panel (long contiguous reads the hardware
// prefetcher follows), while the R output rows of the panel stay in cache.

constexpr int64_t kPanel = 4096;

template <typename W>
void PanelScalar(const float* xs, int64_t R, int64_t K, const W* w, int64_t N,
                 float* y, int64_t ldy, int64_t n0, int64_t n1) {
  for (int64_t r = 0; r < R; ++r) std::fill(y + r * ldy + n0, y + r * ldy + n1, 0.f);
  for (int64_t k = 0; k < K; ++k) {
    const W* wk = w + k * N;
    for (int64_t r = 0; r < R; ++r) {
      float a = xs[r * K + k];
      float* yr = y + r * ldy;
      for (int64_t n = n0; n < n1; ++n) yr[n] += a * to_f32(wk[n]);
    }
  }
}

template <typename W>
TF_AVX512 void PanelAvx512(const float* xs, int64_t R, int64_t K, const W* w,
                           int64_t N, float* y, int64_t ldy, int64_t n0,
                           int64_t n1) {
  for (int64_t r = 0; r < R; ++r) std::fill(y + r * ldy + n0, y + r * ldy + n1, 0.f);
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const W* w0 = w + k * N;
    const W* w1 = w0 + N;
    const W* w2 = w1 + N;
    const W* w3 = w2 + N;
    for (int64_t n = n0; n < n1; n += 16) {
      __mmask16 m = n + 16 <= n1 ? 0xFFFF : (__mmask16)((1u << (n1 - n)) - 1);
      __m512 a0 = load16(w0 + n, m), a1 = load16(w1 + n, m);
      __m512 a2 = load16(w2 + n, m), a3 = load16(w3 + n, m);
      for (int64_t r = 0; r < R; ++r) {
        const float* x = xs + r * K + k;
        float* yr = y + r * ldy + n;
        __m512 acc = _mm512_maskz_loadu_ps(m, yr);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(x[0]), a0, acc);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(x[1]), a1, acc);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(x[2]), a2, acc);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(x[3]), a3, acc);
        _mm512_mask_storeu_ps(yr, m, acc);
      }
    }
  }
  for (; k < K; ++k) {
    const W* wk = w + k * N;
    for (int64_t n = n0; n < n1; n += 16) {
      __mmask16 m = n + 16 <= n1 ? 0xFFFF : (__mmask16)((1u << (n1 - n)) - 1);
      __m512 a = load16(wk + n, m);
      for (int64_t r = 0; r < R; ++r) {
        float* yr = y + r * ldy + n;
        __m512 acc = _mm512_maskz_loadu_ps(m, yr);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(xs[r * K + k]), a, acc);
        _mm512_mask_storeu_ps(yr, m, acc);
      }
    }
  }
}

template <typename W>
TF_AVX2 void PanelAvx2(const float* xs, int64_t R, int64_t K, const W* w,
                       int64_t N, float* y, int64_t ldy, int64_t n0,
                       int64_t n1) {
  const int64_t n_vec = n0 + (n1 - n0) / 8 * 8;
  for (int64_t r = 0; r < R; ++r) std::fill(y + r * ldy + n0, y + r * ldy + n1, 0.f);
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const W* w0 = w + k * N;
    const W* w1 = w0 + N;
    const W* w2 = w1 + N;
    const W* w3 = w2 + N;
    for (int64_t n = n0; n < n_vec; n += 8) {
      __m256 a0 = load8(w0 + n), a1 = load8(w1 + n);
      __m256 a2 = load8(w2 + n), a3 = load8(w3 + n);
      for (int64_t r = 0; r < R; ++r) {
        const float* x = xs + r * K + k;
        float* yr = y + r * ldy + n;
        __m256 acc = _mm256_loadu_ps(yr);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[0]), a0, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[1]), a1, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[2]), a2, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[3]), a3, acc);
        _mm256_storeu_ps(yr, acc);
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* x = xs + r * K + k;
      float* yr = y + r * ldy;
      for (int64_t n = n_vec; n < n1; ++n) {
        yr[n] += x[0] * to_f32(w0[n]) + x[1] * to_f32(w1[n]) +
                 x[2] * to_f32(w2[n]) + x[3] * to_f32(w3[n]);
      }
    }
  }
  for (; k < K; ++k) {
    const W* wk = w + k * N;
    for (int64_t n = n0; n < n_vec; n += 8) {
      __m256 a = load8(wk + n);
      for (int64_t r = 0; r < R; ++r) {
        float* yr = y + r * ldy + n;
        __m256 acc = _mm256_loadu_ps(yr);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(xs[r * K + k]), a, acc);
        _mm256_storeu_ps(yr, acc);
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      float a = xs[r * K + k];
      float* yr = y + r * ldy;
      for (int64_t n = n_vec; n < n1; ++n) yr[n] += a * to_f32(wk[n]);
    }
  }
}

// Many rows (the multiplicative dense layer of sparse QKV: S rows of x g c,
// y [S, N] with N = d / S small): d x d multiply-adds over a W that fits in
// cache, so arithmetic, not bytes, sets the time. Register-blocked: 4 rows x
// 16 columns of y stay in 8 registers through a tile of kTileK rows of W
// (loaded and converted once per 4 rows), tiles reused from cache by every
// row block. Rows [r0, r1) of y, all N columns; sums run over k in order.
constexpr int64_t kTileK = 256;

template <typename W>
TF_AVX2 void RowsAvx2(const float* xs, int64_t K, const W* w, int64_t N,
                      float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t n16 = N / 16 * 16, n8 = N / 8 * 8;
  for (int64_t r = r0; r < r1; ++r) std::fill(y + r * ldy, y + r * ldy + N, 0.f);
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    const int64_t k1 = std::min(K, k0 + kTileK);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
      const float* x0 = xs + r * K;
      const float* x1 = x0 + K;
      const float* x2 = x1 + K;
      const float* x3 = x2 + K;
      float* y0 = y + r * ldy;
      float* y1 = y0 + ldy;
      float* y2 = y1 + ldy;
      float* y3 = y2 + ldy;
      for (int64_t n = 0; n < n16; n += 16) {
        __m256 c0a = _mm256_loadu_ps(y0 + n), c0b = _mm256_loadu_ps(y0 + n + 8);
        __m256 c1a = _mm256_loadu_ps(y1 + n), c1b = _mm256_loadu_ps(y1 + n + 8);
        __m256 c2a = _mm256_loadu_ps(y2 + n), c2b = _mm256_loadu_ps(y2 + n + 8);
        __m256 c3a = _mm256_loadu_ps(y3 + n), c3b = _mm256_loadu_ps(y3 + n + 8);
        for (int64_t k = k0; k < k1; ++k) {
          const W* wk = w + k * N + n;
          __m256 a = load8(wk), b = load8(wk + 8), v;
          v = _mm256_broadcast_ss(x0 + k);
          c0a = _mm256_fmadd_ps(v, a, c0a); c0b = _mm256_fmadd_ps(v, b, c0b);
          v = _mm256_broadcast_ss(x1 + k);
          c1a = _mm256_fmadd_ps(v, a, c1a); c1b = _mm256_fmadd_ps(v, b, c1b);
          v = _mm256_broadcast_ss(x2 + k);
          c2a = _mm256_fmadd_ps(v, a, c2a); c2b = _mm256_fmadd_ps(v, b, c2b);
          v = _mm256_broadcast_ss(x3 + k);
          c3a = _mm256_fmadd_ps(v, a, c3a); c3b = _mm256_fmadd_ps(v, b, c3b);
        }
        _mm256_storeu_ps(y0 + n, c0a); _mm256_storeu_ps(y0 + n + 8, c0b);
        _mm256_storeu_ps(y1 + n, c1a); _mm256_storeu_ps(y1 + n + 8, c1b);
        _mm256_storeu_ps(y2 + n, c2a); _mm256_storeu_ps(y2 + n + 8, c2b);
        _mm256_storeu_ps(y3 + n, c3a); _mm256_storeu_ps(y3 + n + 8, c3b);
      }
      for (int64_t n = n16; n < n8; n += 8) {
        __m256 c0 = _mm256_loadu_ps(y0 + n), c1 = _mm256_loadu_ps(y1 + n);
        __m256 c2 = _mm256_loadu_ps(y2 + n), c3 = _mm256_loadu_ps(y3 + n);
        for (int64_t k = k0; k < k1; ++k) {
          __m256 a = load8(w + k * N + n);
          c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + k), a, c0);
          c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + k), a, c1);
          c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(x2 + k), a, c2);
          c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(x3 + k), a, c3);
        }
        _mm256_storeu_ps(y0 + n, c0); _mm256_storeu_ps(y1 + n, c1);
        _mm256_storeu_ps(y2 + n, c2); _mm256_storeu_ps(y3 + n, c3);
      }
    }
    // Tail rows (all columns) and tail columns (all rows): plain loops.
    for (int64_t rr = r0; rr < r1; ++rr) {
      const int64_t first = rr < r ? n8 : 0;
      const float* x = xs + rr * K;
      float* yr = y + rr * ldy;
      for (int64_t k = k0; k < k1; ++k) {
        const W* wk = w + k * N;
        for (int64_t n = first; n < N; ++n) yr[n] += x[k] * to_f32(wk[n]);
      }
    }
  }
}

template <typename W>
void Panel(Isa isa, const float* xs, int64_t R, int64_t K, const W* w,
           int64_t N, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  switch (isa) {
    case Isa::kAvx512: return PanelAvx512(xs, R, K, w, N, y, ldy, n0, n1);
    case Isa::kAvx2: return PanelAvx2(xs, R, K, w, N, y, ldy, n0, n1);
    default: return PanelScalar(xs, R, K, w, N, y, ldy, n0, n1);
  }
}

// Runs work(chunk) for chunk in [0, n_chunks) on the caller and, when
// `pool` is given, on its threads too. Chunks are taken from a shared
// counter: the caller only waits for chunks that another thread started.
struct Shared {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

template <typename F>
void ParallelFor(ffi::ThreadPool* pool, int64_t n_chunks, F work) {
  int64_t helpers = 0;
  if (pool != nullptr && n_chunks > 1) {
    // The caller is one of the workers: pool threads - 1 helpers, so that
    // the workers do not outnumber the cores XLA sized its pool for.
    helpers = std::min<int64_t>(pool->num_threads() - 1, n_chunks - 1);
  }
  if (helpers <= 0) {
    for (int64_t c = 0; c < n_chunks; ++c) work(c);
    return;
  }
  auto shared = std::make_shared<Shared>();
  auto run = [shared, n_chunks, work]() {
    for (int64_t c; (c = shared->next.fetch_add(1)) < n_chunks;) {
      work(c);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t i = 0; i < helpers; ++i) pool->Schedule(decltype(run)(run));
  run();
  while (shared->done.load(std::memory_order_acquire) < n_chunks) {
    _mm_pause();
  }
}

// Products smaller than this (bytes of W) run on the calling thread only;
// tf_set_parallel_bytes changes it (a huge value: never split).
std::atomic<int64_t> g_parallel_bytes{1 << 20};

// From this many rows (and columns of W under one panel) the vector paths
// block rows in registers (RowsAvx2, AVX-512 CPUs too: the AVX-512 panel
// path, one pass of W per row, was 3x slower than XLA on sparse QKV's 64
// rows) and split row groups over the pool.
constexpr int64_t kManyRows = 8;
constexpr int64_t kRowGroup = 8;

template <typename W>
void Matmul(ffi::ThreadPool* pool, const float* xs, int64_t R, int64_t K,
            const W* w, int64_t N, float* y, int64_t ldy) {
  Isa isa = CurrentIsa();
  if (isa != Isa::kScalar && R >= kManyRows && N <= kPanel) {
    const int64_t n_groups = (R + kRowGroup - 1) / kRowGroup;
    // Multiply-adds, as bytes of float32 W would count them.
    bool parallel = R * K * N * 4 >= g_parallel_bytes.load();
    ParallelFor(parallel ? pool : nullptr, n_groups, [=](int64_t gi) {
      const int64_t r0 = gi * kRowGroup;
      RowsAvx2(xs, K, w, N, y, ldy, r0, std::min(R, r0 + kRowGroup));
    });
    return;
  }
  int64_t n_panels = (N + kPanel - 1) / kPanel;
  bool parallel =
      K * N * static_cast<int64_t>(sizeof(W)) >= g_parallel_bytes.load();
  ParallelFor(parallel ? pool : nullptr, n_panels, [=](int64_t p) {
    int64_t n0 = p * kPanel;
    Panel(isa, xs, R, K, w, N, y, ldy, n0, std::min(N, n0 + kPanel));
  });
}

// ---------------------------------------------------------------------------
// Dot products and axpy over one row of weights.

template <typename W>
TF_AVX512 float DotAvx512(const W* w, const float* x, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = i + 16 <= n ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    acc = _mm512_fmadd_ps(load16(w + i, m), _mm512_maskz_loadu_ps(m, x + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

template <typename W>
TF_AVX512 void AxpyAvx512(float a, const W* w, float* y, int64_t n) {
  __m512 va = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = i + 16 <= n ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    __m512 acc = _mm512_maskz_loadu_ps(m, y + i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, load16(w + i, m), acc));
  }
}

template <typename W>
TF_AVX2 float DotAvx2(const W* w, const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    acc = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(x + i), acc);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  float s = 0.f;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += to_f32(w[i]) * x[i];
  return s;
}

template <typename W>
TF_AVX2 void AxpyAvx2(float a, const W* w, float* y, int64_t n) {
  __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load8(w + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * to_f32(w[i]);
}

template <typename W>
float Dot(Isa isa, const W* w, const float* x, int64_t n) {
  if (isa == Isa::kAvx512) return DotAvx512(w, x, n);
  if (isa == Isa::kAvx2) return DotAvx2(w, x, n);
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += to_f32(w[i]) * x[i];
  return s;
}

template <typename W>
void Axpy(Isa isa, float a, const W* w, float* y, int64_t n) {
  if (isa == Isa::kAvx512) return AxpyAvx512(a, w, y, n);
  if (isa == Isa::kAvx2) return AxpyAvx2(a, w, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * to_f32(w[i]);
}

// ---------------------------------------------------------------------------
// The sparse FF step's rows, kFFRows at a time: each row's dot product (or
// axpy) is the same sequence of operations as Dot (Axpy) on it alone, so
// the results have the same bits; the rows' independent chains keep the FMA
// units busy and kFFRows row reads in flight (the rows are scattered: each
// one a new stream for the hardware prefetcher), and `next` (the rows of
// the following pass, when known) is prefetched a cache line at a time
// alongside.

constexpr int kFFRows = 4;

template <typename W>
inline void PrefetchLine(const W* const* next, int n_next, int64_t i) {
  // One line per row every 64 bytes of W.
  if ((i * static_cast<int64_t>(sizeof(W))) % 64 == 0) {
    for (int j = 0; j < n_next; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(next[j] + i), _MM_HINT_T0);
    }
  }
}

template <typename W>
TF_AVX512 void DotRowsAvx512(const W* const* w, int n_rows,
                             const W* const* next, int n_next,
                             const float* x, int64_t n, float* out) {
  __m512 acc[kFFRows];
  for (int j = 0; j < kFFRows; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = i + 16 <= n ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
    for (int j = 0; j < n_rows; ++j) {
      acc[j] = _mm512_fmadd_ps(load16(w[j] + i, m), xv, acc[j]);
    }
    PrefetchLine(next, n_next, i);
  }
  for (int j = 0; j < n_rows; ++j) out[j] = _mm512_reduce_add_ps(acc[j]);
}

template <typename W>
TF_AVX512 void AxpyRowsAvx512(const float* a, const W* const* w, int n_rows,
                              const W* const* next, int n_next, float* y,
                              int64_t n) {
  __m512 va[kFFRows];
  for (int j = 0; j < n_rows; ++j) va[j] = _mm512_set1_ps(a[j]);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = i + 16 <= n ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    __m512 acc = _mm512_maskz_loadu_ps(m, y + i);
    for (int j = 0; j < n_rows; ++j) {
      acc = _mm512_fmadd_ps(va[j], load16(w[j] + i, m), acc);
    }
    _mm512_mask_storeu_ps(y + i, m, acc);
    PrefetchLine(next, n_next, i);
  }
}

template <typename W>
TF_AVX2 void DotRowsAvx2(const W* const* w, int n_rows, const W* const* next,
                         int n_next, const float* x, int64_t n, float* out) {
  __m256 acc[kFFRows];
  for (int j = 0; j < kFFRows; ++j) acc[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    for (int j = 0; j < n_rows; ++j) {
      acc[j] = _mm256_fmadd_ps(load8(w[j] + i), xv, acc[j]);
    }
    PrefetchLine(next, n_next, i);
  }
  for (int j = 0; j < n_rows; ++j) {
    float lanes[8];
    _mm256_storeu_ps(lanes, acc[j]);
    float s = 0.f;
    for (float l : lanes) s += l;
    for (int64_t t = i; t < n; ++t) s += to_f32(w[j][t]) * x[t];
    out[j] = s;
  }
}

template <typename W>
TF_AVX2 void AxpyRowsAvx2(const float* a, const W* const* w, int n_rows,
                          const W* const* next, int n_next, float* y,
                          int64_t n) {
  __m256 va[kFFRows];
  for (int j = 0; j < n_rows; ++j) va[j] = _mm256_set1_ps(a[j]);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 acc = _mm256_loadu_ps(y + i);
    for (int j = 0; j < n_rows; ++j) {
      acc = _mm256_fmadd_ps(va[j], load8(w[j] + i), acc);
    }
    _mm256_storeu_ps(y + i, acc);
    PrefetchLine(next, n_next, i);
  }
  for (int j = 0; j < n_rows; ++j) {
    for (int64_t t = i; t < n; ++t) y[t] += a[j] * to_f32(w[j][t]);
  }
}

template <typename W>
void DotRows(Isa isa, const W* const* w, int n_rows, const W* const* next,
             int n_next, const float* x, int64_t n, float* out) {
  if (isa == Isa::kAvx512) return DotRowsAvx512(w, n_rows, next, n_next, x, n, out);
  if (isa == Isa::kAvx2) return DotRowsAvx2(w, n_rows, next, n_next, x, n, out);
  for (int j = 0; j < n_rows; ++j) out[j] = Dot(isa, w[j], x, n);
}

template <typename W>
void AxpyRows(Isa isa, const float* a, const W* const* w, int n_rows,
              const W* const* next, int n_next, float* y, int64_t n) {
  if (isa == Isa::kAvx512) return AxpyRowsAvx512(a, w, n_rows, next, n_next, y, n);
  if (isa == Isa::kAvx2) return AxpyRowsAvx2(a, w, n_rows, next, n_next, y, n);
  for (int j = 0; j < n_rows; ++j) Axpy(isa, a[j], w[j], y, n);
}

// First index of the largest v[j] = l[j] + c[j], j < n (jnp.argmax's choice).
inline int64_t BlockArgmaxScalar(const float* l, const float* c, int64_t n) {
  int64_t best = 0;
  float best_v = l[0] + c[0];
  for (int64_t j = 1; j < n; ++j) {
    float v = l[j] + c[j];
    if (v > best_v) best_v = v, best = j;
  }
  return best;
}

TF_AVX512 int64_t BlockArgmaxAvx512(const float* l, const float* c, int64_t n) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 m = j + 16 <= n ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
    const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, l + j),
                                   _mm512_maskz_loadu_ps(m, c + j));
    mx = _mm512_mask_max_ps(mx, m, mx, v);
  }
  const float best_v = _mm512_reduce_max_ps(mx);
  const __m512 bv = _mm512_set1_ps(best_v);
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 m = j + 16 <= n ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
    const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, l + j),
                                   _mm512_maskz_loadu_ps(m, c + j));
    const __mmask16 hit = _mm512_mask_cmp_ps_mask(m, v, bv, _CMP_EQ_OQ);
    if (hit) return j + __builtin_ctz(hit);
  }
  return BlockArgmaxScalar(l, c, n);  // NaNs: the scalar rule.
}

inline int64_t BlockArgmax(Isa isa, const float* l, const float* c, int64_t n) {
  return isa == Isa::kAvx512 ? BlockArgmaxAvx512(l, c, n)
                             : BlockArgmaxScalar(l, c, n);
}

// ---------------------------------------------------------------------------
// The Q8 GEMV (decode_options.weights = 'q8'): int8 weights times int8
// activations, for the one-row (or few-row) products of a decoding step,
// which read every weight once and are bound by memory bandwidth.
//
// Weights. W [K, N] (y = x W) is stored output-major in groups of
// kQ8Rows = 16 outputs: P[g, q, j, i] = W[4q + i, 16g + j], int8 in
// [-127, 127] with one float32 scale per output n; K is padded with zeros
// to a multiple of kQ8Block and N to a multiple of 16
// (terraformer/kernels/layers.py, pack_q8). The 64 bytes of P[g, q] are 4
// consecutive inputs of 16 outputs, the operand of one vpdpbusd: lane j of
// its 16 int32 sums is output 16g + j. A group's 16 sums so stay in one
// register for the whole K loop (no y loads or stores, no horizontal sums)
// and its weights are one contiguous stream.
//
// Activations. Each row of x g is quantized once per call, per block of
// kQ8Block = 32 inputs (llama.cpp's Q8_0): d_b = max|v_b| / 127,
// q = rint(v / d_b) in [-127, 127]. Then
//   y[n] = w_scale[n] * sum_b d_b * (sum_{k in b} q[k] W[k, n]) (+ bias[n]),
// the inner sums exact in int32 and the float steps the same FMAs in the
// same order on every path: the three paths give the same bits.
//
// vpdpbusd multiplies unsigned by signed bytes: the weights enter as
// w + 128 (w XOR 0x80) and each block's sum starts at -128 * sum_b q
// (computed once per call), which cancels the offset exactly. AVX2's
// maddubs adds two u8 x s8 products into a saturating int16: |w| times q
// with w's sign (_mm256_sign_epi8) keeps each pair within 2 * 128 * 127 <
// 2^15.

#define TF_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

constexpr int64_t kQ8Rows = 16;   // Outputs per group (one 512-bit vector).
constexpr int64_t kQ8Block = 32;  // Inputs per activation scale.
constexpr int64_t kQ8Steps = kQ8Block / 4;  // 64-byte loads per block.
// Most activation rows one pass over a group keeps in registers.
constexpr int kQ8RowsVnni = 8;
constexpr int kQ8RowsAvx2 = 2;
// A block whose largest |v| is below this quantizes to zeros (1 / d_b
// would overflow).
constexpr float kQ8Tiny = 1e-30f;

enum class GemvIsa { kScalar, kAvx2, kAvx512Vnni };

GemvIsa DetectGemvIsa() {
  const CpuFeatures cpu = ProbeCpu();
  return cpu.avx512_vnni ? GemvIsa::kAvx512Vnni
         : cpu.avx2      ? GemvIsa::kAvx2
                         : GemvIsa::kScalar;
}

// Set by tf_set_gemv_isa (tests force the fallbacks); starts at the best.
std::atomic<int> g_gemv_isa{static_cast<int>(DetectGemvIsa())};

GemvIsa CurrentGemvIsa() { return static_cast<GemvIsa>(g_gemv_isa.load()); }

// Rows of x g quantized: q [rows, kp] (zeros past K), block scales d
// [rows, nb] and off [rows, nb] = -128 * the block's sum of q.
struct Q8Act {
  int64_t rows = 0, kp = 0, nb = 0;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> off;
};

inline float Q8Inverse(float amax, float* d) {
  if (!(amax >= kQ8Tiny)) {
    *d = 0.f;
    return 0.f;
  }
  *d = amax / 127.f;
  return 1.f / *d;
}

// One block of 32 values v (zeros past K) -> q, d, off.
void Q8BlockScalar(const float* v, int8_t* q, float* d, int32_t* off) {
  float amax = 0.f;
  for (int64_t i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float inv = Q8Inverse(amax, d);
  int32_t sum = 0;
  for (int64_t i = 0; i < kQ8Block; ++i) {
    // Round half to even, as cvtps2dq does under the default MXCSR.
    float r = std::nearbyint(v[i] * inv);
    int32_t qi = static_cast<int32_t>(std::min(127.f, std::max(-127.f, r)));
    q[i] = static_cast<int8_t>(qi);
    sum += qi;
  }
  *off = -128 * sum;
}

TF_VNNI void Q8BlockAvx512(const float* v, int8_t* q, float* d, int32_t* off) {
  const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
  const float amax =
      _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const __m512 inv = _mm512_set1_ps(Q8Inverse(amax, d));
  const __m512i lim = _mm512_set1_epi32(127);
  __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));
  __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
  qa = _mm512_max_epi32(_mm512_min_epi32(qa, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
  qb = _mm512_max_epi32(_mm512_min_epi32(qb, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  *off = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}

TF_AVX2 void Q8BlockAvx2(const float* v, int8_t* q, float* d, int32_t* off) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 x[4];
  for (int i = 0; i < 4; ++i) x[i] = _mm256_loadu_ps(v + 8 * i);
  __m256 m = _mm256_max_ps(
      _mm256_max_ps(_mm256_andnot_ps(sign, x[0]), _mm256_andnot_ps(sign, x[1])),
      _mm256_max_ps(_mm256_andnot_ps(sign, x[2]), _mm256_andnot_ps(sign, x[3])));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const __m256 inv = _mm256_set1_ps(Q8Inverse(_mm_cvtss_f32(h), d));
  const __m256i lim = _mm256_set1_epi32(127), neg = _mm256_set1_epi32(-127);
  __m256i qi[4];
  __m256i sum = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(x[i], inv));
    qi[i] = _mm256_max_epi32(_mm256_min_epi32(qi[i], lim), neg);
    sum = _mm256_add_epi32(sum, qi[i]);
  }
  // packs interleave the 128-bit lanes: dwords come out as 0,2,4,6,1,3,5,7
  // of the wanted order; the permutation puts them back.
  __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]),
                                 _mm256_packs_epi32(qi[2], qi[3]));
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), p);
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum),
                            _mm256_extracti128_si256(sum, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  *off = -128 * _mm_cvtsi128_si32(s);
}

// v[i] = x[i] g[i] for a block of 32 (the activation row x g, before
// quantization).
void MulBlockScalar(const float* x, const float* g, float* v) {
  for (int64_t i = 0; i < kQ8Block; ++i) v[i] = x[i] * g[i];
}

TF_AVX2 void MulBlockAvx2(const float* x, const float* g, float* v) {
  for (int i = 0; i < 4; ++i) {
    _mm256_store_ps(v + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(x + 8 * i),
                                             _mm256_loadu_ps(g + 8 * i)));
  }
}

// The same products with an int8 g (its row scale applied after the
// block's quantization, Q8Quantize).
void MulBlockS8Scalar(const float* x, const int8_t* g, float* v) {
  for (int64_t i = 0; i < kQ8Block; ++i) v[i] = x[i] * static_cast<float>(g[i]);
}

TF_AVX2 void MulBlockS8Avx2(const float* x, const int8_t* g, float* v) {
  for (int i = 0; i < 4; ++i) {
    const __m256 gf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(g + 8 * i))));
    _mm256_store_ps(v + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), gf));
  }
}

// Lane j of the result: op over the 16 lanes of m[slot(j)], slot(j) =
// 4 (j % 4) + j / 4 (the shuffles below leave lane 4c + k holding vector
// 4k + c's reduction). 15 shuffle pairs for 16 vectors instead of 4 per
// vector; max and integer adds give the same bits in any order.
inline int Q8Slot(int j) { return ((j & 3) << 2) | (j >> 2); }

struct MaxPs {
  TF_AVX512 __m512 operator()(__m512 a, __m512 b) const { return _mm512_max_ps(a, b); }
};
struct AddPs {
  TF_AVX512 __m512 operator()(__m512 a, __m512 b) const { return _mm512_add_ps(a, b); }
};
struct AddEpi32 {  // Integer lanes carried in __m512.
  TF_AVX512 __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_castsi512_ps(
        _mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
};

template <typename Op>
TF_AVX512 inline __m512 Reduce16(__m512* m, Op op) {
  for (int i = 0; i < 8; ++i) {  // Each vector to 8 lanes.
    m[i] = op(_mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0x44),
              _mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {  // To one 128-bit lane each.
    m[i] = op(_mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0x88),
              _mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {
    m[i] = op(_mm512_unpacklo_ps(m[2 * i], m[2 * i + 1]),
              _mm512_unpackhi_ps(m[2 * i], m[2 * i + 1]));
  }
  return op(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(m[0]),
                                                _mm512_castps_pd(m[1]))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(m[0]),
                                                _mm512_castps_pd(m[1]))));
}

TF_VNNI inline __m512 LoadBlockHalf(const float* g) { return _mm512_loadu_ps(g); }
TF_VNNI inline __m512 LoadBlockHalf(const int8_t* g) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(g))));
}

// The first nb full blocks of one row v = x g (g float, or int8 times
// g_scale): the same q, d and off as MulBlock* + Q8BlockAvx512 block by block
// (the same products, amax, d = amax / 127, 1 / d and rounding), 16 blocks
// at a time: v stays in a stack buffer, and the 16 blocks' amax and sums of
// q are reduced together (Reduce16), d and 1 / d computed in one vector.
template <typename G>
TF_VNNI void Q8RowAvx512(const float* x, const G* g, float g_scale,
                         int64_t nb, int8_t* q, float* d, int32_t* off) {
  alignas(64) float v[16 * kQ8Block];
  const __m512 tiny = _mm512_set1_ps(kQ8Tiny), k127 = _mm512_set1_ps(127.f);
  const __m512i lim = _mm512_set1_epi32(127), neg = _mm512_set1_epi32(-127);
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, nb - b0));
    __m512 m[16];
    for (int j = 0; j < 16; ++j) m[Q8Slot(j)] = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) {
      const int64_t k = (b0 + j) * kQ8Block;
      const __m512 va = _mm512_mul_ps(_mm512_loadu_ps(x + k), LoadBlockHalf(g + k));
      const __m512 vb = _mm512_mul_ps(_mm512_loadu_ps(x + k + 16),
                                      LoadBlockHalf(g + k + 16));
      _mm512_store_ps(v + j * kQ8Block, va);
      _mm512_store_ps(v + j * kQ8Block + 16, vb);
      m[Q8Slot(j)] = _mm512_max_ps(_mm512_abs_ps(va), _mm512_abs_ps(vb));
    }
    const __m512 amax = Reduce16(m, MaxPs());
    // Q8Inverse, lane by lane: !(amax >= tiny) (NaN too) -> d = inv = 0.
    const __mmask16 ok = _mm512_cmp_ps_mask(amax, tiny, _CMP_GE_OQ);
    const __m512 dv = _mm512_maskz_div_ps(ok, amax, k127);
    const __m512 inv = _mm512_maskz_div_ps(ok, _mm512_set1_ps(1.f), dv);
    const __mmask16 live = static_cast<__mmask16>((1u << n) - 1);
    _mm512_mask_storeu_ps(d + b0, live, _mm512_mul_ps(dv, _mm512_set1_ps(g_scale)));
    __m512 sums[16];
    for (int j = 0; j < 16; ++j) sums[Q8Slot(j)] = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) {
      const __m512 ij = _mm512_permutexvar_ps(_mm512_set1_epi32(j), inv);
      __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(v + j * kQ8Block), ij));
      __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(v + j * kQ8Block + 16), ij));
      qa = _mm512_max_epi32(_mm512_min_epi32(qa, lim), neg);
      qb = _mm512_max_epi32(_mm512_min_epi32(qb, lim), neg);
      int8_t* qj = q + (b0 + j) * kQ8Block;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qj), _mm512_cvtepi32_epi8(qa));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qj + 16), _mm512_cvtepi32_epi8(qb));
      sums[Q8Slot(j)] = _mm512_castsi512_ps(_mm512_add_epi32(qa, qb));
    }
    const __m512i total = _mm512_castps_si512(Reduce16(sums, AddEpi32()));
    _mm512_mask_storeu_epi32(off + b0, live,
                             _mm512_mullo_epi32(total, _mm512_set1_epi32(-128)));
  }
}

// Rows (t, s) of x [T, K] times g [S, K], quantized into `a` (row t*S + s);
// rows split over `pool` (when given) from g_parallel_bytes of float
// activations on (64 rows of sparse QKV's multiplicative layer at 17B: 2.4
// MB, 0.61 -> 0.20 ms with the vector products, on 2 threads).
// g8 (when given) replaces g: int8 rows with one scale per row, g_scale
// [S]; a row's scale factors out of its blocks' quantization, so the blocks
// of x g8[s] are quantized and their d scaled by g_scale[s].
void Q8Quantize(ffi::ThreadPool* pool, GemvIsa isa, const float* x, int64_t T,
                const float* g, int64_t S, int64_t K, int64_t kp, Q8Act* a,
                const int8_t* g8 = nullptr, const float* g_scale = nullptr) {
  a->rows = T * S;
  a->kp = kp;
  a->nb = kp / kQ8Block;
  // Every block is written below (a partial last block with its zeros):
  // no clearing, and a reused `a` keeps its memory.
  a->q.resize(a->rows * kp);
  a->d.resize(a->rows * a->nb);
  a->off.resize(a->rows * a->nb);
  auto quantize_row = [=](int64_t r) {
    const int64_t t = r / S, s = r % S;
    alignas(64) float v[kQ8Block];
    // Blocks before `first` are done: on AVX-512 every full block, 16 at a
    // time (Q8RowAvx512); the partial last block, if any, goes below.
    int64_t first = 0;
    if (isa == GemvIsa::kAvx512Vnni) {
      first = K / kQ8Block;
      int8_t* q = a->q.data() + r * kp;
      float* d = a->d.data() + r * a->nb;
      int32_t* off = a->off.data() + r * a->nb;
      if (g8 != nullptr) {
        Q8RowAvx512(x + t * K, g8 + s * K, g_scale[s], first, q, d, off);
      } else {
        Q8RowAvx512(x + t * K, g + s * K, 1.f, first, q, d, off);
      }
    }
    for (int64_t b = first; b < a->nb; ++b) {
      const int64_t k0 = b * kQ8Block;
      const int64_t n = std::min(kQ8Block, K - k0);
      const float* xb = x + t * K + k0;
      const float* gb = g8 == nullptr ? g + s * K + k0 : nullptr;
      const int8_t* g8b = g8 == nullptr ? nullptr : g8 + s * K + k0;
      if (n < kQ8Block) {
        for (int64_t i = 0; i < n; ++i) {
          v[i] = xb[i] * (g8b ? static_cast<float>(g8b[i]) : gb[i]);
        }
        for (int64_t i = n; i < kQ8Block; ++i) v[i] = 0.f;
      } else if (g8b != nullptr) {
        switch (isa) {
          case GemvIsa::kAvx2: MulBlockS8Avx2(xb, g8b, v); break;
          default: MulBlockS8Scalar(xb, g8b, v);
        }
      } else {
        switch (isa) {
          case GemvIsa::kAvx2: MulBlockAvx2(xb, gb, v); break;
          default: MulBlockScalar(xb, gb, v);
        }
      }
      int8_t* q = a->q.data() + r * kp + k0;
      float* d = a->d.data() + r * a->nb + b;
      int32_t* off = a->off.data() + r * a->nb + b;
      switch (isa) {
        case GemvIsa::kAvx512Vnni: Q8BlockAvx512(v, q, d, off); break;
        case GemvIsa::kAvx2: Q8BlockAvx2(v, q, d, off); break;
        default: Q8BlockScalar(v, q, d, off);
      }
      if (g_scale != nullptr) *d *= g_scale[s];
    }
  };
  const bool parallel =
      pool != nullptr && a->rows > 1 &&
      a->rows * kp * static_cast<int64_t>(sizeof(float)) >= g_parallel_bytes.load();
  const int64_t chunks =
      parallel ? std::min<int64_t>(a->rows, 2 * pool->num_threads()) : 1;
  ParallelFor(parallel ? pool : nullptr, chunks, [&](int64_t c) {
    for (int64_t r = c * a->rows / chunks; r < (c + 1) * a->rows / chunks; ++r)
      quantize_row(r);
  });
}

// Where one product writes: y row r at y + r * N, its bias (or none) at
// bias + (r % S) * N; w_scale [N].
struct Q8Out {
  const float* w_scale;
  const float* bias;
  int64_t S, N;
  float* y;
};

inline int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Bytes ahead of the weights being multiplied that a group's first pass
// prefetches (the following groups' weights past its end): with 4 rows
// (the 17B sparse loss's product, 74 MB) one thread streamed 17 GB/s
// without it, 21 GB/s with it; 1 row 26.5 -> 27.5 GB/s.
constexpr int64_t kQ8Ahead = 4096;

// Rows [r0, r0 + RB) of `a` times the 16 outputs of group gi (weights pg);
// `prefetch` on the group's first pass (later ones read it from cache).
template <int RB>
TF_VNNI inline void Q8GroupVnni(const Q8Act& a, int64_t r0, const int8_t* pg,
                                const Q8Out& o, int64_t gi, bool prefetch) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int8_t* xq[RB];
  for (int r = 0; r < RB; ++r) xq[r] = a.q.data() + (r0 + r) * a.kp;
  __m512 acc[RB];
  for (int r = 0; r < RB; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const int8_t* pb = pg + b * kQ8Rows * kQ8Block;
    __m512i dot[RB];
    for (int r = 0; r < RB; ++r) {
      dot[r] = _mm512_set1_epi32(a.off[(r0 + r) * a.nb + b]);
    }
    for (int64_t s = 0; s < kQ8Steps; ++s) {
      if (prefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(pb + 64 * s + kQ8Ahead),
                     _MM_HINT_T0);
      }
      const __m512i w = _mm512_xor_si512(_mm512_loadu_si512(pb + 64 * s), flip);
      for (int r = 0; r < RB; ++r) {
        const __m512i xb = _mm512_set1_epi32(Load4(xq[r] + b * kQ8Block + 4 * s));
        dot[r] = _mm512_dpbusd_epi32(dot[r], w, xb);
      }
    }
    for (int r = 0; r < RB; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]),
                               _mm512_set1_ps(a.d[(r0 + r) * a.nb + b]), acc[r]);
    }
  }
  const int64_t n0 = gi * kQ8Rows;
  const __mmask16 m =
      n0 + kQ8Rows <= o.N ? 0xFFFF : (__mmask16)((1u << (o.N - n0)) - 1);
  const __m512 scale = _mm512_maskz_loadu_ps(m, o.w_scale + n0);
  for (int r = 0; r < RB; ++r) {
    const int64_t row = r0 + r;
    const __m512 bias = o.bias == nullptr ? _mm512_setzero_ps()
        : _mm512_maskz_loadu_ps(m, o.bias + (row % o.S) * o.N + n0);
    _mm512_mask_storeu_ps(o.y + row * o.N + n0, m,
                          _mm512_fmadd_ps(acc[r], scale, bias));
  }
}

// Groups [g0, g1) times rows [row0, row1) of `a`.
TF_VNNI void Q8RangeVnni(const Q8Act& a, const int8_t* p, const Q8Out& o,
                         int64_t g0, int64_t g1, int64_t row0, int64_t row1) {
  for (int64_t gi = g0; gi < g1; ++gi) {
    const int8_t* pg = p + gi * a.kp * kQ8Rows;
    for (int64_t r0 = row0; r0 < row1; r0 += kQ8RowsVnni) {
      const bool first = r0 == row0;
      switch (std::min<int64_t>(kQ8RowsVnni, row1 - r0)) {
        case 1: Q8GroupVnni<1>(a, r0, pg, o, gi, first); break;
        case 2: Q8GroupVnni<2>(a, r0, pg, o, gi, first); break;
        case 3: Q8GroupVnni<3>(a, r0, pg, o, gi, first); break;
        case 4: Q8GroupVnni<4>(a, r0, pg, o, gi, first); break;
        case 5: Q8GroupVnni<5>(a, r0, pg, o, gi, first); break;
        case 6: Q8GroupVnni<6>(a, r0, pg, o, gi, first); break;
        case 7: Q8GroupVnni<7>(a, r0, pg, o, gi, first); break;
        default: Q8GroupVnni<8>(a, r0, pg, o, gi, first);
      }
    }
  }
}

template <int RB>
TF_AVX2 inline void Q8GroupAvx2(const Q8Act& a, int64_t r0, const int8_t* pg,
                                const Q8Out& o, int64_t gi) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* xq[RB];
  for (int r = 0; r < RB; ++r) xq[r] = a.q.data() + (r0 + r) * a.kp;
  // [r][h]: outputs 8h..8h+7 of the group.
  __m256 acc[RB][2];
  for (int r = 0; r < RB; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const int8_t* pb = pg + b * kQ8Rows * kQ8Block;
    __m256i dot[RB][2];
    for (int r = 0; r < RB; ++r) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
    // Unrolled fully, GCC computes all the products before their sums and
    // spills them (16 ymm registers).
#pragma GCC unroll 2
    for (int64_t s = 0; s < kQ8Steps; ++s) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 64 * s));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 64 * s + 32));
      const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
      for (int r = 0; r < RB; ++r) {
        const __m256i xb = _mm256_set1_epi32(Load4(xq[r] + b * kQ8Block + 4 * s));
        dot[r][0] = _mm256_add_epi32(dot[r][0], _mm256_madd_epi16(
            _mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0)), ones));
        dot[r][1] = _mm256_add_epi32(dot[r][1], _mm256_madd_epi16(
            _mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1)), ones));
      }
    }
    for (int r = 0; r < RB; ++r) {
      const __m256 d = _mm256_set1_ps(a.d[(r0 + r) * a.nb + b]);
      for (int h = 0; h < 2; ++h) {
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][h]), d, acc[r][h]);
      }
    }
  }
  for (int r = 0; r < RB; ++r) {
    const int64_t row = r0 + r;
    const float* bias = o.bias == nullptr ? nullptr : o.bias + (row % o.S) * o.N;
    for (int h = 0; h < 2; ++h) {
      const int64_t n0 = gi * kQ8Rows + 8 * h;
      if (n0 + 8 <= o.N) {
        const __m256 add = bias == nullptr ? _mm256_setzero_ps() : _mm256_loadu_ps(bias + n0);
        _mm256_storeu_ps(o.y + row * o.N + n0,
                         _mm256_fmadd_ps(acc[r][h], _mm256_loadu_ps(o.w_scale + n0), add));
      } else {
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, acc[r][h]);
        for (int64_t j = 0; n0 + j < o.N; ++j) {
          o.y[row * o.N + n0 + j] = std::fma(
              lanes[j], o.w_scale[n0 + j], bias == nullptr ? 0.f : bias[n0 + j]);
        }
      }
    }
  }
}

TF_AVX2 void Q8RangeAvx2(const Q8Act& a, const int8_t* p, const Q8Out& o,
                         int64_t g0, int64_t g1, int64_t row0, int64_t row1) {
  for (int64_t gi = g0; gi < g1; ++gi) {
    const int8_t* pg = p + gi * a.kp * kQ8Rows;
    int64_t r0 = row0;
    for (; r0 + kQ8RowsAvx2 <= row1; r0 += kQ8RowsAvx2) {
      Q8GroupAvx2<kQ8RowsAvx2>(a, r0, pg, o, gi);
    }
    if (r0 < row1) Q8GroupAvx2<1>(a, r0, pg, o, gi);
  }
}

void Q8RangeScalar(const Q8Act& a, const int8_t* p, const Q8Out& o,
                   int64_t g0, int64_t g1, int64_t row0, int64_t row1) {
  for (int64_t gi = g0; gi < g1; ++gi) {
    const int8_t* pg = p + gi * a.kp * kQ8Rows;
    for (int64_t row = row0; row < row1; ++row) {
      const int8_t* xq = a.q.data() + row * a.kp;
      for (int64_t j = 0; j < kQ8Rows && gi * kQ8Rows + j < o.N; ++j) {
        float acc = 0.f;
        for (int64_t b = 0; b < a.nb; ++b) {
          const int8_t* pb = pg + b * kQ8Rows * kQ8Block;
          int32_t dot = 0;
          for (int64_t s = 0; s < kQ8Steps; ++s) {
            for (int64_t i = 0; i < 4; ++i) {
              dot += int32_t{pb[64 * s + 4 * j + i]} *
                     int32_t{xq[b * kQ8Block + 4 * s + i]};
            }
          }
          acc = std::fma(static_cast<float>(dot), a.d[row * a.nb + b], acc);
        }
        const int64_t n = gi * kQ8Rows + j;
        const float bias = o.bias == nullptr ? 0.f : o.bias[(row % o.S) * o.N + n];
        o.y[row * o.N + n] = std::fma(acc, o.w_scale[n], bias);
      }
    }
  }
}

// Rows from which a product is compute-bound (each weight reused by many
// rows): its work is then split into (group, part of the rows) items taken
// one by one, so that 2 threads stay even on 9 groups (the 17B sparse QKV's
// 144 outputs) and a helper that starts late still finds work.
constexpr int64_t kQ8ManyRows = 2 * kQ8RowsVnni;

// y = the Q8 product of x [T, K] g [S, K] (rows t*S + s) and P (n_groups
// groups of kp inputs). A few rows (memory-bound): the groups split into
// equal contiguous ranges, one per thread of the pool, when the product is
// large enough; many rows: see kQ8ManyRows.
void Q8Matmul(ffi::ThreadPool* pool, const float* x, int64_t T,
              const float* g, int64_t S, int64_t K, const int8_t* p,
              int64_t n_groups, int64_t kp, const Q8Out& o,
              const int8_t* g8 = nullptr, const float* g_scale = nullptr) {
  const GemvIsa isa = CurrentGemvIsa();
  // The caller's buffers, reused from call to call (no allocation, no page
  // faults); helpers read them through this reference (a lambda naming the
  // thread_local itself would find the helper thread's own).
  thread_local Q8Act caller_act;
  Q8Act& a = caller_act;
  Q8Quantize(pool, isa, x, T, g, S, K, kp, &a, g8, g_scale);
  // Multiply-adds: bytes of P times rows.
  const bool parallel =
      pool != nullptr && a.rows * n_groups * kQ8Rows * kp >= g_parallel_bytes.load();
  auto range = [&](int64_t g0, int64_t g1, int64_t row0, int64_t row1) {
    switch (isa) {
      case GemvIsa::kAvx512Vnni: return Q8RangeVnni(a, p, o, g0, g1, row0, row1);
      case GemvIsa::kAvx2: return Q8RangeAvx2(a, p, o, g0, g1, row0, row1);
      default: return Q8RangeScalar(a, p, o, g0, g1, row0, row1);
    }
  };
  if (parallel && a.rows >= kQ8ManyRows) {
    // Two parts of the rows, each a multiple of a register pass.
    const int64_t half = (a.rows / 2 + kQ8RowsVnni - 1) / kQ8RowsVnni * kQ8RowsVnni;
    ParallelFor(pool, 2 * n_groups, [&](int64_t c) {
      const int64_t gi = c / 2;
      if (c % 2 == 0) return range(gi, gi + 1, 0, half);
      return range(gi, gi + 1, half, a.rows);
    });
    return;
  }
  const int64_t workers =
      parallel ? std::max<int64_t>(1, std::min<int64_t>(pool->num_threads(), n_groups)) : 1;
  ParallelFor(workers > 1 ? pool : nullptr, workers, [&](int64_t c) {
    const int64_t g0 = c * n_groups / workers, g1 = (c + 1) * n_groups / workers;
    range(g0, g1, 0, a.rows);
  });
}

// ---------------------------------------------------------------------------
// The FFI handlers.

ffi::Error BadType(const char* what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    std::string(what) + ": weights must be f32, bf16 or s8");
}

template <typename F>
ffi::Error Dispatch(ffi::DataType type, const char* what, F f) {
  switch (type) {
    case ffi::DataType::F32: f(static_cast<const float*>(nullptr)); break;
    case ffi::DataType::BF16: f(static_cast<const uint16_t*>(nullptr)); break;
    case ffi::DataType::S8: f(static_cast<const int8_t*>(nullptr)); break;
    default: return BadType(what);
  }
  return ffi::Error::Success();
}

// x [T, K], g [S, K], c [K] (row scales of W; ones for float W), w [K, N],
// b [S * N] or [1] (no bias) -> y [T, S * N].
ffi::Error SkinnyMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                            ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> c,
                            ffi::AnyBuffer w, ffi::Buffer<ffi::F32> b,
                            ffi::ResultBuffer<ffi::F32> y) {
  auto wd = w.dimensions();
  if (wd.size() != 2) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "W must be 2-D");
  }
  const int64_t K = wd[0], N = wd[1];
  const int64_t S = g.dimensions()[0];
  const int64_t T = x.element_count() / K;
  const bool bias = b.element_count() == S * N;  // else a dummy [1]
  // xs[t * S + s, k] = x[t, k] g[s, k] c[k]: one row per (token, module).
  std::vector<float> xs(T * S * K);
  const float* xp = x.typed_data();
  const float* gp = g.typed_data();
  const float* cp = c.typed_data();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t k = 0; k < K; ++k)
        xs[(t * S + s) * K + k] = xp[t * K + k] * gp[s * K + k] * cp[k];
  float* yp = y->typed_data();
  return Dispatch(w.element_type(), "tf_skinny_matmul", [&](auto tag) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    // Rows (t, s) write y[t, s*N:(s+1)*N]: row stride N.
    Matmul(&pool, xs.data(), T * S, K, static_cast<const W*>(w.untyped_data()),
           N, yp, N);
    if (bias) {
      const float* bp = b.typed_data();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < S * N; ++j) yp[t * S * N + j] += bp[j];
    }
  });
}

// Chunks of a sparse FF step's blocks (at most): as many as a 2-4 thread
// pool takes evenly.
constexpr int64_t kFFChunks = 4;

// What is wrong with a packed matrix's dimensions `pd` for K inputs and N
// outputs (pack_q8: [ceil(N / 16), Kp / 4, 16, 4], Kp = K rounded up to a
// multiple of 32); "" when nothing.
std::string PackedProblem(const char* name, ffi::Span<const int64_t> pd,
                          int64_t K, int64_t N) {
  if (pd.size() != 4 || pd[2] != kQ8Rows || pd[3] != 4) {
    return std::string("packed ") + name + " must be [G, Kp / 4, 16, 4]";
  }
  const int64_t kp = pd[1] * 4;
  if (K <= 0 || kp != (K + kQ8Block - 1) / kQ8Block * kQ8Block) {
    return std::string("packed ") + name + " has " + std::to_string(kp) +
           " inputs for K = " + std::to_string(K) +
           " (K rounded up to a multiple of 32)";
  }
  if (pd[0] != (N + kQ8Rows - 1) / kQ8Rows) {
    return std::string("packed ") + name + " has " + std::to_string(pd[0]) +
           " groups of 16 outputs for " + std::to_string(N) + " scales";
  }
  return "";
}

// Trax's tl.LayerNorm (center, epsilon) of rows x [T, d]: (x - mean) /
// sqrt(var + epsilon) * scale + bias, mean and var over each row (summed in
// double). A decoding step's kernels take it as an optional first operation
// (`norm`): scale [d] (or [1]: none), bias [d]. Returns x, or `out` when it
// normalized into it.
const float* NormRows(const float* x, int64_t T, int64_t d,
                      const ffi::Buffer<ffi::F32>& scale,
                      const ffi::Buffer<ffi::F32>& bias, float epsilon,
                      std::vector<float>* out) {
  if (static_cast<int64_t>(scale.element_count()) != d) return x;
  out->resize(T * d);
  const float* g = scale.typed_data();
  const float* b = bias.typed_data();
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * d;
    float* yt = out->data() + t * d;
    double sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += xt[i];
    const float mean = static_cast<float>(sum / d);
    double squares = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      const float c = xt[i] - mean;
      squares += static_cast<double>(c) * c;
    }
    const float root = std::sqrt(static_cast<float>(squares / d) + epsilon);
    for (int64_t i = 0; i < d; ++i) yt[i] = (xt[i] - mean) / root * g[i] + b[i];
  }
  return out->data();
}

// A norm's operands are valid: scale and bias [d], or scale [1] (none).
bool NormFits(const ffi::Buffer<ffi::F32>& scale,
              const ffi::Buffer<ffi::F32>& bias, int64_t d) {
  return scale.element_count() == 1 ||
         (static_cast<int64_t>(scale.element_count()) == d &&
          static_cast<int64_t>(bias.element_count()) == d);
}


// x [T, d], C1 [d, r], C2 [r, F] float32 or packed for the Q8 GEMV
// ([ceil(F / 16), r' / 4, 16, 4] int8, r' = r rounded up to 32, with its output
// scales c2_scale [F]; [1] for float C2), c [F], W1ᵀ [F, d], W2 [F, d],
// b2 [d], s1 [F] and s2 [F] (row scales; ones for float weights) -> y [T, d].
// Norm scale and bias: the LayerNorm before the block (NormRows).
struct SparseFFOperands {
  ffi::Buffer<ffi::F32> c1;
  ffi::AnyBuffer c2;
  ffi::Buffer<ffi::F32> c2_scale, cb;
  ffi::AnyBuffer w1t, w2;
  ffi::Buffer<ffi::F32> b2, s1, s2, norm_scale, norm_bias;
};

// The step on x_count / d rows at x_in, into yp; `name` prefixes its errors.
ffi::Error SparseFFStep(ffi::ThreadPool* pool, const char* name,
                        const float* x_in, int64_t x_count,
                        const SparseFFOperands& o, float* yp, int64_t block,
                        float epsilon) {
  const auto& [c1, c2, c2_scale, cb, w1t, w2, b2, s1, s2, norm_scale,
               norm_bias] = o;
  auto bad = [name](const std::string& what) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(name) + ": " + what);
  };
  const int64_t d = c1.dimensions()[0], r = c1.dimensions()[1];
  if (!NormFits(norm_scale, norm_bias, d)) {
    return bad("the norm's scale and bias must be [d]");
  }
  const bool q8_controller = c2.element_type() == ffi::DataType::S8;
  const int64_t F = q8_controller
                        ? static_cast<int64_t>(c2_scale.element_count())
                        : c2.dimensions()[1];
  if (d <= 0 || x_count % d != 0) return bad("x's last axis is not d");
  const int64_t T = x_count / d;
  if (q8_controller) {
    if (std::string what = PackedProblem("C2", c2.dimensions(), r, F);
        !what.empty()) {
      return bad(what);
    }
  } else if (c2.element_type() != ffi::DataType::F32) {
    return bad("C2 must be f32 or packed s8");
  }
  if (w1t.element_type() != w2.element_type()) {
    return bad("W1ᵀ and W2 differ in type");
  }
  if (block <= 0 || F % block) {
    return bad("block size must divide d_ff");
  }
  const int64_t n_blocks = F / block;
  thread_local std::vector<float> normed;
  const float* xp = NormRows(x_in, T, d, norm_scale, norm_bias, epsilon,
                             &normed);
  // The call's buffers, reused from call to call: at 17B the logits and the
  // chunks' rows are 0.3 and 0.15 MB, fresh pages (faults, clearing) each
  // call if allocated. Helpers reach them through these references.
  thread_local std::vector<float> low_buf, logits_buf, partial_buf;
  std::vector<float>& low = low_buf;
  std::vector<float>& logits = logits_buf;
  std::vector<float>& partial = partial_buf;
  low.resize(T * r);
  logits.resize(T * F);
  Isa isa = CurrentIsa();
  // Controller: (x C1) C2 + c, never the d x F product C1 C2.
  // Few rows: the columns of C1 in two halves over the pool (more reads in
  // flight; each column's sum is the same).
  const int64_t half = r / 2 / 16 * 16;
  if (T < kManyRows && half > 0 &&
      d * r * static_cast<int64_t>(sizeof(float)) >= g_parallel_bytes.load()) {
    ParallelFor(pool, 2, [&](int64_t c) {
      Panel(isa, xp, T, d, c1.typed_data(), r, low.data(), r,
            c == 0 ? 0 : half, c == 0 ? half : r);
    });
  } else {
    Matmul<float>(nullptr, xp, T, d, c1.typed_data(), r, low.data(), r);
  }
  if (q8_controller) {
    const std::vector<float> ones(r, 1.f);
    Q8Out o{c2_scale.typed_data(), nullptr, 1, F, logits.data()};
    Q8Matmul(pool, low.data(), T, ones.data(), 1, r,
             static_cast<const int8_t*>(c2.untyped_data()), c2.dimensions()[0],
             c2.dimensions()[1] * 4, o);
  } else {
    Matmul<float>(pool, low.data(), T, r,
                  static_cast<const float*>(c2.untyped_data()), F,
                  logits.data(), F);
  }
  const float* cbp = cb.typed_data();
  const float* s1p = s1.typed_data();
  const float* s2p = s2.typed_data();
  const float* b2p = b2.typed_data();
  return Dispatch(w1t.element_type(), name, [&](auto tag) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    const W* w1p = static_cast<const W*>(w1t.untyped_data());
    const W* w2p = static_cast<const W*>(w2.untyped_data());
    // The blocks go in kFFChunks fixed chunks, each summing into its own
    // row; y = b2 + the chunks' rows in order: the same bits whether the
    // chunks ran on one thread or several.
    const int64_t n_chunks = std::min(kFFChunks, n_blocks);
    const int64_t per_chunk = (n_blocks + n_chunks - 1) / n_chunks;
    partial.resize(n_chunks * d);
    // Bytes of the selected rows of W1ᵀ and W2 that one token reads.
    const bool parallel = n_blocks * 2 * d * static_cast<int64_t>(sizeof(W)) >=
                          g_parallel_bytes.load();
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = xp + t * d;
      const float* lt = logits.data() + t * F;
      std::fill(partial.begin(), partial.end(), 0.f);
      ParallelFor(parallel ? pool : nullptr, n_chunks, [&](int64_t c) {
        float* yc = partial.data() + c * d;
        const int64_t k0 = c * per_chunk;
        const int64_t k1 = std::min(n_blocks, (c + 1) * per_chunk);
        if (k0 >= k1) return;
        // The chunk's rows: one per block (its first maximum), then their
        // W1ᵀ dot products, then the W2 rows that the ReLU passes, in
        // block order (each row's sum into yc as Axpy alone gives).
        std::vector<const W*> w1_rows(k1 - k0), w2_rows;
        std::vector<float> h(k1 - k0), a;
        std::vector<int64_t> rows(k1 - k0);
        for (int64_t k = k0; k < k1; ++k) {
          rows[k - k0] =
              k * block + BlockArgmax(isa, lt + k * block, cbp + k * block, block);
          w1_rows[k - k0] = w1p + rows[k - k0] * d;
        }
        const int64_t n = k1 - k0;
        for (int64_t i = 0; i < n; i += kFFRows) {
          const int m = static_cast<int>(std::min<int64_t>(kFFRows, n - i));
          const int m_next =
              static_cast<int>(std::min<int64_t>(kFFRows, n - i - m));
          DotRows(isa, w1_rows.data() + i, m, w1_rows.data() + i + m, m_next,
                  xt, d, h.data() + i);
        }
        for (int64_t i = 0; i < n; ++i) {
          const float hi = s1p[rows[i]] * h[i];
          if (hi > 0.f) {
            a.push_back(hi * s2p[rows[i]]);
            w2_rows.push_back(w2p + rows[i] * d);
          }
        }
        const int64_t n2 = static_cast<int64_t>(w2_rows.size());
        for (int64_t i = 0; i < n2; i += kFFRows) {
          const int m = static_cast<int>(std::min<int64_t>(kFFRows, n2 - i));
          const int m_next =
              static_cast<int>(std::min<int64_t>(kFFRows, n2 - i - m));
          AxpyRows(isa, a.data() + i, w2_rows.data() + i, m,
                   w2_rows.data() + i + m, m_next, yc, d);
        }
      });
      float* yt = yp + t * d;
      std::copy(b2p, b2p + d, yt);
      for (int64_t c = 0; c < n_chunks; ++c) {
        const float* yc = partial.data() + c * d;
        for (int64_t i = 0; i < d; ++i) yt[i] += yc[i];
      }
    }
  });
}

ffi::Error SparseFFImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                        ffi::Buffer<ffi::F32> c1, ffi::AnyBuffer c2,
                        ffi::Buffer<ffi::F32> c2_scale,
                        ffi::Buffer<ffi::F32> cb, ffi::AnyBuffer w1t,
                        ffi::AnyBuffer w2, ffi::Buffer<ffi::F32> b2,
                        ffi::Buffer<ffi::F32> s1, ffi::Buffer<ffi::F32> s2,
                        ffi::Buffer<ffi::F32> norm_scale,
                        ffi::Buffer<ffi::F32> norm_bias,
                        ffi::ResultBuffer<ffi::F32> y, int64_t block,
                        float epsilon) {
  return SparseFFStep(&pool, "tf_sparse_ff", x.typed_data(), x.element_count(),
                      {c1, c2, c2_scale, cb, w1t, w2, b2, s1, s2, norm_scale,
                       norm_bias},
                      y->typed_data(), block, epsilon);
}

// x [T, K], g [S, K] (float32, or int8 with g_scale [S]: one scale per
// row; else g_scale is a dummy [1]), P [G, Kp / 4, 16, 4] int8 (output-major,
// see "The Q8 GEMV"), w_scale [N], b [S * N] or [1] (no bias) -> y [T, S * N].
ffi::Error Q8MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                        ffi::AnyBuffer g, ffi::Buffer<ffi::F32> g_scale,
                        ffi::Buffer<ffi::S8> p,
                        ffi::Buffer<ffi::F32> w_scale, ffi::Buffer<ffi::F32> b,
                        ffi::ResultBuffer<ffi::F32> y) {
  auto bad = [](const std::string& what) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tf_q8_matmul: " + what);
  };
  auto pd = p.dimensions();
  auto gd = g.dimensions();
  if (gd.size() != 2) return bad("g must be [S, K]");
  const int64_t S = gd[0], K = gd[1];
  const bool g_int8 = g.element_type() == ffi::DataType::S8;
  if (!g_int8 && g.element_type() != ffi::DataType::F32) {
    return bad("g must be float32 or int8");
  }
  if (g_int8 && static_cast<int64_t>(g_scale.element_count()) != S) {
    return bad("an int8 g [S, K] needs S row scales");
  }
  const int64_t N = w_scale.element_count();
  if (std::string what = PackedProblem("W", pd, K, N); !what.empty()) {
    return bad(what);
  }
  const int64_t kp = pd[1] * 4, n_groups = pd[0];
  if (x.element_count() % K != 0) return bad("x's last axis is not K");
  const int64_t T = x.element_count() / K;
  // else a dummy [1]
  const bool bias = static_cast<int64_t>(b.element_count()) == S * N;
  Q8Out out{w_scale.typed_data(), bias ? b.typed_data() : nullptr, S, N,
            y->typed_data()};
  Q8Matmul(&pool, x.typed_data(), T,
           g_int8 ? nullptr : static_cast<const float*>(g.untyped_data()), S, K,
           p.typed_data(), n_groups, kp, out,
           g_int8 ? static_cast<const int8_t*>(g.untyped_data()) : nullptr,
           g_int8 ? g_scale.typed_data() : nullptr);
  return ffi::Error::Success();
}


// The patches of one convolution (ModuleConv, layers.conv_patches) at the
// last position of `image` [B, F, S, M]: row b * S + s holds, for dl < F and
// dm < W, image[b, dl, s + dm - (W - 1) / 2, :] (zeros past the modules),
// F * W * M inputs in the order of the flat kernel [F, W, M, M].
void ConvPatches(const float* image, int64_t B, int64_t F, int64_t S,
                 int64_t M, int64_t W, float* patches) {
  const int64_t width = F * W * M;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      float* row = patches + (b * S + s) * width;
      for (int64_t dl = 0; dl < F; ++dl) {
        for (int64_t dm = 0; dm < W; ++dm) {
          float* to = row + (dl * W + dm) * M;
          const int64_t src = s + dm - (W - 1) / 2;
          if (src < 0 || src >= S) {
            std::fill(to, to + M, 0.f);
          } else {
            const float* from = image + ((b * F + dl) * S + src) * M;
            std::copy(from, from + M, to);
          }
        }
      }
    }
  }
}

// The sparse QKV step (paper §3.2, Fig. 4b) of one new position per row, in
// one call, its matrices stored 'q8' (layers.KernelSparseQKV): the
// multiplicative layer y = Q8((x D[s]) E) + b [B, S, M]; the image of the
// F - 1 kept inputs and y; the patches of its last position, multiplied by
// the Q and K kernels side by side (one product, the patches quantized
// once) and, with their own patches, by the V kernel; the kept inputs shift
// by one. Each product is tf_q8_matmul's on the same operands (the same
// bits as the three calls it replaces), without XLA's patch tensors.
// x [B, d], D int8 [S, d] with row scales [S], E packed (d -> M) with its
// scales [M] and bias [S * M], kept [B, F - 1, S, M], the Q/K kernels
// packed (F qk_width M -> 2 M), scales and bias [2 M], the V kernel packed
// (F v_width M -> M), scales and bias [M] -> q, k, v [B, S * M], kept'.
struct SparseQKVOperands {
  ffi::Buffer<ffi::S8> dg;
  ffi::Buffer<ffi::F32> dg_scale;
  ffi::Buffer<ffi::S8> e;
  ffi::Buffer<ffi::F32> e_scale, e_bias, kept;
  ffi::Buffer<ffi::S8> qk;
  ffi::Buffer<ffi::F32> qk_scale, qk_bias;
  ffi::Buffer<ffi::S8> v;
  ffi::Buffer<ffi::F32> v_scale, v_bias;
};

// The shape of a sparse QKV step's image, its convolutions' input: B rows,
// F positions (the F - 1 kept inputs and the new one), S modules of M
// features.
struct ImageShape {
  int64_t B, F, S, M;
};

// "" when x [B, d] and the multiplicative layer's operands of `o` (a
// SparseQKVOperands or SparseQOperands: D [S, d] and its scales [S], E
// packed (d -> M) with its scales [M] and bias [S * M], the kept inputs
// [B, F - 1, S, M]) agree; their shape at *shape.
template <typename O>
std::string CheckMultiplicative(int64_t x_count, const O& o,
                                ImageShape* shape) {
  auto gd = o.dg.dimensions();
  auto kd = o.kept.dimensions();
  if (gd.size() != 2 || kd.size() != 4 || kd[1] < 1) {
    return "D must be [S, d] and the kept inputs [B, F - 1, S, M]";
  }
  const int64_t S = gd[0], K = gd[1], B = kd[0], M = kd[3];
  if (kd[2] != S || x_count != B * K ||
      static_cast<int64_t>(o.dg_scale.element_count()) != S) {
    return "x must be [B, d], D's scales [S] and the kept inputs "
           "[B, F - 1, S, M]";
  }
  if (static_cast<int64_t>(o.e_scale.element_count()) != M ||
      static_cast<int64_t>(o.e_bias.element_count()) != S * M) {
    return "E's scales and bias must be [M] and [S * M]";
  }
  *shape = {B, kd[1] + 1, S, M};
  return PackedProblem("E", o.e.dimensions(), K, M);
}

// y = Q8((x D[s]) E) + b [B, S, M] (tf_q8_matmul's product) from `o`'s
// multiplicative layer, the image [B, F, S, M] of its kept inputs and y,
// and the kept inputs shifted by one at kept_out. Returns the image (a
// buffer reused from call to call).
template <typename O>
const float* MultiplicativeImage(ffi::ThreadPool* pool, const float* xp,
                                 const ImageShape& s, const O& o,
                                 float* kept_out) {
  const auto [B, F, S, M] = s;
  thread_local std::vector<float> y, image;
  y.resize(B * S * M);
  image.resize(B * F * S * M);
  Q8Matmul(pool, xp, B, nullptr, S, o.dg.dimensions()[1], o.e.typed_data(),
           o.e.dimensions()[0], o.e.dimensions()[1] * 4,
           Q8Out{o.e_scale.typed_data(), o.e_bias.typed_data(), S, M, y.data()},
           o.dg.typed_data(), o.dg_scale.typed_data());
  const int64_t plane = S * M;  // One position of the image.
  for (int64_t b = 0; b < B; ++b) {
    float* to = image.data() + b * F * plane;
    std::copy(o.kept.typed_data() + b * (F - 1) * plane,
              o.kept.typed_data() + (b + 1) * (F - 1) * plane, to);
    std::copy(y.data() + b * plane, y.data() + (b + 1) * plane,
              to + (F - 1) * plane);
    std::copy(to + plane, to + F * plane, kept_out + b * (F - 1) * plane);
  }
  return image.data();
}

// A convolution at the image's last position: its patches (ConvPatches,
// module kernel width `width`) times its packed kernels (F width M ->
// n_out), as tf_q8_matmul computes it with g = ones -> out [B * S, n_out].
void ConvolveImage(ffi::ThreadPool* pool, const float* image,
                   const ImageShape& s, int64_t width,
                   const ffi::Buffer<ffi::S8>& p,
                   const ffi::Buffer<ffi::F32>& scale,
                   const ffi::Buffer<ffi::F32>& bias, int64_t n_out,
                   float* out) {
  const auto [B, F, S, M] = s;
  const int64_t k_in = F * width * M;
  thread_local std::vector<float> patches, ones;
  patches.resize(B * S * k_in);
  ConvPatches(image, B, F, S, M, width, patches.data());
  if (static_cast<int64_t>(ones.size()) < k_in) ones.assign(k_in, 1.f);
  Q8Matmul(pool, patches.data(), B * S, ones.data(), 1, k_in, p.typed_data(),
           p.dimensions()[0], p.dimensions()[1] * 4,
           Q8Out{scale.typed_data(), bias.typed_data(), 1, n_out, out});
}

std::string SparseQKVStep(ffi::ThreadPool* pool, const float* xp,
                          int64_t x_count, const SparseQKVOperands& o,
                          int64_t qk_width, int64_t v_width, float* q_out,
                          float* k_out, float* v_out, float* kept_out) {
  const auto& [dg, dg_scale, e, e_scale, e_bias, kept, qk, qk_scale, qk_bias,
               v, v_scale, v_bias] = o;
  ImageShape s;
  if (std::string what = CheckMultiplicative(x_count, o, &s); !what.empty()) {
    return what;
  }
  const auto [B, F, S, M] = s;
  if (static_cast<int64_t>(qk_scale.element_count()) != 2 * M ||
      static_cast<int64_t>(qk_bias.element_count()) != 2 * M ||
      static_cast<int64_t>(v_scale.element_count()) != M ||
      static_cast<int64_t>(v_bias.element_count()) != M) {
    return "scales and biases must be the Q/K kernels' [2 M] and the V "
           "kernel's [M]";
  }
  if (qk_width < 1 || qk_width > S || v_width < 1 || v_width > S) {
    return "module kernel widths must be in [1, S]";
  }
  if (std::string what = PackedProblem("Q/K kernels", qk.dimensions(),
                                       F * qk_width * M, 2 * M);
      !what.empty()) {
    return what;
  }
  if (std::string what = PackedProblem("V kernel", v.dimensions(),
                                       F * v_width * M, M);
      !what.empty()) {
    return what;
  }
  const float* image = MultiplicativeImage(pool, xp, s, o, kept_out);
  thread_local std::vector<float> qk_y;
  qk_y.resize(B * S * 2 * M);
  ConvolveImage(pool, image, s, qk_width, qk, qk_scale, qk_bias, 2 * M,
                qk_y.data());
  for (int64_t r = 0; r < B * S; ++r) {
    const float* from = qk_y.data() + r * 2 * M;
    std::copy(from, from + M, q_out + r * M);
    std::copy(from + M, from + 2 * M, k_out + r * M);
  }
  ConvolveImage(pool, image, s, v_width, v, v_scale, v_bias, M, v_out);
  return "";
}

ffi::Error SparseQKVImpl(
    ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> dg,
    ffi::Buffer<ffi::F32> dg_scale, ffi::Buffer<ffi::S8> e,
    ffi::Buffer<ffi::F32> e_scale, ffi::Buffer<ffi::F32> e_bias,
    ffi::Buffer<ffi::F32> kept, ffi::Buffer<ffi::S8> qk,
    ffi::Buffer<ffi::F32> qk_scale, ffi::Buffer<ffi::F32> qk_bias,
    ffi::Buffer<ffi::S8> v, ffi::Buffer<ffi::F32> v_scale,
    ffi::Buffer<ffi::F32> v_bias, ffi::ResultBuffer<ffi::F32> q_out,
    ffi::ResultBuffer<ffi::F32> k_out, ffi::ResultBuffer<ffi::F32> v_out,
    ffi::ResultBuffer<ffi::F32> kept_out, int64_t qk_width, int64_t v_width) {
  std::string what = SparseQKVStep(
      &pool, x.typed_data(), x.element_count(),
      {dg, dg_scale, e, e_scale, e_bias, kept, qk, qk_scale, qk_bias, v,
       v_scale, v_bias},
      qk_width, v_width, q_out->typed_data(), k_out->typed_data(),
      v_out->typed_data(), kept_out->typed_data());
  if (!what.empty()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tf_sparse_qkv: " + what);
  }
  return ffi::Error::Success();
}


// Causal attention of T queries per row over a cache (CacheAttentionImpl):
// qp [N, T, D], kp and vp [N, M, D], mp [N, M] (nullptr: every key valid),
// query t at position first + t -> op [N, T, D].
// exp(x) lane by lane (Cephes' expf: x = n ln 2 + r, |r| <= ln 2 / 2, a
// degree-6 polynomial for exp(r), times 2^n; within 2 ulp); exp(x) for
// x < -104 is 0 (below the smallest denormal), x > 88.72 is clamped.
TF_AVX512 inline __m512 Exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.f)),
                    _mm512_set1_ps(88.72f));
  const __m512 n = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// dots[j] = <q, k_j> / root (-1e9 where valid[j] is false) for keys
// j < count of one head, 16 keys at a time: their 16 sums stay in registers
// over D and are reduced together (Reduce16), not one horizontal sum per key.
TF_AVX512 void AttendDotsAvx512(const float* q, const float* k,
                                const bool* valid, int64_t D, int64_t count,
                                float root, float* dots) {
  const int64_t nc = (D + 15) / 16;
  const __mmask16 tail =
      D % 16 == 0 ? 0xFFFF : static_cast<__mmask16>((1u << (D % 16)) - 1);
  const __m512 inv_root = _mm512_set1_ps(1.f / root);
  for (int64_t j0 = 0; j0 < count; j0 += 16) {
    const int r = static_cast<int>(std::min<int64_t>(16, count - j0));
    __m512 m[16];
    for (int i = 0; i < 16; ++i) m[i] = _mm512_setzero_ps();
    // Key by key: the 16 keys are one contiguous stretch of the cache, read
    // in order (q's vectors come from L1).
    for (int i = 0; i < r; ++i) {
      const float* ki = k + (j0 + i) * D;
      for (int64_t c = 0; c < nc; ++c) {
        const __mmask16 mc = c + 1 == nc ? tail : 0xFFFF;
        m[Q8Slot(i)] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mc, ki + 16 * c),
                                       _mm512_maskz_loadu_ps(mc, q + 16 * c),
                                       m[Q8Slot(i)]);
      }
    }
    __m512 d = _mm512_mul_ps(Reduce16(m, AddPs()), inv_root);
    if (valid != nullptr) {
      __mmask16 ok = 0;
      for (int i = 0; i < r; ++i) ok |= valid[j0 + i] ? (1u << i) : 0u;
      d = _mm512_mask_blend_ps(ok, _mm512_set1_ps(-1e9f), d);
    }
    _mm512_mask_storeu_ps(dots + j0, static_cast<__mmask16>((1u << r) - 1), d);
  }
}

// out = sum_j w[j] v_j over keys j < count with w[j] != 0, the NC vectors of
// out in registers for the whole sum (D <= 16 NC).
template <int NC>
TF_AVX512 void WeightedSumAvx512(const float* w, const float* v, int64_t D,
                                 int64_t count, float* out) {
  const __mmask16 tail =
      D % 16 == 0 ? 0xFFFF : static_cast<__mmask16>((1u << (D % 16)) - 1);
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < count; ++j) {
    if (w[j] == 0.f) continue;
    const __m512 wj = _mm512_set1_ps(w[j]);
    for (int c = 0; c < NC; ++c) {
      acc[c] = _mm512_fmadd_ps(
          wj, _mm512_maskz_loadu_ps(c + 1 == NC ? tail : 0xFFFF, v + j * D + 16 * c),
          acc[c]);
    }
  }
  for (int c = 0; c < NC; ++c) {
    _mm512_mask_storeu_ps(out + 16 * c, c + 1 == NC ? tail : 0xFFFF, acc[c]);
  }
}

template <int... NC>
TF_AVX512 void WeightedSum(std::integer_sequence<int, NC...>, const float* w,
                           const float* v, int64_t D, int64_t count,
                           float* out) {
  const int64_t nc = (D + 15) / 16;
  ((nc == NC + 1 ? WeightedSumAvx512<NC + 1>(w, v, D, count, out) : void()),
   ...);
}

// Most d_head the AVX-512 attention keeps in registers (16 vectors).
constexpr int64_t kAttendMaxD = 256;

// The softmax of one head's dots over keys j < count (in place: e_j =
// exp(dots_j - max) (Exp16), weights e_j / sum_e), then out = the weighted
// sum of its values v [count, D] (WeightedSumAvx512); AVX-512, D <= 256.
TF_AVX512 void SoftmaxValuesAvx512(float* dots, const float* v, int64_t D,
                                   int64_t count, float* out) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < count; j += 16) {
    const __mmask16 m = count - j >= 16 ? 0xFFFF
        : static_cast<__mmask16>((1u << (count - j)) - 1);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, dots + j));
  }
  float amax = _mm512_reduce_max_ps(vmax);
  if (!std::isfinite(amax)) amax = 0.f;
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < count; j += 16) {
    const __mmask16 m = count - j >= 16 ? 0xFFFF
        : static_cast<__mmask16>((1u << (count - j)) - 1);
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, dots + j),
                                         _mm512_set1_ps(amax)));
    _mm512_mask_storeu_ps(dots + j, m, e);
    vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, e));
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(vsum));
  for (int64_t j = 0; j < count; j += 16) {
    const __mmask16 m = count - j >= 16 ? 0xFFFF
        : static_cast<__mmask16>((1u << (count - j)) - 1);
    _mm512_mask_storeu_ps(dots + j, m,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dots + j), inv));
  }
  WeightedSum(std::make_integer_sequence<int, kAttendMaxD / 16>(), dots, v, D,
              count, out);
}

// The same on any path: weights exp(dots - logsumexp(dots)) (Trax's), then
// the AVX-512 code where it runs.
void SoftmaxValues(Isa isa, float* dots, const float* v, int64_t D,
                   int64_t count, float* out) {
  if (isa == Isa::kAvx512 && D <= kAttendMaxD) {
    SoftmaxValuesAvx512(dots, v, D, count, out);
    return;
  }
  float amax = -INFINITY;
  for (int64_t j = 0; j < count; ++j) amax = std::max(amax, dots[j]);
  if (!std::isfinite(amax)) amax = 0.f;
  float total = 0.f;
  for (int64_t j = 0; j < count; ++j) total += std::exp(dots[j] - amax);
  const float lse = std::log(total) + amax;
  std::fill(out, out + D, 0.f);
  for (int64_t j = 0; j < count; ++j) {
    float w = std::exp(dots[j] - lse);
    if (w != 0.f) Axpy(isa, w, v + j * D, out, D);
  }
}

void AttendCache(ffi::ThreadPool* pool, const float* qp, const float* kp,
                 const float* vp, const bool* mp, int64_t N, int64_t T,
                 int64_t D, int64_t M, int64_t first, float* op) {
  const float root = std::sqrt(static_cast<float>(D));
  const int64_t filled = first + T;
  Isa isa = CurrentIsa();
  // Rows split over the pool when their filled keys and values are large.
  bool parallel = N * filled * D * 2 * 4 >= g_parallel_bytes.load();
  ParallelFor(parallel ? pool : nullptr, N, [=](int64_t n) {
    // Each thread's buffer, reused from row to row and call to call.
    thread_local std::vector<float> dots;
    dots.resize(filled + 16);
    const float* kn = kp + n * M * D;
    const float* vn = vp + n * M * D;
    for (int64_t t = 0; t < T; ++t) {
      const float* qt = qp + (n * T + t) * D;
      float* ot = op + (n * T + t) * D;
      const int64_t count = first + t + 1;
      if (isa == Isa::kAvx512 && D <= kAttendMaxD) {
        AttendDotsAvx512(qt, kn, mp == nullptr ? nullptr : mp + n * M, D,
                         count, root, dots.data());
      } else {
        for (int64_t j = 0; j < count; ++j) {
          float v = Dot(isa, kn + j * D, qt, D) / root;
          if (mp != nullptr && !mp[n * M + j]) v = -1e9f;
          dots[j] = v;
        }
      }
      SoftmaxValues(isa, dots.data(), vn, D, count, ot);
    }
  });
}

// Attention of one query per head over keys stored transposed, as
// CrossAttention keeps the encoder's (layers/cross_attention.py): q [N, D],
// keys_t [N, D, L], values [N, L, D], mask [N / heads, L] (a row per batch
// row, 0: padding; nullptr: none) -> out [N, D]. Trax's _per_head_attention:
// dots = q keys_t / sqrt(D), -1e9 where the mask is 0, weights exp(dots -
// logsumexp(dots)) times the values. The dots accumulate row by row of
// keys_t (contiguous in L).
void AttendKeysT(ffi::ThreadPool* pool, const float* qp, const float* ktp,
                 const float* vp, const float* mask, int64_t heads, int64_t N,
                 int64_t D, int64_t L, float* op) {
  const float root = std::sqrt(static_cast<float>(D));
  const Isa isa = CurrentIsa();
  bool parallel = N * L * D * 2 * 4 >= g_parallel_bytes.load();
  ParallelFor(parallel ? pool : nullptr, N, [=](int64_t n) {
    thread_local std::vector<float> dots;  // As AttendCache's.
    dots.assign(L + 16, 0.f);
    const float* qn = qp + n * D;
    const float* kn = ktp + n * D * L;
    for (int64_t i = 0; i < D; ++i) Axpy(isa, qn[i], kn + i * L, dots.data(), L);
    const float* mn = mask == nullptr ? nullptr : mask + (n / heads) * L;
    for (int64_t j = 0; j < L; ++j) {
      dots[j] = (mn != nullptr && mn[j] == 0.f) ? -1e9f : dots[j] / root;
    }
    SoftmaxValues(isa, dots.data(), vp + n * L * D, D, L, op + n * D);
  });
}

// Causal softmax attention of a few queries over a key/value cache, read in
// place: q [N, T, D], keys and values [N, M, D] (the whole cache, written by
// the step's in-place dynamic-update-slice), valid [N, M] (pred; [1]: every
// key valid), idx [] (position of query 0) -> out [N, T, D]. Query t of row
// n reads keys 0 .. idx + t only (the filled part of the cache, no copy of
// it): dots <q, k_j> / sqrt(D), -1e9 where a key is not valid, weights
// exp(dots - logsumexp(dots)), out = sum_j weights_j v_j.
ffi::Error CacheAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                              ffi::Buffer<ffi::F32> keys,
                              ffi::Buffer<ffi::F32> values,
                              ffi::Buffer<ffi::PRED> valid,
                              ffi::Buffer<ffi::S32> idx,
                              ffi::ResultBuffer<ffi::F32> out) {
  auto bad = [](const std::string& what) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tf_cache_attention: " + what);
  };
  auto qd = q.dimensions();
  auto kd = keys.dimensions();
  if (qd.size() != 3 || kd.size() != 3 || qd[0] != kd[0] || qd[2] != kd[2]) {
    return bad("q must be [N, T, D] and the caches [N, M, D]");
  }
  if (values.dimensions().size() != 3 || values.dimensions()[1] != kd[1] ||
      values.element_count() != keys.element_count()) {
    return bad("keys and values differ in shape");
  }
  const int64_t N = qd[0], T = qd[1], D = qd[2], M = kd[1];
  const bool masked = static_cast<int64_t>(valid.element_count()) == N * M;
  if (!masked && valid.element_count() != 1) {
    return bad("valid must be [N, M] or [1]");
  }
  const int64_t first = *idx.typed_data();
  if (first < 0 || first + T > M) return bad("positions outside the cache");
  AttendCache(&pool, q.typed_data(), keys.typed_data(), values.typed_data(),
              masked ? valid.typed_data() : nullptr, N, T, D, M, first,
              out->typed_data());
  return ffi::Error::Success();
}

// A sparse QKV attention step (paper §3.2, Fig. 4b) of one position per
// row in one call (layers.KernelSparseQKVAttention): sparse QKV's step
// (SparseQKVStep, tf_sparse_qkv's operands), its keys and values written
// into the caches at position idx (the results keys' and values' alias the
// caches: written in place), then the attention of its queries over the
// filled part of the caches (AttendCache, tf_cache_attention's). The heads
// are the Q/K/V features in rows of D: keys and values [N, L, D] with N D
// = B S M (N = B heads), valid [N, L] (pred; [1]: every key valid), idx []
// -> y [B, 1, S M] (the heads merged), keys', values', kept'.
struct CacheOperands {
  ffi::Buffer<ffi::F32> keys, values;
  ffi::Buffer<ffi::PRED> valid;
  ffi::Buffer<ffi::S32> idx;
  ffi::Buffer<ffi::F32> norm_scale, norm_bias;
};

// The step on x_count / d rows at x_in (d: D's columns): y [B, 1, S M]
// (y_count floats), the caches written at keys_out and values_out (the
// results that alias them), kept_out; "" or what is wrong.
std::string SparseQKVAttentionStep(
    ffi::ThreadPool* pool, const float* x_in, int64_t x_count,
    const SparseQKVOperands& o, const CacheOperands& c, int64_t qk_width,
    int64_t v_width, float epsilon, float* y, int64_t y_count,
    float* keys_out, float* values_out, float* kept_out) {
  auto kd = c.keys.dimensions();
  const int64_t features = y_count;  // B S M
  if (kd.size() != 3 || c.values.element_count() != c.keys.element_count() ||
      kd[0] * kd[2] != features) {
    return "keys and values must be [N, L, D] with N D = B S M";
  }
  const int64_t N = kd[0], L = kd[1], D = kd[2];
  const bool masked = static_cast<int64_t>(c.valid.element_count()) == N * L;
  if (!masked && c.valid.element_count() != 1) {
    return "valid must be [N, L] or [1]";
  }
  const int64_t first = *c.idx.typed_data();
  if (first < 0 || first >= L) return "position outside the cache";
  const int64_t d = o.dg.dimensions().size() == 2 ? o.dg.dimensions()[1] : 0;
  if (d <= 0 || !NormFits(c.norm_scale, c.norm_bias, d) || x_count % d != 0) {
    return "x must be [B, d] and the norm's scale and bias [d]";
  }
  thread_local std::vector<float> q, k, v_new, normed;
  q.resize(features);
  k.resize(features);
  v_new.resize(features);
  const float* xp = NormRows(x_in, x_count / d, d, c.norm_scale, c.norm_bias,
                             epsilon, &normed);
  std::string what = SparseQKVStep(pool, xp, x_count, o, qk_width, v_width,
                                   q.data(), k.data(), v_new.data(), kept_out);
  if (!what.empty()) return what;
  for (int64_t n = 0; n < N; ++n) {
    std::copy(k.data() + n * D, k.data() + (n + 1) * D,
              keys_out + (n * L + first) * D);
    std::copy(v_new.data() + n * D, v_new.data() + (n + 1) * D,
              values_out + (n * L + first) * D);
  }
  AttendCache(pool, q.data(), keys_out, values_out,
              masked ? c.valid.typed_data() : nullptr, N, 1, D, L, first, y);
  return "";
}

ffi::Error SparseQKVAttentionImpl(
    ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> dg,
    ffi::Buffer<ffi::F32> dg_scale, ffi::Buffer<ffi::S8> e,
    ffi::Buffer<ffi::F32> e_scale, ffi::Buffer<ffi::F32> e_bias,
    ffi::Buffer<ffi::F32> kept, ffi::Buffer<ffi::S8> qk,
    ffi::Buffer<ffi::F32> qk_scale, ffi::Buffer<ffi::F32> qk_bias,
    ffi::Buffer<ffi::S8> v, ffi::Buffer<ffi::F32> v_scale,
    ffi::Buffer<ffi::F32> v_bias, ffi::Buffer<ffi::F32> keys,
    ffi::Buffer<ffi::F32> values, ffi::Buffer<ffi::PRED> valid,
    ffi::Buffer<ffi::S32> idx, ffi::Buffer<ffi::F32> norm_scale,
    ffi::Buffer<ffi::F32> norm_bias, ffi::ResultBuffer<ffi::F32> y,
    ffi::ResultBuffer<ffi::F32> keys_out,
    ffi::ResultBuffer<ffi::F32> values_out,
    ffi::ResultBuffer<ffi::F32> kept_out, int64_t qk_width, int64_t v_width,
    float epsilon) {
  std::string what = SparseQKVAttentionStep(
      &pool, x.typed_data(), x.element_count(),
      {dg, dg_scale, e, e_scale, e_bias, kept, qk, qk_scale, qk_bias, v,
       v_scale, v_bias},
      {keys, values, valid, idx, norm_scale, norm_bias}, qk_width, v_width,
      epsilon, y->typed_data(), y->element_count(), keys_out->typed_data(),
      values_out->typed_data(), kept_out->typed_data());
  if (!what.empty()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tf_sparse_qkv_attention: " + what);
  }
  return ffi::Error::Success();
}

// A dense layer stored 'q8' (layers.KernelDense): packed W, its output
// scales [N] and bias [N] (or [1]: none).
struct Q8Dense {
  ffi::Buffer<ffi::S8> p;
  ffi::Buffer<ffi::F32> scale, bias;
};

// y [T, N] = x [T, K] W + b as tf_q8_matmul computes it (g = ones [1, K]).
std::string Q8DenseStep(ffi::ThreadPool* pool, const Q8Dense& w,
                        const float* x, int64_t T, int64_t K, float* y) {
  const int64_t N = w.scale.element_count();
  if (std::string what = PackedProblem("W", w.p.dimensions(), K, N);
      !what.empty()) {
    return what;
  }
  thread_local std::vector<float> ones;
  if (static_cast<int64_t>(ones.size()) < K) ones.assign(K, 1.f);
  const bool bias = static_cast<int64_t>(w.bias.element_count()) == N;
  Q8Matmul(pool, x, T, ones.data(), 1, K, w.p.typed_data(),
           w.p.dimensions()[0], w.p.dimensions()[1] * 4,
           Q8Out{w.scale.typed_data(), bias ? w.bias.typed_data() : nullptr,
                 1, N, y});
  return "";
}

// The Terraformer's low-rank SRU path (§4.3, low_rank_sru.py) of one
// position per row: LayerNorm, Dense(d_model -> n), the SRU cell from its
// state c [T, n] (Trax's tl.SRU: [r~ | f~ | x~] = h W + b, r = σ(r~),
// f = σ(f~), c' = f c + (1 - f) x~, out = r g(c') + (1 - r) h α), then
// Dense(n -> d_model): x [T, d] -> y [T, d], c' at c_out.
struct SruOperands {
  ffi::Buffer<ffi::F32> norm_scale, norm_bias;
  Q8Dense down;
  ffi::Buffer<ffi::F32> w, b, c;
  Q8Dense up;
};

std::string SruStep(ffi::ThreadPool* pool, const SruOperands& o,
                    const float* x, int64_t T, int64_t d, float epsilon,
                    float highway_scale, bool use_tanh, float* y,
                    float* c_out) {
  const int64_t n = o.down.scale.element_count();
  if (!NormFits(o.norm_scale, o.norm_bias, d) ||
      o.w.element_count() != static_cast<size_t>(n * 3 * n) ||
      o.b.element_count() != static_cast<size_t>(3 * n) ||
      o.c.element_count() != static_cast<size_t>(T * n) ||
      o.up.scale.element_count() != static_cast<size_t>(d)) {
    return "the SRU's operands must be a norm [d], Dense(d -> n), W [n, 3 n], "
           "b [3 n], c [B, n] and Dense(n -> d)";
  }
  thread_local std::vector<float> normed, h, gates, out;
  const float* xp = NormRows(x, T, d, o.norm_scale, o.norm_bias, epsilon,
                             &normed);
  h.resize(T * n);
  gates.resize(3 * n);
  out.resize(T * n);
  if (std::string what = Q8DenseStep(pool, o.down, xp, T, d, h.data());
      !what.empty()) {
    return "SRU's first dense layer: " + what;
  }
  const float* w = o.w.typed_data();
  const float* b = o.b.typed_data();
  const float* c = o.c.typed_data();
  auto sigmoid = [](float v) { return 1.f / (1.f + std::exp(-v)); };
  for (int64_t t = 0; t < T; ++t) {
    const float* ht = h.data() + t * n;
    for (int64_t j = 0; j < 3 * n; ++j) {
      float sum = 0.f;
      for (int64_t i = 0; i < n; ++i) sum += ht[i] * w[i * 3 * n + j];
      gates[j] = sum + b[j];
    }
    for (int64_t j = 0; j < n; ++j) {
      const float r = sigmoid(gates[j]), f = sigmoid(gates[n + j]);
      const float cj = f * c[t * n + j] + (1.f - f) * gates[2 * n + j];
      c_out[t * n + j] = cj;
      out[t * n + j] =
          r * (use_tanh ? std::tanh(cj) : cj) + (1.f - r) * ht[j] * highway_scale;
    }
  }
  if (std::string what = Q8DenseStep(pool, o.up, out.data(), T, n, y);
      !what.empty()) {
    return "SRU's second dense layer: " + what;
  }
  return "";
}

// An encoder-decoder attention step with sparse queries (models/common.py's
// cross_attention with cross_attention_sparsity: Trax's AttentionQKV with
// q_sparsity, result_sparsity='noop') of one position per row: LayerNorm,
// sparse QKV's multiplicative layer and the queries' convolution (the
// products of SparseQKVStep, one output), then attention over the
// encoder's keys and values as CrossAttention keeps them (AttendKeysT); no
// output layer. Operands: D, its scales, E packed, its scales and bias, the
// kept inputs, the Q kernel packed (F q_width M -> M), its scales and bias;
// the encoder's keys [B, H, D, L] and values [B, H, L, D], its mask [B, L]
// (float, 0: padding), the norm's scale and bias.
struct SparseQOperands {
  ffi::Buffer<ffi::S8> dg;
  ffi::Buffer<ffi::F32> dg_scale;
  ffi::Buffer<ffi::S8> e;
  ffi::Buffer<ffi::F32> e_scale, e_bias, kept;
  ffi::Buffer<ffi::S8> q;
  ffi::Buffer<ffi::F32> q_scale, q_bias;
};

struct EncoderOperands {
  ffi::Buffer<ffi::F32> keys_t, values, mask, norm_scale, norm_bias;
};

// The step on x_count / d rows at x_in: y [B, 1, d] (the heads merged),
// kept_out; "" or what is wrong.
std::string CrossAttentionStep(ffi::ThreadPool* pool, const float* x_in,
                               int64_t x_count, const SparseQOperands& o,
                               const EncoderOperands& c, int64_t q_width,
                               float epsilon, float* y, float* kept_out) {
  ImageShape s;
  if (std::string what = CheckMultiplicative(x_count, o, &s); !what.empty()) {
    return what;
  }
  const auto [B, F, S, M] = s;
  const int64_t d = o.dg.dimensions()[1];
  if (!NormFits(c.norm_scale, c.norm_bias, d)) {
    return "the norm's scale and bias must be [d]";
  }
  if (static_cast<int64_t>(o.q_scale.element_count()) != M ||
      static_cast<int64_t>(o.q_bias.element_count()) != M) {
    return "the Q kernel's scales and bias must be [M]";
  }
  if (q_width < 1 || q_width > S) return "module kernel widths must be in [1, S]";
  if (std::string what = PackedProblem("Q kernel", o.q.dimensions(),
                                       F * q_width * M, M);
      !what.empty()) {
    return what;
  }
  auto kd = c.keys_t.dimensions();
  auto vd = c.values.dimensions();
  if (kd.size() != 4 || vd.size() != 4 || kd[0] != B || kd[1] * kd[2] != d ||
      vd[0] != B || vd[1] != kd[1] || vd[2] != kd[3] || vd[3] != kd[2]) {
    return "the encoder's keys must be [B, H, D, L] and its values "
           "[B, H, L, D], H D = d";
  }
  const int64_t H = kd[1], D = kd[2], L = kd[3];
  if (static_cast<int64_t>(c.mask.element_count()) != B * L) {
    return "the encoder's mask must have B L elements";
  }
  thread_local std::vector<float> normed, q;
  const float* xp = NormRows(x_in, B, d, c.norm_scale, c.norm_bias, epsilon,
                             &normed);
  const float* image = MultiplicativeImage(pool, xp, s, o, kept_out);
  q.resize(B * S * M);
  ConvolveImage(pool, image, s, q_width, o.q, o.q_scale, o.q_bias, M,
                q.data());
  AttendKeysT(pool, q.data(), c.keys_t.typed_data(), c.values.typed_data(),
              c.mask.typed_data(), H, B * H, D, L, y);
  return "";
}

// Reads a call's operands in order (RemainingArgs), once Check has found
// each of the element type it should have (then every read decodes).
class ArgReader {
 public:
  using Type = ffi::DataType;
  static constexpr Type kF32 = Type::F32, kS8 = Type::S8;
  // Either float32 or int8 (the sparse FF's C2, W1ᵀ and W2).
  static constexpr Type kAny = Type::INVALID;
  static constexpr Type kSparseQKV[] = {kS8, kF32, kS8, kF32, kF32, kF32,
                                        kS8, kF32, kF32, kS8, kF32, kF32};
  static constexpr Type kCache[] = {kF32, kF32, Type::PRED, Type::S32,
                                    kF32, kF32};
  // C1, C2, C2's scales, c, W1ᵀ, W2, b2, s1, s2, norm scale and bias.
  static constexpr Type kSparseFF[] = {kF32, kAny, kF32, kF32, kAny, kAny,
                                       kF32, kF32, kF32, kF32, kF32};
  static constexpr Type kDense[] = {kS8, kF32, kF32};
  static constexpr Type kSparseQ[] = {kS8, kF32, kS8, kF32, kF32,
                                      kF32, kS8, kF32, kF32};
  static constexpr Type kEncoder[] = {kF32, kF32, kF32, kF32, kF32};

  // A Scaling Transformer block's operand types (tf_scaling_block): x,
  // the attention's, with `cross` the cross-attention's, the sparse FF's.
  static std::vector<Type> ScalingBlockTypes(bool cross) {
    std::vector<Type> t = {kF32};
    t.insert(t.end(), std::begin(kSparseQKV), std::end(kSparseQKV));
    t.insert(t.end(), std::begin(kCache), std::end(kCache));
    if (cross) {
      t.insert(t.end(), std::begin(kSparseQ), std::end(kSparseQ));
      t.insert(t.end(), std::begin(kEncoder), std::end(kEncoder));
    }
    t.insert(t.end(), std::begin(kSparseFF), std::end(kSparseFF));
    return t;
  }

  explicit ArgReader(const ffi::RemainingArgs& args) : args_(args) {}

  // "" when operand i has types[i] for every i and there are no others.
  std::string Check(const std::vector<Type>& types) const {
    if (types.size() != args_.size()) {
      return "expected " + std::to_string(types.size()) + " operands, got " +
             std::to_string(args_.size());
    }
    for (size_t i = 0; i < types.size(); ++i) {
      auto any = args_.get<ffi::AnyBuffer>(i);
      if (!any.has_value()) return "operand " + std::to_string(i) + " is not a buffer";
      const Type t = any->element_type();
      const bool ok = types[i] == kAny ? (t == kF32 || t == kS8 || t == Type::BF16)
                                       : t == types[i];
      if (!ok) return "operand " + std::to_string(i) + " has the wrong type";
    }
    return "";
  }

  template <typename T>
  T Next() { return *args_.get<T>(next_++); }

  SparseQKVOperands SparseQKV() {
    return {Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::S8>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>()};
  }
  CacheOperands Cache() {
    return {Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::PRED>>(), Next<ffi::Buffer<ffi::S32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>()};
  }
  SparseFFOperands SparseFF() {
    return {Next<ffi::Buffer<ffi::F32>>(), Next<ffi::AnyBuffer>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::AnyBuffer>(),        Next<ffi::AnyBuffer>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>()};
  }
  SparseQOperands SparseQ() {
    return {Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>()};
  }
  EncoderOperands Encoder() {
    return {Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>()};
  }
  Q8Dense Dense() {
    return {Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>()};
  }

 private:
  const ffi::RemainingArgs& args_;
  size_t next_ = 0;
};

// The n float32 results of a call (RemainingRets): their data at out[i]
// and element counts at count[i]; "" or what is wrong.
std::string ResultBuffers(const ffi::RemainingRets& rets, size_t n,
                          float** out, int64_t* count) {
  if (rets.size() != n) {
    return "expected " + std::to_string(n) + " results, got " +
           std::to_string(rets.size());
  }
  for (size_t i = 0; i < n; ++i) {
    auto r = rets.get<ffi::Buffer<ffi::F32>>(i);
    if (!r.has_value()) {
      return "result " + std::to_string(i) + ": " + r.error().message();
    }
    out[i] = (*r)->typed_data();
    count[i] = (*r)->element_count();
  }
  return "";
}

// A whole Terraformer decoder block (§4.1-4.3; models/terraformer.py's
// _DecoderBlock) of one position per row, in one call: on the reversible
// streams (x1, x2),
//   y = x1 + A(LN_a(x2)),  z = x2 + B(LN_b(y)),
//   w = y + (SparseFF(LN_f(z)) + SRU(LN_s(z))),  (x1', x2') = (z, w),
// A and B the two sparse QKV attentions (SparseQKVAttentionStep), the sparse
// FF block (SparseFFStep, its C2 packed) and the low-rank SRU (SruStep):
// the same operations as their own calls, in the block's order.
// Operands: x1, x2 [B, 1, d]; A's and B's 12 sparse QKV operands, then
// keys, values, valid, idx, norm scale, norm bias; the sparse FF's C1, C2,
// C2's scales, c, W1ᵀ, W2, b2, s1, s2, norm scale, norm bias; the SRU's
// norm scale and bias, its first dense layer (packed, scales, bias), W, b,
// c, its second dense layer. Results: x1', x2', A's keys', values',
// kept', B's, and the SRU's c' (the caches alias their operands).
ffi::Error TerraformerBlockImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                                ffi::RemainingRets rets, int64_t qk_width,
                                int64_t v_width, int64_t block,
                                float epsilon, float highway_scale,
                                bool use_tanh) {
  auto bad = [](const std::string& what) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tf_terraformer_block: " + what);
  };
  using R = ArgReader;
  // The operands' element types, in order (built once).
  static const std::vector<R::Type> types = [] {
    std::vector<R::Type> t = {R::kF32, R::kF32};  // x1, x2
    for (int attention = 0; attention < 2; ++attention) {
      t.insert(t.end(), std::begin(R::kSparseQKV), std::end(R::kSparseQKV));
      t.insert(t.end(), std::begin(R::kCache), std::end(R::kCache));
    }
    t.insert(t.end(), std::begin(R::kSparseFF), std::end(R::kSparseFF));
    // The SRU: norm, dense, W, b, c, dense.
    t.insert(t.end(), {R::kF32, R::kF32});
    t.insert(t.end(), std::begin(R::kDense), std::end(R::kDense));
    t.insert(t.end(), {R::kF32, R::kF32, R::kF32});
    t.insert(t.end(), std::begin(R::kDense), std::end(R::kDense));
    return t;
  }();
  ArgReader in(args);
  if (std::string what = in.Check(types); !what.empty()) return bad(what);
  auto x1 = in.Next<ffi::Buffer<ffi::F32>>();
  auto x2 = in.Next<ffi::Buffer<ffi::F32>>();
  const SparseQKVOperands qkv_a = in.SparseQKV();
  const CacheOperands cache_a = in.Cache();
  const SparseQKVOperands qkv_b = in.SparseQKV();
  const CacheOperands cache_b = in.Cache();
  const SparseFFOperands ff_ops = in.SparseFF();
  // Members in declaration order (braced initializers run left to right).
  const SruOperands sru{in.Next<ffi::Buffer<ffi::F32>>(),
                        in.Next<ffi::Buffer<ffi::F32>>(), in.Dense(),
                        in.Next<ffi::Buffer<ffi::F32>>(),
                        in.Next<ffi::Buffer<ffi::F32>>(),
                        in.Next<ffi::Buffer<ffi::F32>>(), in.Dense()};
  constexpr size_t kResults = 9;
  float* out[kResults];
  int64_t out_count[kResults];
  if (std::string what = ResultBuffers(rets, kResults, out, out_count);
      !what.empty()) {
    return bad(what);
  }
  const int64_t count = x1.element_count();
  const auto c1_dims = ff_ops.c1.dimensions();
  const int64_t d = c1_dims.size() == 2 ? c1_dims[0] : 0;
  if (d <= 0 || count % d != 0 || x2.element_count() != x1.element_count() ||
      out_count[0] != count || out_count[1] != count) {
    return bad("x1, x2 and their results must be [B, 1, d], d C1's rows");
  }
  const int64_t T = count / d;
  thread_local std::vector<float> y, f_out, ff, sru_y;
  y.resize(count);
  f_out.resize(count);
  ff.resize(count);
  sru_y.resize(count);
  const float* x1p = x1.typed_data();
  const float* x2p = x2.typed_data();
  // y = x1 + A(x2)
  std::string what = SparseQKVAttentionStep(
      &pool, x2p, count, qkv_a, cache_a, qk_width, v_width, epsilon,
      f_out.data(), count, out[2], out[3], out[4]);
  if (!what.empty()) return bad("attention 1: " + what);
  for (int64_t i = 0; i < count; ++i) y[i] = x1p[i] + f_out[i];
  // x1' = z = x2 + B(y)
  what = SparseQKVAttentionStep(&pool, y.data(), count, qkv_b, cache_b,
                                qk_width, v_width, epsilon, f_out.data(),
                                count, out[5], out[6], out[7]);
  if (!what.empty()) return bad("attention 2: " + what);
  float* z = out[0];
  for (int64_t i = 0; i < count; ++i) z[i] = x2p[i] + f_out[i];
  // x2' = w = y + (FF(z) + SRU(z))
  ffi::Error error =
      SparseFFStep(&pool, "tf_terraformer_block: sparse FF", z, count, ff_ops,
                   ff.data(), block, epsilon);
  if (error.failure()) return error;
  if (out_count[8] != static_cast<int64_t>(sru.c.element_count())) {
    return bad("the SRU's c' must have c's shape");
  }
  what = SruStep(&pool, sru, z, T, d, epsilon, highway_scale, use_tanh,
                 sru_y.data(), out[8]);
  if (!what.empty()) return bad(what);
  float* w = out[1];
  for (int64_t i = 0; i < count; ++i) w[i] = y[i] + (ff[i] + sru_y[i]);
  return ffi::Error::Success();
}

// A Scaling Transformer decoder block (models/scaling_transformer.py's
// _Block or _EncoderDecoderBlock: sparse QKV attention, sparse FF, with an
// encoder the sparse-query cross-attention) of one position per row, in one
// call:
//   a = x + A(LN_a(x)),  b = a + C(LN_c(a)) (with `cross`; else b = a),
//   y = b + FF(LN_f(b)),
// A the sparse QKV attention (SparseQKVAttentionStep), C the cross-attention
// (CrossAttentionStep), FF the sparse FF block (SparseFFStep, C2 packed):
// the operations of their own calls, in the block's order (tl.Residual's
// sums; Dropout is the identity when decoding).
// Operands: x [B, 1, d]; A's 12 sparse QKV operands, then keys, values,
// valid, idx, norm scale, norm bias; with `cross` C's 9 sparse query
// operands, then the encoder's keys, values, mask, norm scale, norm bias;
// the sparse FF's C1, C2, C2's scales, c, W1ᵀ, W2, b2, s1, s2, norm scale,
// norm bias. Results: y, A's keys', values', kept' (the caches alias their
// operands), with `cross` C's kept'.
ffi::Error ScalingBlockImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                            ffi::RemainingRets rets, int64_t qk_width,
                            int64_t v_width, int64_t q_width, int64_t block,
                            float epsilon, bool cross) {
  auto bad = [](const std::string& what) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tf_scaling_block: " + what);
  };
  using R = ArgReader;
  // The operands' element types, in order (built once), without and with
  // the cross-attention.
  static const std::vector<R::Type> types[2] = {
      R::ScalingBlockTypes(false), R::ScalingBlockTypes(true)};
  ArgReader in(args);
  if (std::string what = in.Check(types[cross]); !what.empty()) {
    return bad(what);
  }
  auto x = in.Next<ffi::Buffer<ffi::F32>>();
  const SparseQKVOperands qkv = in.SparseQKV();
  const CacheOperands cache = in.Cache();
  std::optional<SparseQOperands> sparse_q;
  std::optional<EncoderOperands> encoder;
  if (cross) {
    sparse_q.emplace(in.SparseQ());
    encoder.emplace(in.Encoder());
  }
  const SparseFFOperands ff_ops = in.SparseFF();
  float* out[5];
  int64_t out_count[5];
  if (std::string what = ResultBuffers(rets, cross ? 5 : 4, out, out_count);
      !what.empty()) {
    return bad(what);
  }
  const int64_t count = x.element_count();
  if (out_count[0] != count) return bad("y must have x's shape");
  if (cross && out_count[4] !=
                   static_cast<int64_t>(sparse_q->kept.element_count())) {
    return bad("the cross-attention's kept' must have its kept's shape");
  }
  thread_local std::vector<float> a, b, f_out;
  a.resize(count);
  f_out.resize(count);
  const float* xp = x.typed_data();
  // a = x + A(x)
  std::string what = SparseQKVAttentionStep(
      &pool, xp, count, qkv, cache, qk_width, v_width, epsilon, f_out.data(),
      count, out[1], out[2], out[3]);
  if (!what.empty()) return bad("attention: " + what);
  for (int64_t i = 0; i < count; ++i) a[i] = xp[i] + f_out[i];
  const float* bp = a.data();
  // b = a + C(a)
  if (cross) {
    what = CrossAttentionStep(&pool, a.data(), count, *sparse_q, *encoder,
                              q_width, epsilon, f_out.data(), out[4]);
    if (!what.empty()) return bad("cross-attention: " + what);
    b.resize(count);
    for (int64_t i = 0; i < count; ++i) b[i] = a[i] + f_out[i];
    bp = b.data();
  }
  // y = b + FF(b)
  ffi::Error error = SparseFFStep(&pool, "tf_scaling_block: sparse FF", bp,
                                  count, ff_ops, f_out.data(), block, epsilon);
  if (error.failure()) return error;
  float* y = out[0];
  for (int64_t i = 0; i < count; ++i) y[i] = bp[i] + f_out[i];
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_skinny_matmul, SkinnyMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_q8_matmul, Q8MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_sparse_ff, SparseFFImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block")
                                  .Attr<float>("epsilon"));

// The pool and sparse QKV's 13 operands (SparseQKVStep's), the binding both
// of its handlers start with.
inline auto BindSparseQKV() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::S8>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::S8>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::S8>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::S8>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_sparse_qkv, SparseQKVImpl,
                              BindSparseQKV()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("qk_width")
                                  .Attr<int64_t>("v_width"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_sparse_qkv_attention, SparseQKVAttentionImpl,
                              BindSparseQKV()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("qk_width")
                                  .Attr<int64_t>("v_width")
                                  .Attr<float>("epsilon"));

// The binding both whole-block handlers start with: the pool, their
// operands and results (read by ArgReader), sparse QKV's kernel widths.
inline auto BindBlock() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .RemainingArgs()
      .RemainingRets()
      .Attr<int64_t>("qk_width")
      .Attr<int64_t>("v_width");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_terraformer_block, TerraformerBlockImpl,
                              BindBlock()
                                  .Attr<int64_t>("block")
                                  .Attr<float>("epsilon")
                                  .Attr<float>("highway_scale")
                                  .Attr<bool>("use_tanh"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_scaling_block, ScalingBlockImpl,
                              BindBlock()
                                  .Attr<int64_t>("q_width")
                                  .Attr<int64_t>("block")
                                  .Attr<float>("epsilon")
                                  .Attr<bool>("cross"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_cache_attention, CacheAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// The instruction set in use: 0 scalar, 1 AVX2, 2 AVX-512. Setting a level
// the CPU lacks keeps the best supported one. Returns the level now in use.
extern "C" int tf_set_isa(int level) {
  int best = static_cast<int>(DetectIsa());
  if (level >= 0) g_isa.store(std::min(level, best));
  return g_isa.load();
}

// Bytes of W from which a product is split over the thread pool; a
// negative value keeps it. Returns the value in use.
extern "C" int64_t tf_set_parallel_bytes(int64_t bytes) {
  if (bytes >= 0) g_parallel_bytes.store(bytes);
  return g_parallel_bytes.load();
}

// The Q8 GEMV's instruction set: 0 scalar, 1 AVX2, 2 AVX-512 VNNI. Setting
// a level the CPU lacks keeps the best supported one. Returns the level now
// in use.
extern "C" int tf_set_gemv_isa(int level) {
  int best = static_cast<int>(DetectGemvIsa());
  if (level >= 0) g_gemv_isa.store(std::min(level, best));
  return g_gemv_isa.load();
}
