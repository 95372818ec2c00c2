// Whole decoder blocks in one call (steps.h): a Terraformer decoder block
// and a Scaling Transformer decoder block, their steps chained in the
// block's order with the residual sums.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "operands.h"
#include "steps.h"

namespace terraformer::kernels {

namespace {

// The n float32 results of a call (RemainingRets): their data at out[i]
// and element counts at count[i]; "" or what is wrong.
std::string ResultBuffers(const ffi::RemainingRets& rets, size_t n,
                          float** out, int64_t* count) {
  if (rets.size() != n) {
    return "expected " + std::to_string(n) + " results, got " +
           std::to_string(rets.size());
  }
  for (size_t i = 0; i < n; ++i) {
    auto r = rets.get<ffi::Buffer<ffi::F32>>(i);
    if (!r.has_value()) {
      return "result " + std::to_string(i) + ": " + r.error().message();
    }
    out[i] = (*r)->typed_data();
    count[i] = (*r)->element_count();
  }
  return "";
}

}  // namespace

// A whole Terraformer decoder block (§4.1-4.3; models/terraformer.py's
// _DecoderBlock) of one position per row, in one call: on the reversible
// streams (x1, x2),
//   y = x1 + A(LN_a(x2)),  z = x2 + B(LN_b(y)),
//   w = y + (SparseFF(LN_f(z)) + SRU(LN_s(z))),  (x1', x2') = (z, w),
// A and B the two sparse QKV attentions (SparseQKVAttentionStep), the sparse
// FF block (SparseFFStep, its C2 packed) and the low-rank SRU (SruStep):
// the same operations as their own calls, in the block's order.
// Operands: x1, x2 [B, 1, d]; A's and B's 12 sparse QKV operands, then
// keys, values, valid, idx, norm scale, norm bias; the sparse FF's C1, C2,
// C2's scales, c, W1ᵀ, W2, b2, s1, s2, norm scale, norm bias; the SRU's
// norm scale and bias, its first dense layer (packed, scales, bias), W, b,
// c, its second dense layer. Results: x1', x2', A's keys', values',
// kept', B's, and the SRU's c' (the caches alias their operands).
ffi::Error TerraformerBlockImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                                ffi::RemainingRets rets, int64_t qk_width,
                                int64_t v_width, int64_t block,
                                float epsilon, float highway_scale,
                                bool use_tanh) {
  auto bad = [](const std::string& what) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tf_terraformer_block: " + what);
  };
  using R = ArgReader;
  // The operands' element types, in order (built once).
  static const std::vector<R::Type> types = [] {
    std::vector<R::Type> t = {R::kF32, R::kF32};  // x1, x2
    for (int attention = 0; attention < 2; ++attention) {
      t.insert(t.end(), std::begin(R::kSparseQKV), std::end(R::kSparseQKV));
      t.insert(t.end(), std::begin(R::kCache), std::end(R::kCache));
    }
    t.insert(t.end(), std::begin(R::kSparseFF), std::end(R::kSparseFF));
    // The SRU: norm, dense, W, b, c, dense.
    t.insert(t.end(), {R::kF32, R::kF32});
    t.insert(t.end(), std::begin(R::kDense), std::end(R::kDense));
    t.insert(t.end(), {R::kF32, R::kF32, R::kF32});
    t.insert(t.end(), std::begin(R::kDense), std::end(R::kDense));
    return t;
  }();
  ArgReader in(args);
  if (std::string what = in.Check(types); !what.empty()) return bad(what);
  auto x1 = in.Next<ffi::Buffer<ffi::F32>>();
  auto x2 = in.Next<ffi::Buffer<ffi::F32>>();
  const SparseQKVOperands qkv_a = in.SparseQKV();
  const CacheOperands cache_a = in.Cache();
  const SparseQKVOperands qkv_b = in.SparseQKV();
  const CacheOperands cache_b = in.Cache();
  const SparseFFOperands ff_ops = in.SparseFF();
  // Members in declaration order (braced initializers run left to right).
  const SruOperands sru{in.Next<ffi::Buffer<ffi::F32>>(),
                        in.Next<ffi::Buffer<ffi::F32>>(), in.Dense(),
                        in.Next<ffi::Buffer<ffi::F32>>(),
                        in.Next<ffi::Buffer<ffi::F32>>(),
                        in.Next<ffi::Buffer<ffi::F32>>(), in.Dense()};
  constexpr size_t kResults = 9;
  float* out[kResults];
  int64_t out_count[kResults];
  if (std::string what = ResultBuffers(rets, kResults, out, out_count);
      !what.empty()) {
    return bad(what);
  }
  const int64_t count = x1.element_count();
  const auto c1_dims = ff_ops.c1.dimensions();
  const int64_t d = c1_dims.size() == 2 ? c1_dims[0] : 0;
  if (d <= 0 || count % d != 0 || x2.element_count() != x1.element_count() ||
      out_count[0] != count || out_count[1] != count) {
    return bad("x1, x2 and their results must be [B, 1, d], d C1's rows");
  }
  const int64_t T = count / d;
  thread_local std::vector<float> y, f_out, ff, sru_y;
  y.resize(count);
  f_out.resize(count);
  ff.resize(count);
  sru_y.resize(count);
  const float* x1p = x1.typed_data();
  const float* x2p = x2.typed_data();
  // y = x1 + A(x2)
  std::string what = SparseQKVAttentionStep(
      &pool, x2p, count, qkv_a, cache_a, qk_width, v_width, epsilon,
      f_out.data(), count, out[2], out[3], out[4]);
  if (!what.empty()) return bad("attention 1: " + what);
  for (int64_t i = 0; i < count; ++i) y[i] = x1p[i] + f_out[i];
  // x1' = z = x2 + B(y)
  what = SparseQKVAttentionStep(&pool, y.data(), count, qkv_b, cache_b,
                                qk_width, v_width, epsilon, f_out.data(),
                                count, out[5], out[6], out[7]);
  if (!what.empty()) return bad("attention 2: " + what);
  float* z = out[0];
  for (int64_t i = 0; i < count; ++i) z[i] = x2p[i] + f_out[i];
  // x2' = w = y + (FF(z) + SRU(z))
  ffi::Error error =
      SparseFFStep(&pool, "tf_terraformer_block: sparse FF", z, count, ff_ops,
                   ff.data(), block, epsilon);
  if (error.failure()) return error;
  if (out_count[8] != static_cast<int64_t>(sru.c.element_count())) {
    return bad("the SRU's c' must have c's shape");
  }
  what = SruStep(&pool, sru, z, T, d, epsilon, highway_scale, use_tanh,
                 sru_y.data(), out[8]);
  if (!what.empty()) return bad(what);
  float* w = out[1];
  for (int64_t i = 0; i < count; ++i) w[i] = y[i] + (ff[i] + sru_y[i]);
  return ffi::Error::Success();
}

