// The steps of the fused kernels (steps.h): each one operation of a
// decoding step, on operands checked first (a wrong shape is a message,
// not a crash).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "gemv.h"
#include "isa.h"
#include "operands.h"
#include "parallel.h"
#include "row_ops.h"
#include "steps.h"

namespace terraformer::kernels {

namespace {

// Chunks of a sparse FF step's blocks (at most): as many as a 2-4 thread
// pool takes evenly.
constexpr int64_t kFFChunks = 4;

}  // namespace

// What is wrong with a packed matrix's dimensions `pd` for K inputs and N
// outputs (pack_q8: [ceil(N / 16), Kp / 4, 16, 4], Kp = K rounded up to a
// multiple of 32); "" when nothing.
std::string PackedProblem(const char* name, ffi::Span<const int64_t> pd,
                          int64_t K, int64_t N) {
  if (pd.size() != 4 || pd[2] != kQ8Rows || pd[3] != 4) {
    return std::string("packed ") + name + " must be [G, Kp / 4, 16, 4]";
  }
  const int64_t kp = pd[1] * 4;
  if (K <= 0 || kp != (K + kQ8Block - 1) / kQ8Block * kQ8Block) {
    return std::string("packed ") + name + " has " + std::to_string(kp) +
           " inputs for K = " + std::to_string(K) +
           " (K rounded up to a multiple of 32)";
  }
  if (pd[0] != (N + kQ8Rows - 1) / kQ8Rows) {
    return std::string("packed ") + name + " has " + std::to_string(pd[0]) +
           " groups of 16 outputs for " + std::to_string(N) + " scales";
  }
  return "";
}

// Trax's tl.LayerNorm (center, epsilon) of rows x [T, d]: (x - mean) /
// sqrt(var + epsilon) * scale + bias, mean and var over each row (summed in
// double). A decoding step's kernels take it as an optional first operation
// (`norm`): scale [d] (or [1]: none), bias [d]. Returns x, or `out` when it
// normalized into it.
const float* NormRows(const float* x, int64_t T, int64_t d,
                      const ffi::Buffer<ffi::F32>& scale,
                      const ffi::Buffer<ffi::F32>& bias, float epsilon,
                      std::vector<float>* out) {
  if (static_cast<int64_t>(scale.element_count()) != d) return x;
  out->resize(T * d);
  const float* g = scale.typed_data();
  const float* b = bias.typed_data();
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * d;
    float* yt = out->data() + t * d;
    double sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += xt[i];
    const float mean = static_cast<float>(sum / d);
    double squares = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      const float c = xt[i] - mean;
      squares += static_cast<double>(c) * c;
    }
    const float root = std::sqrt(static_cast<float>(squares / d) + epsilon);
    for (int64_t i = 0; i < d; ++i) yt[i] = (xt[i] - mean) / root * g[i] + b[i];
  }
  return out->data();
}

// A norm's operands are valid: scale and bias [d], or scale [1] (none).
bool NormFits(const ffi::Buffer<ffi::F32>& scale,
              const ffi::Buffer<ffi::F32>& bias, int64_t d) {
  return scale.element_count() == 1 ||
         (static_cast<int64_t>(scale.element_count()) == d &&
          static_cast<int64_t>(bias.element_count()) == d);
}


