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
// same order on every path: all paths give the same bits.
//
// Paths (GemvIsa): AVX-512 VNNI, AVX2, plain loops, and AMX: the products
// of kQ8ManyRows rows or more in tiles (tdpbssd, q8_amx.cc), the rest on
// the VNNI path; its tile code also runs emulated (tiles.h) on any CPU.
//
// vpdpbusd multiplies unsigned by signed bytes: the weights enter as
// w + 128 (w XOR 0x80) and each block's sum starts at -128 * sum_b q
// (computed once per call), which cancels the offset exactly. AVX2's
// maddubs adds two u8 x s8 products into a saturating int16: |w| times q
// with w's sign (_mm256_sign_epi8) keeps each pair within 2 * 128 * 127 <
// 2^15.

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemv.h"
#include "isa.h"
#include "parallel.h"

namespace terraformer::kernels {

namespace {

constexpr int64_t kQ8Steps = kQ8Block / 4;  // 64-byte loads per block.
// Most activation rows one pass over a group keeps in registers.
constexpr int kQ8RowsVnni = 8;
constexpr int kQ8RowsAvx2 = 2;
// A block whose largest |v| is below this quantizes to zeros (1 / d_b
// would overflow).
constexpr float kQ8Tiny = 1e-30f;


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

// Stores rows [r0, r0 + rows) of group gi's 16 outputs: acc times the
// weights' scales, plus the bias.
TF_VNNI inline void Q8StoreGroup(const __m512* acc, int rows, int64_t r0,
                                 const Q8Out& o, int64_t gi) {
  const int64_t n0 = gi * kQ8Rows;
  const __mmask16 m =
      n0 + kQ8Rows <= o.N ? 0xFFFF : (__mmask16)((1u << (o.N - n0)) - 1);
  const __m512 scale = _mm512_maskz_loadu_ps(m, o.w_scale + n0);
  for (int r = 0; r < rows; ++r) {
    const int64_t row = r0 + r;
    const __m512 bias = o.bias == nullptr ? _mm512_setzero_ps()
        : _mm512_maskz_loadu_ps(m, o.bias + (row % o.S) * o.N + n0);
    _mm512_mask_storeu_ps(o.y + row * o.N + n0, m,
                          _mm512_fmadd_ps(acc[r], scale, bias));
  }
}

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
  Q8StoreGroup(acc, RB, r0, o, gi);
}

// The many-row products' register block: rows [r0, r0 + RB) of `a` times
// the GB groups from gi (weights pg, the next group kp * kQ8Rows bytes on).
// Each weight vector is loaded once for RB rows and each activation
// broadcast once for GB groups: Q8GroupVnni's 8 rows of one group issue a
// broadcast per vpdpbusd, which held a compute-bound product (each weight
// reused by many rows) to about half the instruction's peak. The same
// integer sums and the same float steps in the same order as Q8GroupVnni
// (per block: acc += float(dot) d; last: acc scale + bias): the same bits.
template <int RB, int GB>
TF_VNNI inline void Q8BlockVnni(const Q8Act& a, int64_t r0, const int8_t* pg,
                                const Q8Out& o, int64_t gi) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t group_bytes = a.kp * kQ8Rows;
  const int8_t* xq[RB];
  for (int r = 0; r < RB; ++r) xq[r] = a.q.data() + (r0 + r) * a.kp;
  __m512 acc[GB][RB];
  for (int g = 0; g < GB; ++g) {
    for (int r = 0; r < RB; ++r) acc[g][r] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < a.nb; ++b) {
    const int8_t* pb = pg + b * kQ8Rows * kQ8Block;
    __m512i dot[GB][RB];
    for (int r = 0; r < RB; ++r) {
      const __m512i off = _mm512_set1_epi32(a.off[(r0 + r) * a.nb + b]);
      for (int g = 0; g < GB; ++g) dot[g][r] = off;
    }
    for (int64_t s = 0; s < kQ8Steps; ++s) {
      __m512i w[GB];
      for (int g = 0; g < GB; ++g) {
        w[g] = _mm512_xor_si512(
            _mm512_loadu_si512(pb + g * group_bytes + 64 * s), flip);
      }
      for (int r = 0; r < RB; ++r) {
        const __m512i xb = _mm512_set1_epi32(Load4(xq[r] + b * kQ8Block + 4 * s));
        for (int g = 0; g < GB; ++g) {
          dot[g][r] = _mm512_dpbusd_epi32(dot[g][r], w[g], xb);
        }
      }
    }
    for (int r = 0; r < RB; ++r) {
      const __m512 d = _mm512_set1_ps(a.d[(r0 + r) * a.nb + b]);
      for (int g = 0; g < GB; ++g) {
        acc[g][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[g][r]), d, acc[g][r]);
      }
    }
  }
  for (int g = 0; g < GB; ++g) Q8StoreGroup(acc[g], RB, r0, o, gi + g);
}

