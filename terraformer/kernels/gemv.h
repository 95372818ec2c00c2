// The products of a decoding step: float32 (bfloat16, int8) weights times
// a few or many rows of float activations (matmul.cc), and the Q8 GEMV,
// int8 weights times int8 activations (q8_gemv.cc).
#ifndef TERRAFORMER_KERNELS_GEMV_H_
#define TERRAFORMER_KERNELS_GEMV_H_

#include <cstdint>
#include <vector>

#include "isa.h"
#include "xla/ffi/api/ffi.h"

namespace terraformer::kernels {

namespace ffi = xla::ffi;

// From this many rows (and columns of W under one panel) the vector paths
// block rows in registers (RowsAvx2, AVX-512 CPUs too: the AVX-512 panel
// path, one pass of W per row, was 3x slower than XLA on sparse QKV's 64
// rows) and split row groups over the pool.
constexpr int64_t kManyRows = 8;
constexpr int64_t kRowGroup = 8;

// y[r, n] = sum_k xs[r, k] W[k, n] for n in [n0, n1) on `isa`'s path; W
// [K, N] row-major, y rows of stride ldy (matmul.cc). float W only.
template <typename W>
void Panel(Isa isa, const float* xs, int64_t R, int64_t K, const W* w,
           int64_t N, float* y, int64_t ldy, int64_t n0, int64_t n1);

// y = xs [R, K] W [K, N], y rows of stride ldy, split over `pool` when
// large (matmul.cc). W float, uint16_t (bfloat16) or int8_t.
template <typename W>
void Matmul(ffi::ThreadPool* pool, const float* xs, int64_t R, int64_t K,
            const W* w, int64_t N, float* y, int64_t ldy);

// The Q8 GEMV's packed layout (q8_gemv.cc, "The Q8 GEMV").
constexpr int64_t kQ8Rows = 16;   // Outputs per group (one 512-bit vector).
constexpr int64_t kQ8Block = 32;  // Inputs per activation scale.

// Where one product writes: y row r at y + r * N, its bias (or none) at
// bias + (r % S) * N; w_scale [N].
struct Q8Out {
  const float* w_scale;
  const float* bias;
  int64_t S, N;
  float* y;
};

// Rows of x g quantized (q8_gemv.cc): q [rows, kp] (zeros past K; on the
// tile paths, zero rows up to a multiple of kQ8TileRows), block scales d
// [rows, nb] and off [rows, nb] = -128 * the block's sum of q.
struct Q8Act {
  int64_t rows = 0, kp = 0, nb = 0;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> off;
};

// Rows of one AMX tile of activations (an A tile: 16 rows of one block).
constexpr int64_t kQ8TileRows = 16;
// Groups one pass of the tile path multiplies (two B tiles).
constexpr int64_t kQ8TileGroups = 2;

// Groups [g0, g1) times rows [row0, row1) of `a` in AMX tiles (q8_amx.cc):
// `hardware`, AMX's instructions, else the emulated tiles (tiles.h). row0
// is a multiple of kQ8TileRows and row1 one or a.rows (a whole tile of rows
// is read from row0 on; the padding's sums are not stored).
void Q8RangeTiles(bool hardware, const Q8Act& a, const int8_t* p,
                  const Q8Out& o, int64_t g0, int64_t g1, int64_t row0,
                  int64_t row1);

// y = the Q8 product of x [T, K] g [S, K] (rows t*S + s) and P (n_groups
// groups of kp inputs); g8 (int8 rows with one scale per row, g_scale [S])
// replaces g when given (q8_gemv.cc).
void Q8Matmul(ffi::ThreadPool* pool, const float* x, int64_t T,
              const float* g, int64_t S, int64_t K, const int8_t* p,
              int64_t n_groups, int64_t kp, const Q8Out& o,
              const int8_t* g8 = nullptr, const float* g_scale = nullptr);

// Multiply-adds per second of the Q8 product alone (activations quantized
// before), rows [rows, K] times W [K, N], on the calling thread and the
// path in use: the median of `repeats` calls (q8_gemv.cc).
double Q8ProductMacs(int64_t rows, int64_t K, int64_t N, int64_t repeats);

// Multiply-adds per second of `isa`'s int8 product instruction on the
// calling thread, `iterations` rounds of registers-only work (peaks.cc).
double Int8PeakMacs(GemvIsa isa, int64_t iterations);

// The same for `isa`'s float32 FMA (peaks.cc).
double Float32PeakMacs(Isa isa, int64_t iterations);

}  // namespace terraformer::kernels

#endif  // TERRAFORMER_KERNELS_GEMV_H_
