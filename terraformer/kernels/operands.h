// The operands of the fused kernels: one struct per group of operands that
// a step reads, and ArgReader, which reads the groups of a whole-block call
// (RemainingArgs) in order.
#ifndef TERRAFORMER_KERNELS_OPERANDS_H_
#define TERRAFORMER_KERNELS_OPERANDS_H_

#include <cstddef>
#include <iterator>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace terraformer::kernels {

namespace ffi = xla::ffi;

// x [T, d], C1 [d, r], C2 [r, F] float32 or packed for the Q8 GEMV
// ([ceil(F / 16), r' / 4, 16, 4] int8, r' = r rounded up to 32, with its output
// scales c2_scale [F]; [1] for float C2), c [F], W1ᵀ [F, d], W2 [F, d],
// b2 [d], s1 [F] and s2 [F] (row scales; ones for float weights) -> y [T, d].
// Norm scale and bias: the LayerNorm before the block (NormRows).
struct SparseFFOperands {
  ffi::Buffer<ffi::F32> c1;
  ffi::AnyBuffer c2;
  ffi::Buffer<ffi::F32> c2_scale, cb;
  ffi::AnyBuffer w1t, w2;
  ffi::Buffer<ffi::F32> b2, s1, s2, norm_scale, norm_bias;
};

// The sparse QKV step (paper §3.2, Fig. 4b) of one new position per row, in
// one call, its matrices stored 'q8' (layers.KernelSparseQKV): the
// multiplicative layer y = Q8((x D[s]) E) + b [B, S, M]; the image of the
// F - 1 kept inputs and y; the patches of its last position, multiplied by
// the Q and K kernels side by side (one product, the patches quantized
// once) and, with their own patches, by the V kernel; the kept inputs shift
// by one. Each product is tf_q8_matmul's on the same operands (the same
// bits as the three calls it replaces), without XLA's patch tensors.
// x [B, d], D int8 [S, d] with row scales [S], E packed (d -> M) with its
// scales [M] and bias [S * M], kept [B, F - 1, S, M], the Q/K kernels
// packed (F qk_width M -> 2 M), scales and bias [2 M], the V kernel packed
// (F v_width M -> M), scales and bias [M] -> q, k, v [B, S * M], kept'.
struct SparseQKVOperands {
  ffi::Buffer<ffi::S8> dg;
  ffi::Buffer<ffi::F32> dg_scale;
  ffi::Buffer<ffi::S8> e;
  ffi::Buffer<ffi::F32> e_scale, e_bias, kept;
  ffi::Buffer<ffi::S8> qk;
  ffi::Buffer<ffi::F32> qk_scale, qk_bias;
  ffi::Buffer<ffi::S8> v;
  ffi::Buffer<ffi::F32> v_scale, v_bias;
};

// A sparse QKV attention step (paper §3.2, Fig. 4b) of one position per
// row in one call (layers.KernelSparseQKVAttention): sparse QKV's step
// (SparseQKVStep, tf_sparse_qkv's operands), its keys and values written
// into the caches at position idx (the results keys' and values' alias the
// caches: written in place), then the attention of its queries over the
// filled part of the caches (AttendCache, tf_cache_attention's). The heads
// are the Q/K/V features in rows of D: keys and values [N, L, D] with N D
// = B S M (N = B heads), valid [N, L] (pred; [1]: every key valid), idx []
// -> y [B, 1, S M] (the heads merged), keys', values', kept'.
struct CacheOperands {
  ffi::Buffer<ffi::F32> keys, values;
  ffi::Buffer<ffi::PRED> valid;
  ffi::Buffer<ffi::S32> idx;
  ffi::Buffer<ffi::F32> norm_scale, norm_bias;
};

// A dense layer stored 'q8' (layers.KernelDense): packed W, its output
// scales [N] and bias [N] (or [1]: none).
struct Q8Dense {
  ffi::Buffer<ffi::S8> p;
  ffi::Buffer<ffi::F32> scale, bias;
};

// The Terraformer's low-rank SRU path (§4.3, low_rank_sru.py) of one
// position per row: LayerNorm, Dense(d_model -> n), the SRU cell from its
// state c [T, n] (Trax's tl.SRU: [r~ | f~ | x~] = h W + b, r = σ(r~),
// f = σ(f~), c' = f c + (1 - f) x~, out = r g(c') + (1 - r) h α), then
// Dense(n -> d_model): x [T, d] -> y [T, d], c' at c_out.
struct SruOperands {
  ffi::Buffer<ffi::F32> norm_scale, norm_bias;
  Q8Dense down;
  ffi::Buffer<ffi::F32> w, b, c;
  Q8Dense up;
};

