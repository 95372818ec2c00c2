// AMX's tiles behind one interface with two policies, so that tile code is
// written once (q8_amx.cc, peaks.cc) and runs on AMX hardware with one and
// on any CPU, in tests, with the other:
//   AmxTiles: the instructions (LDTILECFG, TILEZERO, TILELOADD, TDPBSSD,
//     TILESTORED, TILERELEASE), in functions compiled for AMX (TF_AMX);
//   EmulatedTiles: the same instructions on 8 tiles in memory, as the
//     pseudocode of Intel's SDM (vol. 2, "TDPBSSD", "TILELOADD", ...) and
//     its Intel AMX chapter define them, faults included (an operation the
//     hardware would refuse aborts).
// Palette 1: 8 tiles of at most 16 rows of 64 bytes. Tile numbers are
// template arguments (the instructions encode them).
#ifndef TERRAFORMER_KERNELS_TILES_H_
#define TERRAFORMER_KERNELS_TILES_H_

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace terraformer::kernels {

#define TF_AMX                                                            \
  __attribute__((target(                                                  \
      "amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,fma")))

constexpr int kTiles = 8, kTileMaxRows = 16, kTileRowBytes = 64;

// LDTILECFG's 64-byte operand, palette 1; Set gives tile t its shape.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  void Set(int t, int n_rows, int bytes_per_row) {
    rows[t] = static_cast<uint8_t>(n_rows);
    colsb[t] = static_cast<uint16_t>(bytes_per_row);
  }
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

// GCC 12's _tile_loadd / _tile_dpbssd / _tile_zero / _tile_stored are
// macros that paste their tile numbers into the asm text (#dst), so they
// take only literal numbers: these are the same instructions with the
// number an "i" operand (%c), which a template argument fills, and a memory
// clobber (the intrinsics declare none, so a tile store's result could be
// read from before it). _tile_loadconfig and _tile_release are functions.
struct AmxTiles {
  TF_AMX void Configure(const TileConfig& c) { _tile_loadconfig(&c); }
  TF_AMX void Release() { _tile_release(); }
  template <int T>
  TF_AMX void Zero() {
    asm volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  template <int T>
  TF_AMX void Load(const void* base, int64_t stride) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride),
                 "i"(T)
                 : "memory");
  }
  template <int C, int A, int B>
  TF_AMX void Dpbssd() {
    asm volatile("tdpbssd %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A),
                 "i"(B));
  }
  template <int T>
  TF_AMX void Store(void* base, int64_t stride) {
    asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride),
                 "i"(T)
                 : "memory");
  }
};

// TDPBSSDs the emulated tiles have run in this process (tests: the tile
// code was taken).
extern std::atomic<int64_t> g_emulated_tdpbssd;

class EmulatedTiles {
 public:
  // LDTILECFG: #GP on a palette other than 0 and 1, reserved bytes not
  // zero (tiles 8-15 among them), rows or colsb past the palette's or one
  // of them zero without the other; palette 0 is TILERELEASE's state.
  // Every tile is zeroed.
  void Configure(const TileConfig& c) {
    bool ok = c.palette <= 1 && c.start_row == 0;
    for (uint8_t b : c.reserved) ok = ok && b == 0;
    for (int t = 0; t < 16; ++t) {
      ok = ok && (t < kTiles ? c.rows[t] <= kTileMaxRows &&
                                   c.colsb[t] <= kTileRowBytes &&
                                   (c.rows[t] == 0) == (c.colsb[t] == 0)
                             : c.rows[t] == 0 && c.colsb[t] == 0);
    }
    if (!ok) Fault("LDTILECFG: #GP");
    config_ = c;
    std::memset(tile_, 0, sizeof(tile_));
  }
  void Release() { Configure(TileConfig{0}); }

  // TILEZERO: the whole tile, whatever its shape.
  template <int T>
  void Zero() {
    Configured<T>();
    std::memset(tile_[T], 0, sizeof(tile_[T]));
  }
  // TILELOADD: row r's colsb bytes from base + r * stride, the rest of the
  // row and the rows past `rows` zeroed.
  template <int T>
  void Load(const void* base, int64_t stride) {
    Configured<T>();
    std::memset(tile_[T], 0, sizeof(tile_[T]));
    for (int r = 0; r < config_.rows[T]; ++r) {
      std::memcpy(tile_[T][r], static_cast<const uint8_t*>(base) + r * stride,
                  config_.colsb[T]);
    }
  }
  // TILESTORED: row r's colsb bytes to base + r * stride.
  template <int T>
  void Store(void* base, int64_t stride) {
    Configured<T>();
    for (int r = 0; r < config_.rows[T]; ++r) {
      std::memcpy(static_cast<uint8_t*>(base) + r * stride, tile_[T][r],
                  config_.colsb[T]);
    }
  }
  // TDPBSSD: for m < C.rows and n < C.colsb / 4, C[m].dword[n] += the sum
  // over k < A.colsb / 4 of DPBD(A[m].dword[k], B[k].dword[n]), DPBD the sum
  // of the 4 products of signed bytes (int32, wrapping); the rest of C
  // zeroed. #UD unless A.rows = C.rows, A.colsb = 4 B.rows, B.colsb =
  // C.colsb and the three tiles differ.
  template <int C, int A, int B>
  void Dpbssd() {
    static_assert(C != A && C != B && A != B, "TDPBSSD: #UD");
    Configured<C>();
    Configured<A>();
    Configured<B>();
    const int rows = config_.rows[C], n_dwords = config_.colsb[C] / 4;
    const int k_dwords = config_.colsb[A] / 4;
    if (config_.rows[A] != rows || k_dwords != config_.rows[B] ||
        config_.colsb[B] != config_.colsb[C] || config_.colsb[A] % 4 != 0 ||
        config_.colsb[C] % 4 != 0) {
      Fault("TDPBSSD: shapes");
    }
    for (int m = 0; m < kTileMaxRows; ++m) {
      uint32_t sums[kTileRowBytes / 4] = {};
      if (m < rows) {
        for (int n = 0; n < n_dwords; ++n) {
          uint32_t s = Dword(tile_[C][m], n);
          for (int k = 0; k < k_dwords; ++k) {
            int32_t dot = 0;
            for (int i = 0; i < 4; ++i) {
              dot += int32_t{static_cast<int8_t>(tile_[A][m][4 * k + i])} *
                     int32_t{static_cast<int8_t>(tile_[B][k][4 * n + i])};
            }
            s += static_cast<uint32_t>(dot);
          }
          sums[n] = s;
        }
      }
      std::memcpy(tile_[C][m], sums, sizeof(sums));
    }
    g_emulated_tdpbssd.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  [[noreturn]] static void Fault(const char* what) {
    std::fprintf(stderr, "emulated AMX tiles: %s\n", what);
    std::abort();
  }
  // #UD for a tile instruction before LDTILECFG (or after TILERELEASE) or
  // on a tile the configuration leaves out.
  template <int T>
  void Configured() const {
    static_assert(T >= 0 && T < kTiles, "no such tile");
    if (config_.palette != 1 || config_.rows[T] == 0) {
      Fault("#UD: a tile not configured");
    }
  }
  static uint32_t Dword(const uint8_t* row, int n) {
    uint32_t v;
    std::memcpy(&v, row + 4 * n, sizeof(v));
    return v;
  }

  TileConfig config_{0};
  alignas(64) uint8_t tile_[kTiles][kTileMaxRows][kTileRowBytes] = {};
};

}  // namespace terraformer::kernels

#endif  // TERRAFORMER_KERNELS_TILES_H_