// The register block of the many-row products: 4 rows x 3 groups, 12
// accumulating vpdpbusd per 3 weight loads and 4 broadcasts (24 of the 32
// zmm registers hold the sums).
constexpr int kQ8BlockRows = 4;
constexpr int kQ8BlockGroups = 3;

// Groups [g0, g1) times rows [row0, row1) of `a`; `many`: a compute-bound
// product (kQ8ManyRows rows or more), in register blocks where they fit.
TF_VNNI void Q8RangeVnni(const Q8Act& a, const int8_t* p, const Q8Out& o,
                         int64_t g0, int64_t g1, int64_t row0, int64_t row1,
                         bool many) {
  if (many) {
    for (; g0 + kQ8BlockGroups <= g1; g0 += kQ8BlockGroups) {
      const int8_t* pg = p + g0 * a.kp * kQ8Rows;
      int64_t r0 = row0;
      for (; r0 + kQ8BlockRows <= row1; r0 += kQ8BlockRows) {
        Q8BlockVnni<kQ8BlockRows, kQ8BlockGroups>(a, r0, pg, o, g0);
      }
      for (; r0 < row1; ++r0) Q8BlockVnni<1, kQ8BlockGroups>(a, r0, pg, o, g0);
    }
  }
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

// The tile paths read whole tiles of rows: `a`'s rows zero-padded to a
// multiple of kQ8TileRows (resize's new elements are zeros).
void Q8PadRows(Q8Act* a) {
  const int64_t tiles = (a->rows + kQ8TileRows - 1) / kQ8TileRows;
  a->q.resize(tiles * kQ8TileRows * a->kp);
}

// Groups [g0, g1) times rows [row0, row1) of `a` on `isa`'s path; a tile
// path's products of fewer than kQ8ManyRows rows take its vector path.
void Q8Range(GemvIsa isa, const Q8Act& a, const int8_t* p, const Q8Out& o,
             int64_t g0, int64_t g1, int64_t row0, int64_t row1, bool many) {
  if (IsTileGemv(isa)) {
    if (many) {
      return Q8RangeTiles(isa == GemvIsa::kAmx, a, p, o, g0, g1, row0, row1);
    }
    isa = VectorGemvIsa(isa);
  }
  switch (isa) {
    case GemvIsa::kAvx512Vnni:
      return Q8RangeVnni(a, p, o, g0, g1, row0, row1, many);
    case GemvIsa::kAvx2: return Q8RangeAvx2(a, p, o, g0, g1, row0, row1);
    default: return Q8RangeScalar(a, p, o, g0, g1, row0, row1);
  }
}

}  // namespace

