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
//
// Vectorized with AVX-512 (F/BW/VL) or AVX2+FMA, chosen at run time with
// __builtin_cpu_supports; plain loops otherwise. Large products are split
// over XLA's intra-op thread pool (chunks taken from an atomic counter, so
// the call never waits for a task that has not started).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
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

enum class Isa { kScalar, kAvx2, kAvx512 };

Isa DetectIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return Isa::kAvx2;
  }
  return Isa::kScalar;
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

// From this many rows (and columns of W under one panel) the AVX2 path
// blocks rows in registers (RowsAvx2) and splits row groups over the pool.
constexpr int64_t kManyRows = 8;
constexpr int64_t kRowGroup = 8;

template <typename W>
void Matmul(ffi::ThreadPool* pool, const float* xs, int64_t R, int64_t K,
            const W* w, int64_t N, float* y, int64_t ldy) {
  Isa isa = CurrentIsa();
  if (isa == Isa::kAvx2 && R >= kManyRows && N <= kPanel) {
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

// x [T, d], C1 [d, r], C2 [r, F], c [F], W1ᵀ [F, d], W2 [F, d], b2 [d],
// s1 [F] and s2 [F] (row scales; ones for float weights) -> y [T, d].
ffi::Error SparseFFImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                        ffi::Buffer<ffi::F32> c1, ffi::Buffer<ffi::F32> c2,
                        ffi::Buffer<ffi::F32> cb, ffi::AnyBuffer w1t,
                        ffi::AnyBuffer w2, ffi::Buffer<ffi::F32> b2,
                        ffi::Buffer<ffi::F32> s1, ffi::Buffer<ffi::F32> s2,
                        ffi::ResultBuffer<ffi::F32> y, int64_t block) {
  const int64_t d = c1.dimensions()[0], r = c1.dimensions()[1];
  const int64_t F = c2.dimensions()[1];
  const int64_t T = x.element_count() / d;
  if (w1t.element_type() != w2.element_type()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tf_sparse_ff: W1ᵀ and W2 differ in type");
  }
  if (block <= 0 || F % block) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tf_sparse_ff: block size must divide d_ff");
  }
  const int64_t n_blocks = F / block;
  const float* xp = x.typed_data();
  float* yp = y->typed_data();
  std::vector<float> low(T * r), logits(T * F);
  Isa isa = CurrentIsa();
  // Controller: (x C1) C2 + c, never the d x F product C1 C2.
  Matmul<float>(nullptr, xp, T, d, c1.typed_data(), r, low.data(), r);
  Matmul<float>(&pool, low.data(), T, r, c2.typed_data(), F, logits.data(), F);
  const float* cbp = cb.typed_data();
  const float* s1p = s1.typed_data();
  const float* s2p = s2.typed_data();
  const float* b2p = b2.typed_data();
  return Dispatch(w1t.element_type(), "tf_sparse_ff", [&](auto tag) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    const W* w1p = static_cast<const W*>(w1t.untyped_data());
    const W* w2p = static_cast<const W*>(w2.untyped_data());
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = xp + t * d;
      const float* lt = logits.data() + t * F;
      float* yt = yp + t * d;
      std::copy(b2p, b2p + d, yt);
      for (int64_t k = 0; k < n_blocks; ++k) {
        // First maximum of the block (jnp.argmax's choice).
        int64_t best = k * block;
        float best_v = lt[best] + cbp[best];
        for (int64_t j = best + 1; j < (k + 1) * block; ++j) {
          float v = lt[j] + cbp[j];
          if (v > best_v) best_v = v, best = j;
        }
        float h = s1p[best] * Dot(isa, w1p + best * d, xt, d);
        if (h > 0.f) Axpy(isa, h * s2p[best], w2p + best * d, yt, d);
      }
    }
  });
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_sparse_ff, SparseFFImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block"));

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
