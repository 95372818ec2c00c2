// The CPU probe and the instruction sets in use (isa.h).
#include "isa.h"

#include <cpuid.h>

#include <algorithm>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace terraformer::kernels {

namespace {

// AMX-TILE and AMX-INT8 usable by this process: CPUID.(EAX=7,ECX=0):EDX
// bits 24 and 25, XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA) set by the OS
// (XGETBV, once CPUID.1:ECX.OSXSAVE says it may run), and on Linux the
// tile data state granted to the process (ARCH_REQ_XCOMP_PERM; without it
// the first tile instruction faults). Probed once per process.
bool ProbeAmx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (((d >> 24) & 3u) != 3u) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return false;
  unsigned lo, hi;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if (((lo >> 17) & 3u) != 3u) return false;
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return true;
#endif
}

}  // namespace

CpuFeatures ProbeCpu() {
  __builtin_cpu_init();
  static const bool amx = ProbeAmx();
  const bool fma = __builtin_cpu_supports("fma");
  const bool avx512 = fma && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  const bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
  // The AMX path's vector part is VNNI's (every AMX CPU has it).
  return {fma && __builtin_cpu_supports("avx2"), avx512, vnni, vnni && amx};
}

Isa DetectIsa() {
  const CpuFeatures cpu = ProbeCpu();
  return cpu.avx512 ? Isa::kAvx512 : cpu.avx2 ? Isa::kAvx2 : Isa::kScalar;
}

// Set by tf_set_isa (tests force the fallbacks); starts at the best one.
std::atomic<int> g_isa{static_cast<int>(DetectIsa())};

GemvIsa DetectGemvIsa() {
  const CpuFeatures cpu = ProbeCpu();
  return cpu.amx ? GemvIsa::kAmx : VectorGemvIsa(GemvIsa::kAmx);
}

GemvIsa UsableGemvIsa(GemvIsa want) {
  if (want == GemvIsa::kAmxEmulated) return want;
  return std::min(want, DetectGemvIsa());
}

GemvIsa VectorGemvIsa(GemvIsa isa) {
  if (!IsTileGemv(isa)) return isa;
  const CpuFeatures cpu = ProbeCpu();
  return cpu.avx512_vnni ? GemvIsa::kAvx512Vnni
         : cpu.avx2      ? GemvIsa::kAvx2
                         : GemvIsa::kScalar;
}

// Set by tf_set_gemv_isa (tests force the fallbacks); starts at the best.
std::atomic<int> g_gemv_isa{static_cast<int>(DetectGemvIsa())};

}  // namespace terraformer::kernels
