// Whole decoder blocks in one call (steps.h): a Terraformer decoder block
// and a Scaling Transformer decoder block, their steps chained in the
// block's order with the residual sums.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "operands.h"
#include "steps.h"

namespace terraformer::kernels {

namespace {

// tf_scaling_block's layout, without or with the cross-attention.
KernelLayout ScalingBlock(bool cross) {
  KernelLayout l;
  l.operands.Add("x")
      .Add<SparseQKVOperands>("attention")
      .Add<CacheOperands>("attention");
  l.results.Add("y")
      .Add("attention.keys", ffi::DataType::F32, /*in_place=*/true)
      .Add("attention.values", ffi::DataType::F32, /*in_place=*/true)
      .Add("attention.kept");
  if (cross) {
    l.operands.Add<SparseQOperands>("cross").Add<EncoderOperands>("cross");
    l.results.Add("cross.kept");
  }
  l.operands.Add<SparseFFOperands>("ff");
  return l;
}

}  // namespace

const KernelLayout& TerraformerBlockLayout() {
  static const KernelLayout layout = [] {
    KernelLayout l;
    l.operands.Add("x1").Add("x2");
    l.results.Add("x1").Add("x2");
    for (const std::string a : {"a", "b"}) {
      l.operands.Add<SparseQKVOperands>(a).Add<CacheOperands>(a);
      l.results.Add(a + ".keys", ffi::DataType::F32, /*in_place=*/true)
          .Add(a + ".values", ffi::DataType::F32, /*in_place=*/true)
          .Add(a + ".kept");
    }
    l.operands.Add<SparseFFOperands>("ff").Add<SruOperands>("sru");
    l.results.Add("sru.c");
    return l;
  }();
  return layout;
}

const KernelLayout& ScalingBlockLayout(bool cross) {
  static const KernelLayout layouts[2] = {ScalingBlock(false),
                                          ScalingBlock(true)};
  return layouts[cross];
}

// A whole Terraformer decoder block (§4.1-4.3; models/terraformer.py's
// _DecoderBlock) of one position per row, in one call: on the reversible
// streams (x1, x2),
//   y = x1 + A(LN_a(x2)),  z = x2 + B(LN_b(y)),
//   w = y + (SparseFF(LN_f(z)) + SRU(LN_s(z))),  (x1', x2') = (z, w),
// A and B the two sparse QKV attentions (SparseQKVAttentionStep), the sparse
// FF block (SparseFFStep, its C2 packed) and the low-rank SRU (SruStep):
// the same operations as their own calls, in the block's order.
// Operands and results: TerraformerBlockLayout (x1, x2 [B, 1, d]; A's as
// "a.", B's as "b.", the sparse FF's as "ff.", the SRU's as "sru."; the
// caches written in place).
ffi::Error TerraformerBlockImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                                ffi::RemainingRets rets, int64_t qk_width,
                                int64_t v_width, int64_t block,
                                float epsilon, float highway_scale,
                                bool use_tanh) {
  auto bad = [](const std::string& what) {
    return Invalid("tf_terraformer_block", what);
  };
  FusedCall call(args, rets, TerraformerBlockLayout());
  if (!call.problem.empty()) return bad(call.problem);
  ArgReader& in = call.in;
  const Results& out = call.out;
  auto x1 = in.Get<ffi::Buffer<ffi::F32>>("x1");
  auto x2 = in.Get<ffi::Buffer<ffi::F32>>("x2");
  const SparseQKVOperands qkv_a = in.Read<SparseQKVOperands>("a");
  const CacheOperands cache_a = in.Read<CacheOperands>("a");
  const SparseQKVOperands qkv_b = in.Read<SparseQKVOperands>("b");
  const CacheOperands cache_b = in.Read<CacheOperands>("b");
  const SparseFFOperands ff_ops = in.Read<SparseFFOperands>("ff");
  const SruOperands sru = in.Read<SruOperands>("sru");
  const int64_t count = x1.element_count();
  const auto c1_dims = ff_ops.c1.dimensions();
  const int64_t d = c1_dims.size() == 2 ? c1_dims[0] : 0;
  if (d <= 0 || count % d != 0 || x2.element_count() != x1.element_count() ||
      out.count("x1") != count || out.count("x2") != count) {
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
      f_out.data(), count, out.data("a.keys"), out.data("a.values"),
      out.data("a.kept"));
  if (!what.empty()) return bad("attention 1: " + what);
  for (int64_t i = 0; i < count; ++i) y[i] = x1p[i] + f_out[i];
  // x1' = z = x2 + B(y)
  what = SparseQKVAttentionStep(&pool, y.data(), count, qkv_b, cache_b,
                                qk_width, v_width, epsilon, f_out.data(),
                                count, out.data("b.keys"),
                                out.data("b.values"), out.data("b.kept"));
  if (!what.empty()) return bad("attention 2: " + what);
  float* z = out.data("x1");
  for (int64_t i = 0; i < count; ++i) z[i] = x2p[i] + f_out[i];
  // x2' = w = y + (FF(z) + SRU(z))
  ffi::Error error =
      SparseFFStep(&pool, "tf_terraformer_block: sparse FF", z, count, ff_ops,
                   ff.data(), block, epsilon);
  if (error.failure()) return error;
  if (out.count("sru.c") != static_cast<int64_t>(sru.c.element_count())) {
    return bad("the SRU's c' must have c's shape");
  }
  what = SruStep(&pool, sru, z, T, d, epsilon, highway_scale, use_tanh,
                 sru_y.data(), out.data("sru.c"));
  if (!what.empty()) return bad(what);
  float* w = out.data("x2");
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
// Operands and results: ScalingBlockLayout(cross) (x [B, 1, d]; A's as
// "attention.", with `cross` C's as "cross.", the sparse FF's as "ff."; the
// caches written in place).
ffi::Error ScalingBlockImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                            ffi::RemainingRets rets, int64_t qk_width,
                            int64_t v_width, int64_t q_width, int64_t block,
                            float epsilon, bool cross) {
  auto bad = [](const std::string& what) {
    return Invalid("tf_scaling_block", what);
  };
  FusedCall call(args, rets, ScalingBlockLayout(cross));
  if (!call.problem.empty()) return bad(call.problem);
  ArgReader& in = call.in;
  const Results& out = call.out;
  auto x = in.Get<ffi::Buffer<ffi::F32>>("x");
  const SparseQKVOperands qkv = in.Read<SparseQKVOperands>("attention");
  const CacheOperands cache = in.Read<CacheOperands>("attention");
  std::optional<SparseQOperands> sparse_q;
  std::optional<EncoderOperands> encoder;
  if (cross) {
    sparse_q.emplace(in.Read<SparseQOperands>("cross"));
    encoder.emplace(in.Read<EncoderOperands>("cross"));
  }
  const SparseFFOperands ff_ops = in.Read<SparseFFOperands>("ff");
  const int64_t count = x.element_count();
  if (out.count("y") != count) return bad("y must have x's shape");
  if (cross && out.count("cross.kept") !=
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
      count, out.data("attention.keys"), out.data("attention.values"),
      out.data("attention.kept"));
  if (!what.empty()) return bad("attention: " + what);
  for (int64_t i = 0; i < count; ++i) a[i] = xp[i] + f_out[i];
  const float* bp = a.data();
  // b = a + C(a)
  if (cross) {
    what = CrossAttentionStep(&pool, a.data(), count, *sparse_q, *encoder,
                              q_width, epsilon, f_out.data(),
                              out.data("cross.kept"));
    if (!what.empty()) return bad("cross-attention: " + what);
    b.resize(count);
    for (int64_t i = 0; i < count; ++i) b[i] = a[i] + f_out[i];
    bp = b.data();
  }
  // y = b + FF(b)
  ffi::Error error = SparseFFStep(&pool, "tf_scaling_block: sparse FF", bp,
                                  count, ff_ops, f_out.data(), block, epsilon);
  if (error.failure()) return error;
  float* y = out.data("y");
  for (int64_t i = 0; i < count; ++i) y[i] = bp[i] + f_out[i];
  return ffi::Error::Success();
}

}  // namespace terraformer::kernels