// A Scaling Transformer decoder block (models/scaling_transformer.py's
// _Block or _EncoderDecoderBlock: sparse QKV attention, sparse FF, with an
// encoder the sparse-query cross-attention) of one position per row, in one
// call:
//   a = x + A(LN_a(x)),  b = a + C(LN_c(a)) (with `cross`; else b = a),
//   y = b + FF(LN_f(b)),
// A the sparse QKV attention (SparseQKVAttentionStep), C the cross-attention
// (CrossAttentionStep), FF the sparse FF block (SparseFFStep, C2 packed):
// the operations of their own calls, in the block's order (tl.Residual's
// sums; Dropout is the identity when decoding).
// Operands: x [B, 1, d]; A's 12 sparse QKV operands, then keys, values,
// valid, idx, norm scale, norm bias; with `cross` C's 9 sparse query
// operands, then the encoder's keys, values, mask, norm scale, norm bias;
// the sparse FF's C1, C2, C2's scales, c, W1ᵀ, W2, b2, s1, s2, norm scale,
// norm bias. Results: y, A's keys', values', kept' (the caches alias their
// operands), with `cross` C's kept'.
ffi::Error ScalingBlockImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                            ffi::RemainingRets rets, int64_t qk_width,
                            int64_t v_width, int64_t q_width, int64_t block,
                            float epsilon, bool cross) {
  auto bad = [](const std::string& what) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tf_scaling_block: " + what);
  };
  using R = ArgReader;
  // The operands' element types, in order (built once), without and with
  // the cross-attention.
  static const std::vector<R::Type> types[2] = {
      R::ScalingBlockTypes(false), R::ScalingBlockTypes(true)};
  ArgReader in(args);
  if (std::string what = in.Check(types[cross]); !what.empty()) {
    return bad(what);
  }
  auto x = in.Next<ffi::Buffer<ffi::F32>>();
  const SparseQKVOperands qkv = in.SparseQKV();
  const CacheOperands cache = in.Cache();
  std::optional<SparseQOperands> sparse_q;
  std::optional<EncoderOperands> encoder;
  if (cross) {
    sparse_q.emplace(in.SparseQ());
    encoder.emplace(in.Encoder());
  }
  const SparseFFOperands ff_ops = in.SparseFF();
  float* out[5];
  int64_t out_count[5];
  if (std::string what = ResultBuffers(rets, cross ? 5 : 4, out, out_count);
      !what.empty()) {
    return bad(what);
  }
  const int64_t count = x.element_count();
  if (out_count[0] != count) return bad("y must have x's shape");
  if (cross && out_count[4] !=
                   static_cast<int64_t>(sparse_q->kept.element_count())) {
    return bad("the cross-attention's kept' must have its kept's shape");
  }
  thread_local std::vector<float> a, b, f_out;
  a.resize(count);
  f_out.resize(count);
  const float* xp = x.typed_data();
  // a = x + A(x)
  std::string what = SparseQKVAttentionStep(
      &pool, xp, count, qkv, cache, qk_width, v_width, epsilon, f_out.data(),
      count, out[1], out[2], out[3]);
  if (!what.empty()) return bad("attention: " + what);
  for (int64_t i = 0; i < count; ++i) a[i] = xp[i] + f_out[i];
  const float* bp = a.data();
  // b = a + C(a)
  if (cross) {
    what = CrossAttentionStep(&pool, a.data(), count, *sparse_q, *encoder,
                              q_width, epsilon, f_out.data(), out[4]);
    if (!what.empty()) return bad("cross-attention: " + what);
    b.resize(count);
    for (int64_t i = 0; i < count; ++i) b[i] = a[i] + f_out[i];
    bp = b.data();
  }
  // y = b + FF(b)
  ffi::Error error = SparseFFStep(&pool, "tf_scaling_block: sparse FF", bp,
                                  count, ff_ops, f_out.data(), block, epsilon);
  if (error.failure()) return error;
  float* y = out[0];
  for (int64_t i = 0; i < count; ++i) y[i] = bp[i] + f_out[i];
  return ffi::Error::Success();
}

}  // namespace terraformer::kernels
