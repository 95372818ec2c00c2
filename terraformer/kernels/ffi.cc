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
//   tf_q8_matmul:      the same product as tf_skinny_matmul (without c) on
//     int8 weights repacked output-major AND int8 activations (quantized
//     once per call, per block of 32 inputs, like llama.cpp's Q8_0):
//     integer dot products (vpdpbusd, or maddubs + madd), the sums of 16
//     outputs held in registers for the whole K loop; on AMX, products of
//     many rows in tiles (tdpbssd). See "The Q8 GEMV".
//   tf_cache_attention: causal softmax attention of the step's queries over
//     a key/value cache read in place, only its filled positions (no copy
//     of a cache bucket, as slicing the cache for XLA's dots makes).
//   tf_sparse_qkv:     sparse QKV's 'q8' step (paper §3.2): the
//     multiplicative layer and the Q/K and V convolutions in one call.
//   tf_sparse_qkv_attention: that step, the keys and values written into
//     their caches in place and the attention over them, in one call.
//   tf_terraformer_block: a whole Terraformer decoder block's step (both
//     sparse QKV attentions, the sparse FF block, the low-rank SRU path and
//     the reversible half-residual sums) in one call.
// tf_sparse_ff and tf_sparse_qkv_attention can first apply the LayerNorm
// that precedes them in a block (NormRows).
//
// Vectorized with AVX-512 (F/BW/VL) or AVX2+FMA, chosen at run time with
// __builtin_cpu_supports; plain loops otherwise (tf_q8_matmul: AMX, AVX-512
// VNNI, AVX2 or plain loops, chosen separately). Each function compiles
// with its own target attribute, so one library runs on every x86-64.
// Large products are split over XLA's intra-op thread pool (chunks taken
// from an atomic counter, so the call never waits for a task that has not
// started).
//
// One extension in files by job: isa.h/.cc (instruction sets, loads),
// parallel.h (the thread pool), row_ops.h (single rows of weights),
// matmul.cc and q8_gemv.cc (the products, gemv.h; q8_amx.cc the Q8
// products in AMX tiles, tiles.h the tiles, real or emulated), peaks.cc
// (the instructions' peak rates), operands.h/.cc (the fused kernels'
// operands by name, their layouts and readers), steps.cc and attention.cc
// (the per-op steps, steps.h), fused_blocks.cc (whole blocks), and this
// file: the handlers' bindings to XLA's FFI and the library's C entry
// points.
#include <algorithm>
#include <map>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "gemv.h"
#include "isa.h"
#include "operands.h"
#include "parallel.h"
#include "steps.h"
#include "tiles.h"
#include "xla/ffi/api/ffi.h"

namespace terraformer::kernels {

namespace {

// The fused kernels' layouts (operands.h): x and the sparse FF's operands
// -> y; x and sparse QKV's -> q, k, v, kept; its attention step's, with the
// caches -> y, keys, values (written in place), kept.
const KernelLayout& SparseFFLayout() {
  static const KernelLayout layout = [] {
    KernelLayout l;
    l.operands.Add("x").Add<SparseFFOperands>("");
    l.results.Add("y");
    return l;
  }();
  return layout;
}

const KernelLayout& SparseQKVLayout() {
  static const KernelLayout layout = [] {
    KernelLayout l;
    l.operands.Add("x").Add<SparseQKVOperands>("");
    l.results.Add("q").Add("k").Add("v").Add("kept");
    return l;
  }();
  return layout;
}

const KernelLayout& SparseQKVAttentionLayout() {
  static const KernelLayout layout = [] {
    KernelLayout l;
    l.operands.Add("x").Add<SparseQKVOperands>("").Add<CacheOperands>("");
    l.results.Add("y")
        .Add("keys", ffi::DataType::F32, /*in_place=*/true)
        .Add("values", ffi::DataType::F32, /*in_place=*/true)
        .Add("kept");
    return l;
  }();
  return layout;
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

// x [T, d] and the sparse FF's operands -> y [T, d] (SparseFFStep).
ffi::Error SparseFFImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                        ffi::RemainingRets rets, int64_t block,
                        float epsilon) {
  FusedCall call(args, rets, SparseFFLayout());
  if (!call.problem.empty()) return Invalid("tf_sparse_ff", call.problem);
  auto x = call.in.Get<ffi::Buffer<ffi::F32>>("x");
  return SparseFFStep(&pool, "tf_sparse_ff", x.typed_data(), x.element_count(),
                      call.in.Read<SparseFFOperands>(), call.out.data("y"),
                      block, epsilon);
}

// x [T, K], g [S, K] (float32, or int8 with g_scale [S]: one scale per
// row; else g_scale is a dummy [1]), P [G, Kp / 4, 16, 4] int8 (output-major,
// see "The Q8 GEMV"), w_scale [N], b [S * N] or [1] (no bias) -> y [T, S * N].
ffi::Error Q8MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                        ffi::AnyBuffer g, ffi::Buffer<ffi::F32> g_scale,
                        ffi::Buffer<ffi::S8> p,
                        ffi::Buffer<ffi::F32> w_scale, ffi::Buffer<ffi::F32> b,
                        ffi::ResultBuffer<ffi::F32> y) {
  auto bad = [](const std::string& what) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tf_q8_matmul: " + what);
  };
  auto pd = p.dimensions();
  auto gd = g.dimensions();
  if (gd.size() != 2) return bad("g must be [S, K]");
  const int64_t S = gd[0], K = gd[1];
  const bool g_int8 = g.element_type() == ffi::DataType::S8;
  if (!g_int8 && g.element_type() != ffi::DataType::F32) {
    return bad("g must be float32 or int8");
  }
  if (g_int8 && static_cast<int64_t>(g_scale.element_count()) != S) {
    return bad("an int8 g [S, K] needs S row scales");
  }
  const int64_t N = w_scale.element_count();
  if (std::string what = PackedProblem("W", pd, K, N); !what.empty()) {
    return bad(what);
  }
  const int64_t kp = pd[1] * 4, n_groups = pd[0];
  if (x.element_count() % K != 0) return bad("x's last axis is not K");
  const int64_t T = x.element_count() / K;
  // else a dummy [1]
  const bool bias = static_cast<int64_t>(b.element_count()) == S * N;
  Q8Out out{w_scale.typed_data(), bias ? b.typed_data() : nullptr, S, N,
            y->typed_data()};
  Q8Matmul(&pool, x.typed_data(), T,
           g_int8 ? nullptr : static_cast<const float*>(g.untyped_data()), S, K,
           p.typed_data(), n_groups, kp, out,
           g_int8 ? static_cast<const int8_t*>(g.untyped_data()) : nullptr,
           g_int8 ? g_scale.typed_data() : nullptr);
  return ffi::Error::Success();
}

