// Vector operations over single rows of weights (float32, bfloat16 or
// int8): dot products and axpys, a few rows at a time (the sparse FF
// step's), and the first argmax of a block.
#ifndef TERRAFORMER_KERNELS_ROW_OPS_H_
#define TERRAFORMER_KERNELS_ROW_OPS_H_

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "isa.h"

namespace terraformer::kernels {

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

TF_AVX512 inline int64_t BlockArgmaxAvx512(const float* l, const float* c, int64_t n) {
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

}  // namespace terraformer::kernels

#endif  // TERRAFORMER_KERNELS_ROW_OPS_H_