// y = the Q8 product of x [T, K] g [S, K] (rows t*S + s) and P (n_groups
// groups of kp inputs). A few rows (memory-bound): the groups split into
// equal contiguous ranges, one per thread of the pool, when the product is
// large enough; many rows: see kQ8ManyRows.
void Q8Matmul(ffi::ThreadPool* pool, const float* x, int64_t T,
              const float* g, int64_t S, int64_t K, const int8_t* p,
              int64_t n_groups, int64_t kp, const Q8Out& o,
              const int8_t* g8, const float* g_scale) {
  const GemvIsa isa = CurrentGemvIsa();
  // The caller's buffers, reused from call to call (no allocation, no page
  // faults); helpers read them through this reference (a lambda naming the
  // thread_local itself would find the helper thread's own).
  thread_local Q8Act caller_act;
  Q8Act& a = caller_act;
  Q8Quantize(pool, VectorGemvIsa(isa), x, T, g, S, K, kp, &a, g8, g_scale);
  // Multiply-adds: bytes of P times rows.
  const bool parallel =
      pool != nullptr && a.rows * n_groups * kQ8Rows * kp >= g_parallel_bytes.load();
  const bool many = a.rows >= kQ8ManyRows;
  const bool tiles = many && IsTileGemv(isa);
  if (tiles) Q8PadRows(&a);
  auto range = [&](int64_t g0, int64_t g1, int64_t row0, int64_t row1) {
    Q8Range(isa, a, p, o, g0, g1, row0, row1, many);
  };
  if (parallel && many) {
    // Two parts of the rows, each a multiple of a pass (a register pass;
    // a tile's rows), times blocks of groups (the VNNI register block's;
    // a tile pass's).
    const int64_t pass = tiles ? kQ8TileRows : kQ8RowsVnni;
    const int64_t per_block = tiles ? kQ8TileGroups : kQ8BlockGroups;
    const int64_t half = (a.rows / 2 + pass - 1) / pass * pass;
    const int64_t blocks = (n_groups + per_block - 1) / per_block;
    ParallelFor(pool, 2 * blocks, [&](int64_t c) {
      const int64_t g0 = c / 2 * per_block;
      const int64_t g1 = std::min<int64_t>(n_groups, g0 + per_block);
      if (c % 2 == 0) return range(g0, g1, 0, half);
      return range(g0, g1, half, a.rows);
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

// The Q8 product alone, timed on the calling thread (gemv.h).
double Q8ProductMacs(int64_t rows, int64_t K, int64_t N, int64_t repeats) {
  const GemvIsa isa = CurrentGemvIsa();
  const int64_t kp = (K + kQ8Block - 1) / kQ8Block * kQ8Block;
  const int64_t n_groups = (N + kQ8Rows - 1) / kQ8Rows;
  uint32_t state = 12345;  // Any values: the time does not depend on them.
  auto next = [&state]() { return state = state * 1664525u + 1013904223u; };
  std::vector<float> x(rows * K), g(K, 1.f), w_scale(N, 1.f), y(rows * N);
  for (float& v : x) v = static_cast<float>(next() >> 8) / (1 << 24) - 0.5f;
  std::vector<int8_t> p(n_groups * kQ8Rows * kp);
  for (int8_t& v : p) v = static_cast<int8_t>(next() % 255 - 127);
  Q8Act a;
  Q8Quantize(nullptr, VectorGemvIsa(isa), x.data(), rows, g.data(), 1, K, kp,
             &a);
  if (rows >= kQ8ManyRows && IsTileGemv(isa)) Q8PadRows(&a);
  const Q8Out o{w_scale.data(), nullptr, 1, N, y.data()};
  std::vector<double> seconds;
  for (int64_t i = 0; i <= repeats; ++i) {  // The first call warms up.
    const auto start = std::chrono::steady_clock::now();
    Q8Range(isa, a, p.data(), o, 0, n_groups, 0, rows, rows >= kQ8ManyRows);
    seconds.push_back(std::chrono::duration<double>(
        std::chrono::steady_clock::now() - start).count());
  }
  seconds.erase(seconds.begin());
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2,
                   seconds.end());
  const double median = seconds[seconds.size() / 2];
  return median > 0 ? static_cast<double>(rows) * K * N / median : 0.0;
}

}  // namespace terraformer::kernels
