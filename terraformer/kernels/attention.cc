// Attention of a decoding step's queries (steps.h): over a key/value cache
// read in place (its filled part only) and over the encoder's keys stored
// transposed; softmax as Trax's, AVX-512's exp where it runs.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "isa.h"
#include "parallel.h"
#include "row_ops.h"
#include "steps.h"

namespace terraformer::kernels {

namespace {

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
}  // namespace

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

}  // namespace terraformer::kernels
