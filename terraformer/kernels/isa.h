// The instruction sets the kernels use and what they share: the target
// attributes (each function compiles for its own set, so one library runs
// on every x86-64), the CPU probe and the sets in use, weights loaded as
// float, and AVX-512's reduction of 16 vectors at once.
#ifndef TERRAFORMER_KERNELS_ISA_H_
#define TERRAFORMER_KERNELS_ISA_H_

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace terraformer::kernels {

#define TF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TF_AVX2 __attribute__((target("avx2,fma")))
#define TF_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

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

// The instruction sets the kernels use, as this CPU has them; amx:
// AMX-TILE and AMX-INT8, enabled by the OS and granted to this process.
struct CpuFeatures {
  bool avx2, avx512, avx512_vnni, amx;
};

CpuFeatures ProbeCpu();

enum class Isa { kScalar, kAvx2, kAvx512 };

// The best float path this CPU has.
Isa DetectIsa();

// Set by tf_set_isa (tests force the fallbacks); starts at the best one.
extern std::atomic<int> g_isa;

inline Isa CurrentIsa() { return static_cast<Isa>(g_isa.load()); }

// The Q8 GEMV's paths (q8_gemv.cc), in the order of GEMV_ISA_NAMES
// (kernels/__init__.py). kAmx: AMX tiles (tdpbssd, q8_amx.cc) for the
// products of kQ8ManyRows rows or more, the best vector path for the rest;
// kAmxEmulated: the same tile code with each tile instruction done in
// plain C++ (tiles.h), on any CPU: how tests check it where there is no AMX.
enum class GemvIsa { kScalar, kAvx2, kAvx512Vnni, kAmx, kAmxEmulated };

// The best Q8 GEMV path this CPU has (never the emulated one).
GemvIsa DetectGemvIsa();

// The path tf_set_gemv_isa sets for `want`: itself where this CPU has it
// (the emulated tiles: always), else the best it has.
GemvIsa UsableGemvIsa(GemvIsa want);

inline bool IsTileGemv(GemvIsa isa) {
  return isa == GemvIsa::kAmx || isa == GemvIsa::kAmxEmulated;
}

// The vector path under `isa`: itself, or for a tile path the best vector
// path this CPU has (which quantizes the rows and multiplies the products
// the tiles leave).
GemvIsa VectorGemvIsa(GemvIsa isa);

// Set by tf_set_gemv_isa (tests force the fallbacks); starts at the best.
extern std::atomic<int> g_gemv_isa;

inline GemvIsa CurrentGemvIsa() {
  return static_cast<GemvIsa>(g_gemv_isa.load());
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

}  // namespace terraformer::kernels

#endif  // TERRAFORMER_KERNELS_ISA_H_
