// The CPU probe and the instruction sets in use (isa.h).
#include "isa.h"

namespace terraformer::kernels {

CpuFeatures ProbeCpu() {
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  const bool avx512 = fma && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  return {fma && __builtin_cpu_supports("avx2"), avx512,
          avx512 && __builtin_cpu_supports("avx512vnni")};
}

Isa DetectIsa() {
  const CpuFeatures cpu = ProbeCpu();
  return cpu.avx512 ? Isa::kAvx512 : cpu.avx2 ? Isa::kAvx2 : Isa::kScalar;
}

// Set by tf_set_isa (tests force the fallbacks); starts at the best one.
std::atomic<int> g_isa{static_cast<int>(DetectIsa())};

GemvIsa DetectGemvIsa() {
  const CpuFeatures cpu = ProbeCpu();
  return cpu.avx512_vnni ? GemvIsa::kAvx512Vnni
         : cpu.avx2      ? GemvIsa::kAvx2
                         : GemvIsa::kScalar;
}

// Set by tf_set_gemv_isa (tests force the fallbacks); starts at the best.
std::atomic<int> g_gemv_isa{static_cast<int>(DetectGemvIsa())};

}  // namespace terraformer::kernels
