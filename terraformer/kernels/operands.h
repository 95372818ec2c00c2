// The operands of the fused kernels, by name. Each group of operands that
// a step reads is one list, X(name, buffer type) in binding order, which
// makes its struct (what the step reads), its names and element types; a
// kernel's Layout lists its operands (single ones and groups, a group's
// under a prefix, "a.keys") and its results in binding order (ffi.cc,
// fused_blocks.cc). ArgReader reads a call's operands by that layout, and
// tf_kernel_signature (ffi.cc) names them: terraformer/kernels/operands.py
// holds the same lists, checked against it by tests/kernels/test_operands.py.
#ifndef TERRAFORMER_KERNELS_OPERANDS_H_
#define TERRAFORMER_KERNELS_OPERANDS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace terraformer::kernels {

namespace ffi = xla::ffi;

// The element type of a buffer type: ffi::Buffer<T>'s T; kAny for
// ffi::AnyBuffer, which takes float32, bfloat16 or int8 (the sparse FF's
// C2, W1ᵀ and W2).
constexpr ffi::DataType kAny = ffi::DataType::INVALID;
template <typename B>
struct ElementType;
template <ffi::DataType T, size_t R>
struct ElementType<ffi::Buffer<T, R>> {
  static constexpr ffi::DataType value = T;
};
template <>
struct ElementType<ffi::AnyBuffer> {
  static constexpr ffi::DataType value = kAny;
};

// One operand of a group: its name and element type.
struct Operand {
  const char* name;
  ffi::DataType type;
};

#define TF_OPERAND_MEMBER(name, type) type name;
#define TF_OPERAND_ENTRY(name, type) Operand{#name, ElementType<type>::value},
#define TF_OPERAND_READ(name, type) in.template Next<type>(),

// A group's struct from its list: the operands as members, kOperands (their
// names and element types, in order) and Read (a reader's next operands, in
// order: braced initializers run left to right).
#define TF_OPERAND_GROUP(Group, LIST)                                  \
  struct Group {                                                       \
    LIST(TF_OPERAND_MEMBER)                                            \
    static constexpr Operand kOperands[] = {LIST(TF_OPERAND_ENTRY)};   \
    template <typename Reader>                                         \
    static Group Read(Reader& in) {                                    \
      return {LIST(TF_OPERAND_READ)};                                  \
    }                                                                  \
  }

// The LayerNorm a kernel applies first (NormRows): scale [d] (or [1]:
// none) and bias [d].
#define TF_NORM_OPERANDS(X)            \
  X(norm_scale, ffi::Buffer<ffi::F32>) \
  X(norm_bias, ffi::Buffer<ffi::F32>)

// Sparse QKV's multiplicative layer and kept inputs: D int8 [S, d] with
// row scales [S], E packed (d -> M) with its scales [M] and bias [S * M],
// the kept inputs [B, F - 1, S, M].
#define TF_MULTIPLICATIVE_OPERANDS(X) \
  X(d, ffi::Buffer<ffi::S8>)          \
  X(d_scale, ffi::Buffer<ffi::F32>)   \
  X(e, ffi::Buffer<ffi::S8>)          \
  X(e_scale, ffi::Buffer<ffi::F32>)   \
  X(e_bias, ffi::Buffer<ffi::F32>)    \
  X(kept, ffi::Buffer<ffi::F32>)

// x [T, d], C1 [d, r], C2 [r, F] float32 or packed for the Q8 GEMV
// ([ceil(F / 16), r' / 4, 16, 4] int8, r' = r rounded up to 32, with its output
// scales c2_scale [F]; [1] for float C2), c [F], W1ᵀ [F, d], W2 [F, d],
// b2 [d], s1 [F] and s2 [F] (row scales; ones for float weights) -> y [T, d].
// Norm scale and bias: the LayerNorm before the block (NormRows).
#define TF_SPARSE_FF_OPERANDS(X)    \
  X(c1, ffi::Buffer<ffi::F32>)       \
  X(c2, ffi::AnyBuffer)              \
  X(c2_scale, ffi::Buffer<ffi::F32>) \
  X(c, ffi::Buffer<ffi::F32>)        \
  X(w1t, ffi::AnyBuffer)             \
  X(w2, ffi::AnyBuffer)              \
  X(b2, ffi::Buffer<ffi::F32>)       \
  X(s1, ffi::Buffer<ffi::F32>)       \
  X(s2, ffi::Buffer<ffi::F32>)       \
  TF_NORM_OPERANDS(X)
