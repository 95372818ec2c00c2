// The peak multiply-add rates of the kernels' instructions (gemv.h):
// what a compute-bound product can reach on this CPU, registers only.
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "gemv.h"
#include "isa.h"
#include "tiles.h"

namespace terraformer::kernels {

// The peak int8 multiply-add rate of each path's instruction, one thread:
// kPeakChains independent accumulations (more than an instruction's latency
// times its issue rate, so none waits on its own result), registers only.
// VNNI: vpdpbusd, 64 multiply-adds; AVX2: maddubs, madd, add, 32; scalar:
// one int32 multiply-add; AMX: tdpbssd on whole tiles, 16 x 16 x 64 (the
// Q8 path's tiles hold one block, half of that), 4 accumulating tiles. And
// float32's FMA: 16, 8 or 1 multiply-adds. A step's compute bound divides
// its multiply-adds by them.

namespace {

constexpr int kPeakChains = 16;

TF_VNNI int64_t PeakVnni(int64_t n) {
  __m512i acc[kPeakChains];
  for (int j = 0; j < kPeakChains; ++j) acc[j] = _mm512_set1_epi32(j);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi32(0x01020304);
  for (int64_t i = 0; i < n; ++i) {
    // Opaque operands: the loop is not folded or hoisted.
    asm volatile("" : "+v"(w), "+v"(x));
    for (int j = 0; j < kPeakChains; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], w, x);
  }
  for (int j = 1; j < kPeakChains; ++j) acc[0] = _mm512_add_epi32(acc[0], acc[j]);
  return _mm512_reduce_add_epi32(acc[0]);
}

TF_AVX2 int64_t PeakAvx2(int64_t n) {
  __m256i acc[kPeakChains];
  for (int j = 0; j < kPeakChains; ++j) acc[j] = _mm256_set1_epi32(j);
  __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi32(0x01020304);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < n; ++i) {
    asm volatile("" : "+x"(w), "+x"(x));
    for (int j = 0; j < kPeakChains; ++j) {
      acc[j] = _mm256_add_epi32(
          acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
    }
  }
  for (int j = 1; j < kPeakChains; ++j) acc[0] = _mm256_add_epi32(acc[0], acc[j]);
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  int64_t sum = 0;
  for (int32_t v : lanes) sum += v;
  return sum;
}

TF_AVX512 float PeakFloatAvx512(int64_t n) {
  __m512 acc[kPeakChains];
  for (int j = 0; j < kPeakChains; ++j) acc[j] = _mm512_set1_ps(j);
  __m512 w = _mm512_set1_ps(0.5f), x = _mm512_set1_ps(0.25f);
  for (int64_t i = 0; i < n; ++i) {
    asm volatile("" : "+v"(w), "+v"(x));
    for (int j = 0; j < kPeakChains; ++j) acc[j] = _mm512_fmadd_ps(w, x, acc[j]);
  }
  for (int j = 1; j < kPeakChains; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  return _mm512_reduce_add_ps(acc[0]);
}

TF_AVX2 float PeakFloatAvx2(int64_t n) {
  __m256 acc[kPeakChains];
  for (int j = 0; j < kPeakChains; ++j) acc[j] = _mm256_set1_ps(j);
  __m256 w = _mm256_set1_ps(0.5f), x = _mm256_set1_ps(0.25f);
  for (int64_t i = 0; i < n; ++i) {
    asm volatile("" : "+x"(w), "+x"(x));
    for (int j = 0; j < kPeakChains; ++j) acc[j] = _mm256_fmadd_ps(w, x, acc[j]);
  }
  for (int j = 1; j < kPeakChains; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  float sum = 0.f;
  for (float v : lanes) sum += v;
  return sum;
}

// tdpbssd: sums 0-3 += A tiles 4, 5 times B tiles 6, 7, each 16 rows of
// 64 bytes, loaded once.
constexpr int64_t kTileMacs = 4 * kTileMaxRows * kTileMaxRows * kTileRowBytes;

template <typename Tiles>
inline int64_t PeakTiles(int64_t n) {
  TileConfig config;
  for (int t = 0; t < kTiles; ++t) config.Set(t, kTileMaxRows, kTileRowBytes);
  alignas(64) int8_t operand[kTileMaxRows * kTileRowBytes];
  for (int i = 0; i < kTileMaxRows * kTileRowBytes; ++i) operand[i] = i % 7 - 3;
  alignas(64) int32_t sums[kTileMaxRows * kTileRowBytes / 4];
  Tiles t;
  t.Configure(config);
  t.template Load<4>(operand, kTileRowBytes);
  t.template Load<5>(operand, kTileRowBytes);
  t.template Load<6>(operand, kTileRowBytes);
  t.template Load<7>(operand, kTileRowBytes);
  t.template Zero<0>();
  t.template Zero<1>();
  t.template Zero<2>();
  t.template Zero<3>();
  for (int64_t i = 0; i < n; ++i) {
    t.template Dpbssd<0, 4, 6>();
    t.template Dpbssd<1, 4, 7>();
    t.template Dpbssd<2, 5, 6>();
    t.template Dpbssd<3, 5, 7>();
  }
  t.template Store<3>(sums, kTileRowBytes);
  t.Release();
  return sums[0];
}

TF_AMX __attribute__((flatten)) int64_t PeakAmx(int64_t n) {
  return PeakTiles<AmxTiles>(n);
}

// One multiply-add a chain and a round, not vectorized (T int32_t: the
// scalar Q8 path's; float: the scalar float path's).
template <typename T>
T PeakScalar(int64_t n, T w, T x) {
  T acc[kPeakChains];
  for (int j = 0; j < kPeakChains; ++j) acc[j] = static_cast<T>(j);
  for (int64_t i = 0; i < n; ++i) {
    asm volatile("" : "+g"(w), "+g"(x));
    for (int j = 0; j < kPeakChains; ++j) acc[j] += w * x;
    asm volatile("" : "+m"(acc));
  }
  T sum = 0;
  for (T v : acc) sum += v;
  return sum;
}

// Multiply-adds per second of run(iterations), `per_iteration` each; its
// result is kept live so that the loop is not removed.
template <typename Run>
double PeakRate(Run run, int64_t iterations, int64_t per_iteration) {
  static std::atomic<int64_t> g_sink{0};
  const auto start = std::chrono::steady_clock::now();
  const auto result = run(iterations);
  const double seconds = std::chrono::duration<double>(
      std::chrono::steady_clock::now() - start).count();
  g_sink.fetch_add(static_cast<int64_t>(result), std::memory_order_relaxed);
  return seconds > 0 ? static_cast<double>(iterations) * per_iteration / seconds
                     : 0.0;
}

}  // namespace

double Float32PeakMacs(Isa isa, int64_t iterations) {
  switch (isa) {
    case Isa::kAvx512:
      return PeakRate(PeakFloatAvx512, iterations, kPeakChains * 16);
    case Isa::kAvx2: return PeakRate(PeakFloatAvx2, iterations, kPeakChains * 8);
    default:
      return PeakRate([](int64_t n) { return PeakScalar(n, 0.5f, 0.25f); },
                      iterations, kPeakChains);
  }
}

double Int8PeakMacs(GemvIsa isa, int64_t iterations) {
  switch (isa) {
    case GemvIsa::kAmx:
      // Only where the tiles are usable (a fault otherwise).
      if (ProbeCpu().amx) return PeakRate(PeakAmx, iterations, kTileMacs);
      return Int8PeakMacs(VectorGemvIsa(isa), iterations);
    case GemvIsa::kAmxEmulated:
      return PeakRate(PeakTiles<EmulatedTiles>, iterations, kTileMacs);
    case GemvIsa::kAvx512Vnni:
      return PeakRate(PeakVnni, iterations, kPeakChains * 64);
    case GemvIsa::kAvx2: return PeakRate(PeakAvx2, iterations, kPeakChains * 32);
    default:
      return PeakRate([](int64_t n) { return PeakScalar<int32_t>(n, 3, 5); },
                      iterations, kPeakChains);
  }
}

}  // namespace terraformer::kernels