// x [B, d] and sparse QKV's operands -> q, k, v [B, S * M], kept'
// (SparseQKVStep).
ffi::Error SparseQKVImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                         ffi::RemainingRets rets, int64_t qk_width,
                         int64_t v_width) {
  FusedCall call(args, rets, SparseQKVLayout());
  if (!call.problem.empty()) return Invalid("tf_sparse_qkv", call.problem);
  auto x = call.in.Get<ffi::Buffer<ffi::F32>>("x");
  const Results& out = call.out;
  std::string what = SparseQKVStep(
      &pool, x.typed_data(), x.element_count(),
      call.in.Read<SparseQKVOperands>(), qk_width, v_width, out.data("q"),
      out.data("k"), out.data("v"), out.data("kept"));
  if (!what.empty()) return Invalid("tf_sparse_qkv", what);
  return ffi::Error::Success();
}

// Causal softmax attention of a few queries over a key/value cache, read in
// place: q [N, T, D], keys and values [N, M, D] (the whole cache, written by
// the step's in-place dynamic-update-slice), valid [N, M] (pred; [1]: every
// key valid), idx [] (position of query 0) -> out [N, T, D]. Query t of row
// n reads keys 0 .. idx + t only (the filled part of the cache, no copy of
// it): dots <q, k_j> / sqrt(D), -1e9 where a key is not valid, weights
// exp(dots - logsumexp(dots)), out = sum_j weights_j v_j.
ffi::Error CacheAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                              ffi::Buffer<ffi::F32> keys,
                              ffi::Buffer<ffi::F32> values,
                              ffi::Buffer<ffi::PRED> valid,
                              ffi::Buffer<ffi::S32> idx,
                              ffi::ResultBuffer<ffi::F32> out) {
  auto bad = [](const std::string& what) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tf_cache_attention: " + what);
  };
  auto qd = q.dimensions();
  auto kd = keys.dimensions();
  if (qd.size() != 3 || kd.size() != 3 || qd[0] != kd[0] || qd[2] != kd[2]) {
    return bad("q must be [N, T, D] and the caches [N, M, D]");
  }
  if (values.dimensions().size() != 3 || values.dimensions()[1] != kd[1] ||
      values.element_count() != keys.element_count()) {
    return bad("keys and values differ in shape");
  }
  const int64_t N = qd[0], T = qd[1], D = qd[2], M = kd[1];
  const bool masked = static_cast<int64_t>(valid.element_count()) == N * M;
  if (!masked && valid.element_count() != 1) {
    return bad("valid must be [N, M] or [1]");
  }
  const int64_t first = *idx.typed_data();
  if (first < 0 || first + T > M) return bad("positions outside the cache");
  AttendCache(&pool, q.typed_data(), keys.typed_data(), values.typed_data(),
              masked ? valid.typed_data() : nullptr, N, T, D, M, first,
              out->typed_data());
  return ffi::Error::Success();
}