TF_OPERAND_GROUP(SparseFFOperands, TF_SPARSE_FF_OPERANDS);

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
#define TF_SPARSE_QKV_OPERANDS(X)   \
  TF_MULTIPLICATIVE_OPERANDS(X)      \
  X(qk, ffi::Buffer<ffi::S8>)        \
  X(qk_scale, ffi::Buffer<ffi::F32>) \
  X(qk_bias, ffi::Buffer<ffi::F32>)  \
  X(v, ffi::Buffer<ffi::S8>)         \
  X(v_scale, ffi::Buffer<ffi::F32>)  \
  X(v_bias, ffi::Buffer<ffi::F32>)
TF_OPERAND_GROUP(SparseQKVOperands, TF_SPARSE_QKV_OPERANDS);

// A sparse QKV attention step (paper §3.2, Fig. 4b) of one position per
// row in one call (layers.KernelSparseQKVAttention): sparse QKV's step
// (SparseQKVStep, tf_sparse_qkv's operands), its keys and values written
// into the caches at position idx (the results keys' and values' alias the
// caches: written in place), then the attention of its queries over the
// filled part of the caches (AttendCache, tf_cache_attention's). The heads
// are the Q/K/V features in rows of D: keys and values [N, L, D] with N D
// = B S M (N = B heads), valid [N, L] (pred; [1]: every key valid), idx []
// -> y [B, 1, S M] (the heads merged), keys', values', kept'.
#define TF_CACHE_OPERANDS(X)          \
  X(keys, ffi::Buffer<ffi::F32>)       \
  X(values, ffi::Buffer<ffi::F32>)     \
  X(valid, ffi::Buffer<ffi::PRED>)     \
  X(idx, ffi::Buffer<ffi::S32>)        \
  TF_NORM_OPERANDS(X)
TF_OPERAND_GROUP(CacheOperands, TF_CACHE_OPERANDS);

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
// Dense(n -> d_model): x [T, d] -> y [T, d], c' at c_out. The dense
// layers: down and up (packed W) with their scales and biases (Q8Dense).
#define TF_SRU_OPERANDS(X)             \
  TF_NORM_OPERANDS(X)                  \
  X(down, ffi::Buffer<ffi::S8>)        \
  X(down_scale, ffi::Buffer<ffi::F32>) \
  X(down_bias, ffi::Buffer<ffi::F32>)  \
  X(w, ffi::Buffer<ffi::F32>)          \
  X(b, ffi::Buffer<ffi::F32>)          \
  X(c, ffi::Buffer<ffi::F32>)          \
  X(up, ffi::Buffer<ffi::S8>)          \
  X(up_scale, ffi::Buffer<ffi::F32>)   \
  X(up_bias, ffi::Buffer<ffi::F32>)
TF_OPERAND_GROUP(SruOperands, TF_SRU_OPERANDS);

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
#define TF_SPARSE_Q_OPERANDS(X)    \
  TF_MULTIPLICATIVE_OPERANDS(X)     \
  X(q, ffi::Buffer<ffi::S8>)        \
  X(q_scale, ffi::Buffer<ffi::F32>) \
  X(q_bias, ffi::Buffer<ffi::F32>)
TF_OPERAND_GROUP(SparseQOperands, TF_SPARSE_Q_OPERANDS);

