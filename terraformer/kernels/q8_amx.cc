// The Q8 GEMV's many-row products in AMX tiles (GemvIsa::kAmx, and
// kAmxEmulated on any CPU): the code is written once over a tile policy
// (tiles.h) and compiled for each.
//
// The packed weights are already AMX's B tiles: the 512 bytes of block b of
// group g (pg + b * kQ8Rows * kQ8Block) are 8 rows of 64 bytes, 4
// consecutive inputs of the group's 16 outputs, i.e. TDPBSSD's B operand
// with 8 rows of 64 bytes (K = 32 in 4-byte dwords). The activations q
// [rows, kp] are the A tiles: 16 rows of one block (32 bytes), stride kp.
// TDPBSSD multiplies signed by signed bytes, as the weights and activations
// are stored: no offset term (VNNI's vpdpbusd needs one), the same int32
// block sums as the other paths.
//
// One block at a time, since each block's sum is scaled by its row's d_b
// before the next: per block, TILEZERO the sums, TILELOADD the A and B
// tiles, TDPBSSD, TILESTORED the sums, then acc += float(sum) * d_b (one
// FMA a lane) and last y = acc * w_scale + bias: the float steps of every
// other path, in the same order, so the same bits. A pass holds 2 row
// tiles x 2 groups: 4 sum tiles from 2 A and 2 B loads (8 tiles in all).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "gemv.h"
#include "tiles.h"

namespace terraformer::kernels {

std::atomic<int64_t> g_emulated_tdpbssd{0};

namespace {

// The tiles: sums 0-3 (row tile r, group g: kC + kQ8TileGroups r + g),
// activations 4-5 (kA + r), weights 6-7 (kB + g).
constexpr int kC = 0, kA = 4, kB = 6;
constexpr int kRowTiles = 2;
constexpr int kGroups = static_cast<int>(kQ8TileGroups);

TileConfig Q8TileConfig() {
  TileConfig c;
  for (int t = kC; t < kA; ++t) c.Set(t, kQ8TileRows, kTileRowBytes);
  for (int t = kA; t < kB; ++t) c.Set(t, kQ8TileRows, kQ8Block);
  for (int t = kB; t < kTiles; ++t) c.Set(t, kQ8Block / 4, kTileRowBytes);
  return c;
}

// f(std::integral_constant<int, i>) for i in [0, N): tile numbers are
// template arguments.
template <typename F, int... I>
inline void UnrollImpl(F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
inline void Unroll(F&& f) {
  UnrollImpl(f, std::make_integer_sequence<int, N>{});
}

// Rows [r0, r0 + RT * 16) of `a` times groups [gi, gi + GT) (weights pg),
// y stored for rows below row1.
template <typename Tiles, int RT, int GT>
inline void Q8TilePass(Tiles& t, const Q8Act& a, int64_t r0, int64_t row1,
                       const int8_t* pg, const Q8Out& o, int64_t gi) {
  constexpr int kRows = RT * kQ8TileRows;
  const int64_t group_bytes = a.kp * kQ8Rows;
  const int live = static_cast<int>(std::min<int64_t>(kRows, row1 - r0));
  alignas(64) int32_t dot[RT][GT][kQ8TileRows][kQ8Rows];
  alignas(64) float acc[GT][kRows][kQ8Rows] = {};
  for (int64_t b = 0; b < a.nb; ++b) {
    Unroll<RT>([&](auto r) {
      t.template Load<kA + r>(
          a.q.data() + (r0 + r * kQ8TileRows) * a.kp + b * kQ8Block, a.kp);
    });
    Unroll<GT>([&](auto g) {
      t.template Load<kB + g>(pg + g * group_bytes + b * kQ8Rows * kQ8Block,
                              kTileRowBytes);
    });
    Unroll<RT>([&](auto r) {
      Unroll<GT>([&](auto g) {
        constexpr int c = kC + kGroups * r + g;
        t.template Zero<c>();
        t.template Dpbssd<c, kA + r, kB + g>();
        t.template Store<c>(dot[r][g], kTileRowBytes);
      });
    });
    for (int i = 0; i < live; ++i) {
      const float d = a.d[(r0 + i) * a.nb + b];
      for (int g = 0; g < GT; ++g) {
        const int32_t* s = dot[i / kQ8TileRows][g][i % kQ8TileRows];
        for (int j = 0; j < kQ8Rows; ++j) {
          acc[g][i][j] = std::fma(static_cast<float>(s[j]), d, acc[g][i][j]);
        }
      }
    }
  }
  for (int g = 0; g < GT; ++g) {
    const int64_t n0 = (gi + g) * kQ8Rows;
    const int64_t lanes = std::min<int64_t>(kQ8Rows, o.N - n0);
    for (int i = 0; i < live; ++i) {
      const int64_t row = r0 + i;
      const float* bias =
          o.bias == nullptr ? nullptr : o.bias + (row % o.S) * o.N + n0;
      float* y = o.y + row * o.N + n0;
      for (int64_t j = 0; j < lanes; ++j) {
        y[j] = std::fma(acc[g][i][j], o.w_scale[n0 + j],
                        bias == nullptr ? 0.f : bias[j]);
      }
    }
  }
}

// Configured and released per call: XLA's pool threads run other code
// between calls (oneDNN's AMX kernels configure and release tiles too), so
// a thread's tile state cannot be assumed kept.
template <typename Tiles>
inline void Q8RangeWith(const Q8Act& a, const int8_t* p, const Q8Out& o,
                        int64_t g0, int64_t g1, int64_t row0, int64_t row1) {
  static const TileConfig config = Q8TileConfig();
  Tiles t;
  t.Configure(config);
  for (int64_t gi = g0; gi < g1; gi += kGroups) {
    const int8_t* pg = p + gi * a.kp * kQ8Rows;
    const bool two_groups = gi + 1 < g1;
    for (int64_t r0 = row0; r0 < row1; r0 += kRowTiles * kQ8TileRows) {
      const bool two_rows = row1 - r0 > kQ8TileRows;
      if (two_rows && two_groups) {
        Q8TilePass<Tiles, 2, 2>(t, a, r0, row1, pg, o, gi);
      } else if (two_rows) {
        Q8TilePass<Tiles, 2, 1>(t, a, r0, row1, pg, o, gi);
      } else if (two_groups) {
        Q8TilePass<Tiles, 1, 2>(t, a, r0, row1, pg, o, gi);
      } else {
        Q8TilePass<Tiles, 1, 1>(t, a, r0, row1, pg, o, gi);
      }
    }
  }
  t.Release();
}

// Everything inlined (flatten), so the shared code compiles for AMX's
// target here (the tile instructions inline, the float steps vectorized)
// and for the baseline x86-64 in the emulated path.
TF_AMX __attribute__((flatten)) void Q8RangeAmx(
    const Q8Act& a, const int8_t* p, const Q8Out& o, int64_t g0, int64_t g1,
    int64_t row0, int64_t row1) {
  Q8RangeWith<AmxTiles>(a, p, o, g0, g1, row0, row1);
}

}  // namespace

void Q8RangeTiles(bool hardware, const Q8Act& a, const int8_t* p,
                  const Q8Out& o, int64_t g0, int64_t g1, int64_t row0,
                  int64_t row1) {
  if (hardware) return Q8RangeAmx(a, p, o, g0, g1, row0, row1);
  Q8RangeWith<EmulatedTiles>(a, p, o, g0, g1, row0, row1);
}

}  // namespace terraformer::kernels
