// The steps the kernels are made of, each one operation of a decoding step
// (steps.cc, attention.cc), and the whole-block fusions that chain them
// (fused_blocks.cc); ffi.cc binds them to XLA's FFI. Each definition says
// what it computes.
#ifndef TERRAFORMER_KERNELS_STEPS_H_
#define TERRAFORMER_KERNELS_STEPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "operands.h"
#include "xla/ffi/api/ffi.h"

namespace terraformer::kernels {

namespace ffi = xla::ffi;

inline ffi::Error BadType(const char* what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    std::string(what) + ": weights must be f32, bf16 or s8");
}

template <typename F>
ffi::Error Dispatch(ffi::DataType type, const char* what, F f) {
  switch (type) {
    case ffi::DataType::F32: f(static_cast<const float*>(nullptr)); break;
    case ffi::DataType::BF16: f(static_cast<const uint16_t*>(nullptr)); break;
    case ffi::DataType::S8: f(static_cast<const int8_t*>(nullptr)); break;
    default: return BadType(what);
  }
  return ffi::Error::Success();
}


// steps.cc: a packed matrix's shape check, the LayerNorm before a kernel,
// and the sparse FF, sparse QKV (with its attention), SRU and sparse-query
// cross-attention steps.
std::string PackedProblem(const char* name, ffi::Span<const int64_t> pd,
                          int64_t K, int64_t N);
const float* NormRows(const float* x, int64_t T, int64_t d,
                      const ffi::Buffer<ffi::F32>& scale,
                      const ffi::Buffer<ffi::F32>& bias, float epsilon,
                      std::vector<float>* out);
bool NormFits(const ffi::Buffer<ffi::F32>& scale,
              const ffi::Buffer<ffi::F32>& bias, int64_t d);
ffi::Error SparseFFStep(ffi::ThreadPool* pool, const char* name,
                        const float* x_in, int64_t x_count,
                        const SparseFFOperands& o, float* yp, int64_t block,
                        float epsilon);
std::string SparseQKVStep(ffi::ThreadPool* pool, const float* xp,
                          int64_t x_count, const SparseQKVOperands& o,
                          int64_t qk_width, int64_t v_width, float* q_out,
                          float* k_out, float* v_out, float* kept_out);
std::string SparseQKVAttentionStep(
    ffi::ThreadPool* pool, const float* x_in, int64_t x_count,
    const SparseQKVOperands& o, const CacheOperands& c, int64_t qk_width,
    int64_t v_width, float epsilon, float* y, int64_t y_count,
    float* keys_out, float* values_out, float* kept_out);
std::string SruStep(ffi::ThreadPool* pool, const SruOperands& o,
                    const float* x, int64_t T, int64_t d, float epsilon,
                    float highway_scale, bool use_tanh, float* y,
                    float* c_out);
std::string CrossAttentionStep(ffi::ThreadPool* pool, const float* x_in,
                               int64_t x_count, const SparseQOperands& o,
                               const EncoderOperands& c, int64_t q_width,
                               float epsilon, float* y, float* kept_out);

// attention.cc: causal attention over a key/value cache read in place, and
// attention over keys stored transposed (the encoder's).
// Causal attention of T queries per row over a cache (CacheAttentionImpl):
// qp [N, T, D], kp and vp [N, M, D], mp [N, M] (nullptr: every key valid),
// query t at position first + t -> op [N, T, D].
void AttendCache(ffi::ThreadPool* pool, const float* qp, const float* kp,
                 const float* vp, const bool* mp, int64_t N, int64_t T,
                 int64_t D, int64_t M, int64_t first, float* op);
void AttendKeysT(ffi::ThreadPool* pool, const float* qp, const float* ktp,
                 const float* vp, const float* mask, int64_t heads, int64_t N,
                 int64_t D, int64_t L, float* op);

// fused_blocks.cc: whole decoder blocks in one call, and their layouts
// (tf_scaling_block's without or with the cross-attention).
const KernelLayout& TerraformerBlockLayout();
const KernelLayout& ScalingBlockLayout(bool cross);
ffi::Error TerraformerBlockImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                                ffi::RemainingRets rets, int64_t qk_width,
                                int64_t v_width, int64_t block,
                                float epsilon, float highway_scale,
                                bool use_tanh);
ffi::Error ScalingBlockImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                            ffi::RemainingRets rets, int64_t qk_width,
                            int64_t v_width, int64_t q_width, int64_t block,
                            float epsilon, bool cross);

}  // namespace terraformer::kernels

#endif  // TERRAFORMER_KERNELS_STEPS_H_