// x [B, d], sparse QKV's operands and the caches' -> y [B, 1, S M], keys',
// values' (written in place), kept' (SparseQKVAttentionStep).
ffi::Error SparseQKVAttentionImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                                  ffi::RemainingRets rets, int64_t qk_width,
                                  int64_t v_width, float epsilon) {
  FusedCall call(args, rets, SparseQKVAttentionLayout());
  if (!call.problem.empty()) {
    return Invalid("tf_sparse_qkv_attention", call.problem);
  }
  auto x = call.in.Get<ffi::Buffer<ffi::F32>>("x");
  const Results& out = call.out;
  std::string what = SparseQKVAttentionStep(
      &pool, x.typed_data(), x.element_count(),
      call.in.Read<SparseQKVOperands>(), call.in.Read<CacheOperands>(),
      qk_width, v_width, epsilon, out.data("y"), out.count("y"),
      out.data("keys"), out.data("values"), out.data("kept"));
  if (!what.empty()) return Invalid("tf_sparse_qkv_attention", what);
  return ffi::Error::Success();
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_q8_matmul, Q8MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// The binding of the fused kernels: the pool, their operands and results
// (read by their layouts, FusedCall), then their attributes.
inline auto BindFused() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .RemainingArgs()
      .RemainingRets();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_sparse_ff, SparseFFImpl,
                              BindFused()
                                  .Attr<int64_t>("block")
                                  .Attr<float>("epsilon"));

// That binding and sparse QKV's kernel widths, the first attributes of the
// kernels that run sparse QKV.
inline auto BindSparseQKV() {
  return BindFused().Attr<int64_t>("qk_width").Attr<int64_t>("v_width");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_sparse_qkv, SparseQKVImpl, BindSparseQKV());

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_sparse_qkv_attention, SparseQKVAttentionImpl,
                              BindSparseQKV().Attr<float>("epsilon"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_terraformer_block, TerraformerBlockImpl,
                              BindSparseQKV()
                                  .Attr<int64_t>("block")
                                  .Attr<float>("epsilon")
                                  .Attr<float>("highway_scale")
                                  .Attr<bool>("use_tanh"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_scaling_block, ScalingBlockImpl,
                              BindSparseQKV()
                                  .Attr<int64_t>("q_width")
                                  .Attr<int64_t>("block")
                                  .Attr<float>("epsilon")
                                  .Attr<bool>("cross"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(tf_cache_attention, CacheAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

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

// The Q8 GEMV's instruction set: 0 scalar, 1 AVX2, 2 AVX-512 VNNI, 3 AMX,
// 4 AMX's tile code emulated (any CPU). Setting one the CPU lacks sets the
// best it has. Returns the one now in use.
extern "C" int tf_set_gemv_isa(int level) {
  if (level >= 0 && level <= static_cast<int>(GemvIsa::kAmxEmulated)) {
    const GemvIsa want = static_cast<GemvIsa>(level);
    g_gemv_isa.store(static_cast<int>(UsableGemvIsa(want)));
  }
  return g_gemv_isa.load();
}

// The best Q8 GEMV path this CPU has (what the library starts with).
extern "C" int tf_best_gemv_isa() { return static_cast<int>(DetectGemvIsa()); }

// TDPBSSDs the emulated tiles have run in this process.
extern "C" int64_t tf_emulated_tdpbssd() { return g_emulated_tdpbssd.load(); }

// Multiply-adds per second of the Q8 path in use (tf_set_gemv_isa) on the
// calling thread: its int8 instruction's peak over `iterations` rounds.
extern "C" double tf_int8_peak_macs(int64_t iterations) {
  return Int8PeakMacs(CurrentGemvIsa(), iterations);
}

// The same for the float32 FMA of the float path in use (tf_set_isa).
extern "C" double tf_f32_peak_macs(int64_t iterations) {
  return Float32PeakMacs(CurrentIsa(), iterations);
}

// Multiply-adds per second of the Q8 product alone, rows x K times K x N,
// on the calling thread and the path in use: the median of `repeats` calls.
extern "C" double tf_q8_product_macs(int64_t rows, int64_t k, int64_t n,
                                     int64_t repeats) {
  return Q8ProductMacs(rows, k, n, std::max<int64_t>(1, repeats));
}

// Each fused kernel's operands, a line "->", then its results, one a line:
// "name type" (" in_place": written into the operand of its name, the two
// aliased), in binding order; nullptr for another kernel. `kernel`: the
// handler's name (tf_scaling_block with its cross-attention:
// "tf_scaling_block:cross"). What terraformer/kernels/operands.py lists.
extern "C" const char* tf_kernel_signature(const char* kernel) {
  static const std::map<std::string, std::string> signatures = [] {
    auto describe = [](const KernelLayout& l) {
      return l.operands.Describe() + "->\n" + l.results.Describe();
    };
    return std::map<std::string, std::string>{
        {"tf_sparse_ff", describe(SparseFFLayout())},
        {"tf_sparse_qkv", describe(SparseQKVLayout())},
        {"tf_sparse_qkv_attention", describe(SparseQKVAttentionLayout())},
        {"tf_terraformer_block", describe(TerraformerBlockLayout())},
        {"tf_scaling_block", describe(ScalingBlockLayout(false))},
        {"tf_scaling_block:cross", describe(ScalingBlockLayout(true))}};
  }();
  auto found = signatures.find(kernel);
  return found == signatures.end() ? nullptr : found->second.c_str();
}

}  // namespace terraformer::kernels