// An encoder-decoder attention step with sparse queries (models/common.py's
// cross_attention with cross_attention_sparsity: Trax's AttentionQKV with
// q_sparsity, result_sparsity='noop') of one position per row: LayerNorm,
// sparse QKV's multiplicative layer and the queries' convolution (the
// products of SparseQKVStep, one output), then attention over the
// encoder's keys and values as CrossAttention keeps them (AttendKeysT); no
// output layer. Operands: D, its scales, E packed, its scales and bias, the
// kept inputs, the Q kernel packed (F q_width M -> M), its scales and bias;
// the encoder's keys [B, H, D, L] and values [B, H, L, D], its mask [B, L]
// (float, 0: padding), the norm's scale and bias.
struct SparseQOperands {
  ffi::Buffer<ffi::S8> dg;
  ffi::Buffer<ffi::F32> dg_scale;
  ffi::Buffer<ffi::S8> e;
  ffi::Buffer<ffi::F32> e_scale, e_bias, kept;
  ffi::Buffer<ffi::S8> q;
  ffi::Buffer<ffi::F32> q_scale, q_bias;
};

struct EncoderOperands {
  ffi::Buffer<ffi::F32> keys_t, values, mask, norm_scale, norm_bias;
};

// Reads a call's operands in order (RemainingArgs), once Check has found
// each of the element type it should have (then every read decodes).
class ArgReader {
 public:
  using Type = ffi::DataType;
  static constexpr Type kF32 = Type::F32, kS8 = Type::S8;
  // Either float32 or int8 (the sparse FF's C2, W1ᵀ and W2).
  static constexpr Type kAny = Type::INVALID;
  static constexpr Type kSparseQKV[] = {kS8, kF32, kS8, kF32, kF32, kF32,
                                        kS8, kF32, kF32, kS8, kF32, kF32};
  static constexpr Type kCache[] = {kF32, kF32, Type::PRED, Type::S32,
                                    kF32, kF32};
  // C1, C2, C2's scales, c, W1ᵀ, W2, b2, s1, s2, norm scale and bias.
  static constexpr Type kSparseFF[] = {kF32, kAny, kF32, kF32, kAny, kAny,
                                       kF32, kF32, kF32, kF32, kF32};
  static constexpr Type kDense[] = {kS8, kF32, kF32};
  static constexpr Type kSparseQ[] = {kS8, kF32, kS8, kF32, kF32,
                                      kF32, kS8, kF32, kF32};
  static constexpr Type kEncoder[] = {kF32, kF32, kF32, kF32, kF32};

  // A Scaling Transformer block's operand types (tf_scaling_block): x,
  // the attention's, with `cross` the cross-attention's, the sparse FF's.
  static std::vector<Type> ScalingBlockTypes(bool cross) {
    std::vector<Type> t = {kF32};
    t.insert(t.end(), std::begin(kSparseQKV), std::end(kSparseQKV));
    t.insert(t.end(), std::begin(kCache), std::end(kCache));
    if (cross) {
      t.insert(t.end(), std::begin(kSparseQ), std::end(kSparseQ));
      t.insert(t.end(), std::begin(kEncoder), std::end(kEncoder));
    }
    t.insert(t.end(), std::begin(kSparseFF), std::end(kSparseFF));
    return t;
  }

  explicit ArgReader(const ffi::RemainingArgs& args) : args_(args) {}

  // "" when operand i has types[i] for every i and there are no others.
  std::string Check(const std::vector<Type>& types) const {
    if (types.size() != args_.size()) {
      return "expected " + std::to_string(types.size()) + " operands, got " +
             std::to_string(args_.size());
    }
    for (size_t i = 0; i < types.size(); ++i) {
      auto any = args_.get<ffi::AnyBuffer>(i);
      if (!any.has_value()) return "operand " + std::to_string(i) + " is not a buffer";
      const Type t = any->element_type();
      const bool ok = types[i] == kAny ? (t == kF32 || t == kS8 || t == Type::BF16)
                                       : t == types[i];
      if (!ok) return "operand " + std::to_string(i) + " has the wrong type";
    }
    return "";
  }

  template <typename T>
  T Next() { return *args_.get<T>(next_++); }

  SparseQKVOperands SparseQKV() {
    return {Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::S8>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>()};
  }
  CacheOperands Cache() {
    return {Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::PRED>>(), Next<ffi::Buffer<ffi::S32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>()};
  }
  SparseFFOperands SparseFF() {
    return {Next<ffi::Buffer<ffi::F32>>(), Next<ffi::AnyBuffer>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::AnyBuffer>(),        Next<ffi::AnyBuffer>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>()};
  }
  SparseQOperands SparseQ() {
    return {Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>()};
  }
  EncoderOperands Encoder() {
    return {Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>()};
  }
  Q8Dense Dense() {
    return {Next<ffi::Buffer<ffi::S8>>(), Next<ffi::Buffer<ffi::F32>>(),
            Next<ffi::Buffer<ffi::F32>>()};
  }

 private:
  const ffi::RemainingArgs& args_;
  size_t next_ = 0;
};

}  // namespace terraformer::kernels

#endif  // TERRAFORMER_KERNELS_OPERANDS_H_