// The step on x_count / d rows at x_in, into yp; `name` prefixes its errors.
ffi::Error SparseFFStep(ffi::ThreadPool* pool, const char* name,
                        const float* x_in, int64_t x_count,
                        const SparseFFOperands& o, float* yp, int64_t block,
                        float epsilon) {
  const auto& [c1, c2, c2_scale, cb, w1t, w2, b2, s1, s2, norm_scale,
               norm_bias] = o;
  auto bad = [name](const std::string& what) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(name) + ": " + what);
  };
  const int64_t d = c1.dimensions()[0], r = c1.dimensions()[1];
  if (!NormFits(norm_scale, norm_bias, d)) {
    return bad("the norm's scale and bias must be [d]");
  }
  const bool q8_controller = c2.element_type() == ffi::DataType::S8;
  const int64_t F = q8_controller
                        ? static_cast<int64_t>(c2_scale.element_count())
                        : c2.dimensions()[1];
  if (d <= 0 || x_count % d != 0) return bad("x's last axis is not d");
  const int64_t T = x_count / d;
  if (q8_controller) {
    if (std::string what = PackedProblem("C2", c2.dimensions(), r, F);
        !what.empty()) {
      return bad(what);
    }
  } else if (c2.element_type() != ffi::DataType::F32) {
    return bad("C2 must be f32 or packed s8");
  }
  if (w1t.element_type() != w2.element_type()) {
    return bad("W1ᵀ and W2 differ in type");
  }
  if (block <= 0 || F % block) {
    return bad("block size must divide d_ff");
  }
  const int64_t n_blocks = F / block;
  thread_local std::vector<float> normed;
  const float* xp = NormRows(x_in, T, d, norm_scale, norm_bias, epsilon,
                             &normed);
  // The call's buffers, reused from call to call: at 17B the logits and the
  // chunks' rows are 0.3 and 0.15 MB, fresh pages (faults, clearing) each
  // call if allocated. Helpers reach them through these references.
  thread_local std::vector<float> low_buf, logits_buf, partial_buf;
  std::vector<float>& low = low_buf;
  std::vector<float>& logits = logits_buf;
  std::vector<float>& partial = partial_buf;
  low.resize(T * r);
  logits.resize(T * F);
  Isa isa = CurrentIsa();
  // Controller: (x C1) C2 + c, never the d x F product C1 C2.
  // Few rows: the columns of C1 in two halves over the pool (more reads in
  // flight; each column's sum is the same).
  const int64_t half = r / 2 / 16 * 16;
  if (T < kManyRows && half > 0 &&
      d * r * static_cast<int64_t>(sizeof(float)) >= g_parallel_bytes.load()) {
    ParallelFor(pool, 2, [&](int64_t c) {
      Panel(isa, xp, T, d, c1.typed_data(), r, low.data(), r,
            c == 0 ? 0 : half, c == 0 ? half : r);
    });
  } else {
    Matmul<float>(nullptr, xp, T, d, c1.typed_data(), r, low.data(), r);
  }
  if (q8_controller) {
    const std::vector<float> ones(r, 1.f);
    Q8Out o{c2_scale.typed_data(), nullptr, 1, F, logits.data()};
    Q8Matmul(pool, low.data(), T, ones.data(), 1, r,
             static_cast<const int8_t*>(c2.untyped_data()), c2.dimensions()[0],
             c2.dimensions()[1] * 4, o);
  } else {
    Matmul<float>(pool, low.data(), T, r,
                  static_cast<const float*>(c2.untyped_data()), F,
                  logits.data(), F);
  }
  const float* cbp = cb.typed_data();
  const float* s1p = s1.typed_data();
  const float* s2p = s2.typed_data();
  const float* b2p = b2.typed_data();
  return Dispatch(w1t.element_type(), name, [&](auto tag) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    const W* w1p = static_cast<const W*>(w1t.untyped_data());
    const W* w2p = static_cast<const W*>(w2.untyped_data());
    // The blocks go in kFFChunks fixed chunks, each summing into its own
    // row; y = b2 + the chunks' rows in order: the same bits whether the
    // chunks ran on one thread or several.
    const int64_t n_chunks = std::min(kFFChunks, n_blocks);
    const int64_t per_chunk = (n_blocks + n_chunks - 1) / n_chunks;
    partial.resize(n_chunks * d);
    // Bytes of the selected rows of W1ᵀ and W2 that one token reads.
    const bool parallel = n_blocks * 2 * d * static_cast<int64_t>(sizeof(W)) >=
                          g_parallel_bytes.load();
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = xp + t * d;
      const float* lt = logits.data() + t * F;
      std::fill(partial.begin(), partial.end(), 0.f);
      ParallelFor(parallel ? pool : nullptr, n_chunks, [&](int64_t c) {
        float* yc = partial.data() + c * d;
        const int64_t k0 = c * per_chunk;
        const int64_t k1 = std::min(n_blocks, (c + 1) * per_chunk);
        if (k0 >= k1) return;
        // The chunk's rows: one per block (its first maximum), then their
        // W1ᵀ dot products, then the W2 rows that the ReLU passes, in
        // block order (each row's sum into yc as Axpy alone gives).
        std::vector<const W*> w1_rows(k1 - k0), w2_rows;
        std::vector<float> h(k1 - k0), a;
        std::vector<int64_t> rows(k1 - k0);
        for (int64_t k = k0; k < k1; ++k) {
          rows[k - k0] =
              k * block + BlockArgmax(isa, lt + k * block, cbp + k * block, block);
          w1_rows[k - k0] = w1p + rows[k - k0] * d;
        }
        const int64_t n = k1 - k0;
        for (int64_t i = 0; i < n; i += kFFRows) {
          const int m = static_cast<int>(std::min<int64_t>(kFFRows, n - i));
          const int m_next =
              static_cast<int>(std::min<int64_t>(kFFRows, n - i - m));
          DotRows(isa, w1_rows.data() + i, m, w1_rows.data() + i + m, m_next,
                  xt, d, h.data() + i);
        }
        for (int64_t i = 0; i < n; ++i) {
          const float hi = s1p[rows[i]] * h[i];
          if (hi > 0.f) {
            a.push_back(hi * s2p[rows[i]]);
            w2_rows.push_back(w2p + rows[i] * d);
          }
        }
        const int64_t n2 = static_cast<int64_t>(w2_rows.size());
        for (int64_t i = 0; i < n2; i += kFFRows) {
          const int m = static_cast<int>(std::min<int64_t>(kFFRows, n2 - i));
          const int m_next =
              static_cast<int>(std::min<int64_t>(kFFRows, n2 - i - m));
          AxpyRows(isa, a.data() + i, w2_rows.data() + i, m,
                   w2_rows.data() + i + m, m_next, yc, d);
        }
      });
      float* yt = yp + t * d;
      std::copy(b2p, b2p + d, yt);
      for (int64_t c = 0; c < n_chunks; ++c) {
        const float* yc = partial.data() + c * d;
        for (int64_t i = 0; i < d; ++i) yt[i] += yc[i];
      }
    }
  });
}

