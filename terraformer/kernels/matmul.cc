// Float products of a decoding step (gemv.h): panels of a wide W streamed
// past a few rows, and many rows blocked in registers.
#include <algorithm>
#include <cstdint>

#include "gemv.h"
#include "isa.h"
#include "parallel.h"

namespace terraformer::kernels {

namespace {

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

}  // namespace

template <typename W>
void Panel(Isa isa, const float* xs, int64_t R, int64_t K, const W* w,
           int64_t N, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  switch (isa) {
    case Isa::kAvx512: return PanelAvx512(xs, R, K, w, N, y, ldy, n0, n1);
    case Isa::kAvx2: return PanelAvx2(xs, R, K, w, N, y, ldy, n0, n1);
    default: return PanelScalar(xs, R, K, w, N, y, ldy, n0, n1);
  }
}

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

template void Panel<float>(Isa, const float*, int64_t, int64_t, const float*,
                           int64_t, float*, int64_t, int64_t, int64_t);
template void Matmul<float>(ffi::ThreadPool*, const float*, int64_t, int64_t,
                            const float*, int64_t, float*, int64_t);
template void Matmul<uint16_t>(ffi::ThreadPool*, const float*, int64_t,
                               int64_t, const uint16_t*, int64_t, float*,
                               int64_t);
template void Matmul<int8_t>(ffi::ThreadPool*, const float*, int64_t, int64_t,
                             const int8_t*, int64_t, float*, int64_t);

}  // namespace terraformer::kernels
