// Work split over XLA's intra-op thread pool: chunks taken from an atomic
// counter, so a call never waits for a task that has not started.
#ifndef TERRAFORMER_KERNELS_PARALLEL_H_
#define TERRAFORMER_KERNELS_PARALLEL_H_

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace terraformer::kernels {

namespace ffi = xla::ffi;

// Runs work(chunk) for chunk in [0, n_chunks) on the caller and, when
// `pool` is given, on its threads too. Chunks are taken from a shared
// counter: the caller only waits for chunks that another thread started.
struct Shared {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

template <typename F>
void ParallelFor(ffi::ThreadPool* pool, int64_t n_chunks, F work) {
  int64_t helpers = 0;
  if (pool != nullptr && n_chunks > 1) {
    // The caller is one of the workers: pool threads - 1 helpers, so that
    // the workers do not outnumber the cores XLA sized its pool for.
    helpers = std::min<int64_t>(pool->num_threads() - 1, n_chunks - 1);
  }
  if (helpers <= 0) {
    for (int64_t c = 0; c < n_chunks; ++c) work(c);
    return;
  }
  auto shared = std::make_shared<Shared>();
  auto run = [shared, n_chunks, work]() {
    for (int64_t c; (c = shared->next.fetch_add(1)) < n_chunks;) {
      work(c);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t i = 0; i < helpers; ++i) pool->Schedule(decltype(run)(run));
  run();
  while (shared->done.load(std::memory_order_acquire) < n_chunks) {
    _mm_pause();
  }
}

// Products smaller than this (bytes of W) run on the calling thread only;
// tf_set_parallel_bytes changes it (a huge value: never split).
inline std::atomic<int64_t> g_parallel_bytes{1 << 20};

}  // namespace terraformer::kernels

#endif  // TERRAFORMER_KERNELS_PARALLEL_H_