namespace {

// The patches of one convolution (ModuleConv, layers.conv_patches) at the
// last position of `image` [B, F, S, M]: row b * S + s holds, for dl < F and
// dm < W, image[b, dl, s + dm - (W - 1) / 2, :] (zeros past the modules),
// F * W * M inputs in the order of the flat kernel [F, W, M, M].
void ConvPatches(const float* image, int64_t B, int64_t F, int64_t S,
                 int64_t M, int64_t W, float* patches) {
  const int64_t width = F * W * M;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      float* row = patches + (b * S + s) * width;
      for (int64_t dl = 0; dl < F; ++dl) {
        for (int64_t dm = 0; dm < W; ++dm) {
          float* to = row + (dl * W + dm) * M;
          const int64_t src = s + dm - (W - 1) / 2;
          if (src < 0 || src >= S) {
            std::fill(to, to + M, 0.f);
          } else {
            const float* from = image + ((b * F + dl) * S + src) * M;
            std::copy(from, from + M, to);
          }
        }
      }
    }
  }
}

// The shape of a sparse QKV step's image, its convolutions' input: B rows,
// F positions (the F - 1 kept inputs and the new one), S modules of M
// features.
struct ImageShape {
  int64_t B, F, S, M;
};

// "" when x [B, d] and the multiplicative layer's operands of `o` (a
// SparseQKVOperands or SparseQOperands: D [S, d] and its scales [S], E
// packed (d -> M) with its scales [M] and bias [S * M], the kept inputs
// [B, F - 1, S, M]) agree; their shape at *shape.
template <typename O>
std::string CheckMultiplicative(int64_t x_count, const O& o,
                                ImageShape* shape) {
  auto gd = o.d.dimensions();
  auto kd = o.kept.dimensions();
  if (gd.size() != 2 || kd.size() != 4 || kd[1] < 1) {
    return "D must be [S, d] and the kept inputs [B, F - 1, S, M]";
  }
  const int64_t S = gd[0], K = gd[1], B = kd[0], M = kd[3];
  if (kd[2] != S || x_count != B * K ||
      static_cast<int64_t>(o.d_scale.element_count()) != S) {
    return "x must be [B, d], D's scales [S] and the kept inputs "
           "[B, F - 1, S, M]";
  }
  if (static_cast<int64_t>(o.e_scale.element_count()) != M ||
      static_cast<int64_t>(o.e_bias.element_count()) != S * M) {
    return "E's scales and bias must be [M] and [S * M]";
  }
  *shape = {B, kd[1] + 1, S, M};
  return PackedProblem("E", o.e.dimensions(), K, M);
}