#define TF_ENCODER_OPERANDS(X)         \
  X(keys_t, ffi::Buffer<ffi::F32>)     \
  X(values, ffi::Buffer<ffi::F32>)     \
  X(mask, ffi::Buffer<ffi::F32>)       \
  TF_NORM_OPERANDS(X)
TF_OPERAND_GROUP(EncoderOperands, TF_ENCODER_OPERANDS);

// A kernel's operands or its results in binding order: each a name (a
// group's under its prefix, "prefix.name") and an element type; a result
// may be written in place into the operand of its name (the two aliased).
class Layout {
 public:
  Layout& Add(const std::string& name, ffi::DataType type = ffi::DataType::F32,
              bool in_place = false);
  // The operands of Group, named under `prefix` ("": their own names).
  template <typename Group>
  Layout& Add(const std::string& prefix) {
    for (const Operand& o : Group::kOperands) Add(Prefixed(prefix, o.name), o.type);
    return *this;
  }
  // The position of `name`; size() when there is none.
  size_t Index(const std::string& name) const;
  size_t size() const { return entries_.size(); }
  ffi::DataType type(size_t i) const { return entries_[i].type; }
  // One line per entry, "name type" (" in_place" when it is), the type as
  // operands.py writes it: f32, s8, bf16, pred, s32 or any.
  std::string Describe() const;
  static std::string Prefixed(const std::string& prefix, const char* name) {
    return prefix.empty() ? std::string(name) : prefix + "." + name;
  }

 private:
  struct Entry {
    std::string name;
    ffi::DataType type;
    bool in_place;
  };
  std::vector<Entry> entries_;
};

// What a fused kernel's binding reads and writes (tf_kernel_signature).
struct KernelLayout {
  Layout operands, results;
};

// Reads a call's operands (RemainingArgs) by their layout, once Check has
// found each of the element type it should have (then every read decodes).
class ArgReader {
 public:
  ArgReader(const ffi::RemainingArgs& args, const Layout& layout)
      : args_(args), layout_(layout) {}

  // "" when operand i has the layout's type i for every i and there are no
  // others.
  std::string Check() const;

  // The operand `name`.
  template <typename T>
  T Get(const std::string& name) {
    return *args_.get<T>(At(name));
  }
  // The operands of Group under `prefix`, from the first of them on.
  template <typename Group>
  Group Read(const std::string& prefix = "") {
    next_ = At(Layout::Prefixed(prefix, Group::kOperands[0].name));
    return Group::Read(*this);
  }
  template <typename T>
  T Next() {
    return *args_.get<T>(next_++);
  }

 private:
  // The position of `name`; a name the layout lacks is a bug (aborts).
  size_t At(const std::string& name) const;

  const ffi::RemainingArgs& args_;
  const Layout& layout_;
  size_t next_ = 0;
};

// A call's float32 results (RemainingRets) by their layout.
class Results {
 public:
  Results(const ffi::RemainingRets& rets, const Layout& layout);
  // "" when every result decodes and there are as many as the layout's.
  const std::string& problem() const { return problem_; }
  float* data(const std::string& name) const { return data_[At(name)]; }
  int64_t count(const std::string& name) const { return count_[At(name)]; }

 private:
  size_t At(const std::string& name) const;

  const Layout& layout_;
  std::string problem_;
  std::vector<float*> data_;
  std::vector<int64_t> count_;
};

// A fused kernel's call (RemainingArgs, RemainingRets) read by its layout:
// `problem` says what is wrong with its operands, else with its results
// ("" when nothing; then both read).
struct FusedCall {
  FusedCall(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets,
            const KernelLayout& layout)
      : in(args, layout.operands), out(rets, layout.results) {
    problem = in.Check();
    if (problem.empty()) problem = out.problem();
  }

  ArgReader in;
  Results out;
  std::string problem;
};

// An invalid call's error: "kernel: what".
inline ffi::Error Invalid(const std::string& kernel, const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, kernel + ": " + what);
}

}  // namespace terraformer::kernels

#endif  // TERRAFORMER_KERNELS_OPERANDS_H_