// y = Q8((x D[s]) E) + b [B, S, M] (tf_q8_matmul's product) from `o`'s
// multiplicative layer, the image [B, F, S, M] of its kept inputs and y,
// and the kept inputs shifted by one at kept_out. Returns the image (a
// buffer reused from call to call).
template <typename O>
const float* MultiplicativeImage(ffi::ThreadPool* pool, const float* xp,
                                 const ImageShape& s, const O& o,
                                 float* kept_out) {
  const auto [B, F, S, M] = s;
  thread_local std::vector<float> y, image;
  y.resize(B * S * M);
  image.resize(B * F * S * M);
  Q8Matmul(pool, xp, B, nullptr, S, o.d.dimensions()[1], o.e.typed_data(),
           o.e.dimensions()[0], o.e.dimensions()[1] * 4,
           Q8Out{o.e_scale.typed_data(), o.e_bias.typed_data(), S, M, y.data()},
           o.d.typed_data(), o.d_scale.typed_data());
  const int64_t plane = S * M;  // One position of the image.
  for (int64_t b = 0; b < B; ++b) {
    float* to = image.data() + b * F * plane;
    std::copy(o.kept.typed_data() + b * (F - 1) * plane,
              o.kept.typed_data() + (b + 1) * (F - 1) * plane, to);
    std::copy(y.data() + b * plane, y.data() + (b + 1) * plane,
              to + (F - 1) * plane);
    std::copy(to + plane, to + F * plane, kept_out + b * (F - 1) * plane);
  }
  return image.data();
}

// A convolution at the image's last position: its patches (ConvPatches,
// module kernel width `width`) times its packed kernels (F width M ->
// n_out), as tf_q8_matmul computes it with g = ones -> out [B * S, n_out].
void ConvolveImage(ffi::ThreadPool* pool, const float* image,
                   const ImageShape& s, int64_t width,
                   const ffi::Buffer<ffi::S8>& p,
                   const ffi::Buffer<ffi::F32>& scale,
                   const ffi::Buffer<ffi::F32>& bias, int64_t n_out,
                   float* out) {
  const auto [B, F, S, M] = s;
  const int64_t k_in = F * width * M;
  thread_local std::vector<float> patches, ones;
  patches.resize(B * S * k_in);
  ConvPatches(image, B, F, S, M, width, patches.data());
  if (static_cast<int64_t>(ones.size()) < k_in) ones.assign(k_in, 1.f);
  Q8Matmul(pool, patches.data(), B * S, ones.data(), 1, k_in, p.typed_data(),
           p.dimensions()[0], p.dimensions()[1] * 4,
           Q8Out{scale.typed_data(), bias.typed_data(), 1, n_out, out});
}
}  // namespace


std::string SparseQKVStep(ffi::ThreadPool* pool, const float* xp,
                          int64_t x_count, const SparseQKVOperands& o,
                          int64_t qk_width, int64_t v_width, float* q_out,
                          float* k_out, float* v_out, float* kept_out) {
  const auto& [d, d_scale, e, e_scale, e_bias, kept, qk, qk_scale, qk_bias,
               v, v_scale, v_bias] = o;
  ImageShape s;
  if (std::string what = CheckMultiplicative(x_count, o, &s); !what.empty()) {
    return what;
  }
  const auto [B, F, S, M] = s;
  if (static_cast<int64_t>(qk_scale.element_count()) != 2 * M ||
      static_cast<int64_t>(qk_bias.element_count()) != 2 * M ||
      static_cast<int64_t>(v_scale.element_count()) != M ||
      static_cast<int64_t>(v_bias.element_count()) != M) {
    return "scales and biases must be the Q/K kernels' [2 M] and the V "
           "kernel's [M]";
  }
  if (qk_width < 1 || qk_width > S || v_width < 1 || v_width > S) {
    return "module kernel widths must be in [1, S]";
  }
  if (std::string what = PackedProblem("Q/K kernels", qk.dimensions(),
                                       F * qk_width * M, 2 * M);
      !what.empty()) {
    return what;
  }
  if (std::string what = PackedProblem("V kernel", v.dimensions(),
                                       F * v_width * M, M);
      !what.empty()) {
    return what;
  }
  const float* image = MultiplicativeImage(pool, xp, s, o, kept_out);
  thread_local std::vector<float> qk_y;
  qk_y.resize(B * S * 2 * M);
  ConvolveImage(pool, image, s, qk_width, qk, qk_scale, qk_bias, 2 * M,
                qk_y.data());
  for (int64_t r = 0; r < B * S; ++r) {
    const float* from = qk_y.data() + r * 2 * M;
    std::copy(from, from + M, q_out + r * M);
    std::copy(from + M, from + 2 * M, k_out + r * M);
  }
  ConvolveImage(pool, image, s, v_width, v, v_scale, v_bias, M, v_out);
  return "";
}

// The step on x_count / d rows at x_in (d: D's columns): y [B, 1, S M]
// (y_count floats), the caches written at keys_out and values_out (the
// results that alias them), kept_out; "" or what is wrong.
std::string SparseQKVAttentionStep(
    ffi::ThreadPool* pool, const float* x_in, int64_t x_count,
    const SparseQKVOperands& o, const CacheOperands& c, int64_t qk_width,
    int64_t v_width, float epsilon, float* y, int64_t y_count,
    float* keys_out, float* values_out, float* kept_out) {
  auto kd = c.keys.dimensions();
  const int64_t features = y_count;  // B S M
  if (kd.size() != 3 || c.values.element_count() != c.keys.element_count() ||
      kd[0] * kd[2] != features) {
    return "keys and values must be [N, L, D] with N D = B S M";
  }
  const int64_t N = kd[0], L = kd[1], D = kd[2];
  const bool masked = static_cast<int64_t>(c.valid.element_count()) == N * L;
  if (!masked && c.valid.element_count() != 1) {
    return "valid must be [N, L] or [1]";
  }
  const int64_t first = *c.idx.typed_data();
  if (first < 0 || first >= L) return "position outside the cache";
  const int64_t d = o.d.dimensions().size() == 2 ? o.d.dimensions()[1] : 0;
  if (d <= 0 || !NormFits(c.norm_scale, c.norm_bias, d) || x_count % d != 0) {
    return "x must be [B, d] and the norm's scale and bias [d]";
  }
  thread_local std::vector<float> q, k, v_new, normed;
  q.resize(features);
  k.resize(features);
  v_new.resize(features);
  const float* xp = NormRows(x_in, x_count / d, d, c.norm_scale, c.norm_bias,
                             epsilon, &normed);
  std::string what = SparseQKVStep(pool, xp, x_count, o, qk_width, v_width,
                                   q.data(), k.data(), v_new.data(), kept_out);
  if (!what.empty()) return what;
  for (int64_t n = 0; n < N; ++n) {
    std::copy(k.data() + n * D, k.data() + (n + 1) * D,
              keys_out + (n * L + first) * D);
    std::copy(v_new.data() + n * D, v_new.data() + (n + 1) * D,
              values_out + (n * L + first) * D);
  }
  AttendCache(pool, q.data(), keys_out, values_out,
              masked ? c.valid.typed_data() : nullptr, N, 1, D, L, first, y);
  return "";
}

namespace {

// y [T, N] = x [T, K] W + b as tf_q8_matmul computes it (g = ones [1, K]).
std::string Q8DenseStep(ffi::ThreadPool* pool, const Q8Dense& w,
                        const float* x, int64_t T, int64_t K, float* y) {
  const int64_t N = w.scale.element_count();
  if (std::string what = PackedProblem("W", w.p.dimensions(), K, N);
      !what.empty()) {
    return what;
  }
  thread_local std::vector<float> ones;
  if (static_cast<int64_t>(ones.size()) < K) ones.assign(K, 1.f);
  const bool bias = static_cast<int64_t>(w.bias.element_count()) == N;
  Q8Matmul(pool, x, T, ones.data(), 1, K, w.p.typed_data(),
           w.p.dimensions()[0], w.p.dimensions()[1] * 4,
           Q8Out{w.scale.typed_data(), bias ? w.bias.typed_data() : nullptr,
                 1, N, y});
  return "";
}

}  // namespace

std::string SruStep(ffi::ThreadPool* pool, const SruOperands& o,
                    const float* x, int64_t T, int64_t d, float epsilon,
                    float highway_scale, bool use_tanh, float* y,
                    float* c_out) {
  const int64_t n = o.down_scale.element_count();
  if (!NormFits(o.norm_scale, o.norm_bias, d) ||
      o.w.element_count() != static_cast<size_t>(n * 3 * n) ||
      o.b.element_count() != static_cast<size_t>(3 * n) ||
      o.c.element_count() != static_cast<size_t>(T * n) ||
      o.up_scale.element_count() != static_cast<size_t>(d)) {
    return "the SRU's operands must be a norm [d], Dense(d -> n), W [n, 3 n], "
           "b [3 n], c [B, n] and Dense(n -> d)";
  }
  thread_local std::vector<float> normed, h, gates, out;
  const float* xp = NormRows(x, T, d, o.norm_scale, o.norm_bias, epsilon,
                             &normed);
  h.resize(T * n);
  gates.resize(3 * n);
  out.resize(T * n);
  if (std::string what = Q8DenseStep(
          pool, {o.down, o.down_scale, o.down_bias}, xp, T, d, h.data());
      !what.empty()) {
    return "SRU's first dense layer: " + what;
  }
  const float* w = o.w.typed_data();
  const float* b = o.b.typed_data();
  const float* c = o.c.typed_data();
  auto sigmoid = [](float v) { return 1.f / (1.f + std::exp(-v)); };
  for (int64_t t = 0; t < T; ++t) {
    const float* ht = h.data() + t * n;
    for (int64_t j = 0; j < 3 * n; ++j) {
      float sum = 0.f;
      for (int64_t i = 0; i < n; ++i) sum += ht[i] * w[i * 3 * n + j];
      gates[j] = sum + b[j];
    }
    for (int64_t j = 0; j < n; ++j) {
      const float r = sigmoid(gates[j]), f = sigmoid(gates[n + j]);
      const float cj = f * c[t * n + j] + (1.f - f) * gates[2 * n + j];
      c_out[t * n + j] = cj;
      out[t * n + j] =
          r * (use_tanh ? std::tanh(cj) : cj) + (1.f - r) * ht[j] * highway_scale;
    }
  }
  if (std::string what = Q8DenseStep(
          pool, {o.up, o.up_scale, o.up_bias}, out.data(), T, n, y);
      !what.empty()) {
    return "SRU's second dense layer: " + what;
  }
  return "";
}

// The step on x_count / d rows at x_in: y [B, 1, d] (the heads merged),
// kept_out; "" or what is wrong.
std::string CrossAttentionStep(ffi::ThreadPool* pool, const float* x_in,
                               int64_t x_count, const SparseQOperands& o,
                               const EncoderOperands& c, int64_t q_width,
                               float epsilon, float* y, float* kept_out) {
  ImageShape s;
  if (std::string what = CheckMultiplicative(x_count, o, &s); !what.empty()) {
    return what;
  }
  const auto [B, F, S, M] = s;
  const int64_t d = o.d.dimensions()[1];
  if (!NormFits(c.norm_scale, c.norm_bias, d)) {
    return "the norm's scale and bias must be [d]";
  }
  if (static_cast<int64_t>(o.q_scale.element_count()) != M ||
      static_cast<int64_t>(o.q_bias.element_count()) != M) {
    return "the Q kernel's scales and bias must be [M]";
  }
  if (q_width < 1 || q_width > S) return "module kernel widths must be in [1, S]";
  if (std::string what = PackedProblem("Q kernel", o.q.dimensions(),
                                       F * q_width * M, M);
      !what.empty()) {
    return what;
  }
  auto kd = c.keys_t.dimensions();
  auto vd = c.values.dimensions();
  if (kd.size() != 4 || vd.size() != 4 || kd[0] != B || kd[1] * kd[2] != d ||
      vd[0] != B || vd[1] != kd[1] || vd[2] != kd[3] || vd[3] != kd[2]) {
    return "the encoder's keys must be [B, H, D, L] and its values "
           "[B, H, L, D], H D = d";
  }
  const int64_t H = kd[1], D = kd[2], L = kd[3];
  if (static_cast<int64_t>(c.mask.element_count()) != B * L) {
    return "the encoder's mask must have B L elements";
  }
  thread_local std::vector<float> normed, q;
  const float* xp = NormRows(x_in, B, d, c.norm_scale, c.norm_bias, epsilon,
                             &normed);
  const float* image = MultiplicativeImage(pool, xp, s, o, kept_out);
  q.resize(B * S * M);
  ConvolveImage(pool, image, s, q_width, o.q, o.q_scale, o.q_bias, M,
                q.data());
  AttendKeysT(pool, q.data(), c.keys_t.typed_data(), c.values.typed_data(),
              c.mask.typed_data(), H, B * H, D, L, y);
  return "";
}

}  // namespace terraformer::kernels
