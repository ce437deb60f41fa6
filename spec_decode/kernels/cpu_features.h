// Which vector instruction sets this CPU runs, for the kernels' run-time
// dispatch (each kernel is compiled for all of them through target
// attributes; no -march flag ties the library to the build machine).

#ifndef SPEC_DECODE_KERNELS_CPU_FEATURES_H_
#define SPEC_DECODE_KERNELS_CPU_FEATURES_H_

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#define SD_X86 1
#include <immintrin.h>
#define SD_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define SD_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma")))
#else
#define SD_X86 0
#endif

// For a helper that only prefetches: GCC 12's interprocedural passes
// (ipa-pure-const, ipa-modref) find such a function free of side effects
// when it is not yet inlined and delete every call to it, prefetches and
// all. Inlined first, its prefetches stay (tests/test_kernels.py counts
// them in the built library).
#define SD_ALWAYS_INLINE inline __attribute__((always_inline))

namespace spec_decode {

enum Isa : int32_t {
  kBest = 0,      // The widest the CPU supports.
  kPortable = 1,  // Plain C++: the reference.
  kAvx2 = 2,      // AVX2 + FMA.
  kAvx512 = 3,    // AVX-512F.
};


inline bool CpuSupports(Isa isa) {
#if SD_X86
  __builtin_cpu_init();
  switch (isa) {
    case kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma");
    case kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default:
      return true;
  }
#else
  return isa == kPortable || isa == kBest;
#endif
}

// AVX512_BF16 (VDPBF16PS) beside AVX-512F.
inline bool CpuHasAvx512Bf16() {
#if SD_X86
  __builtin_cpu_init();
  return CpuSupports(kAvx512) && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

inline Isa BestIsa() {
  static const Isa best = CpuSupports(kAvx512) ? kAvx512
                          : CpuSupports(kAvx2) ? kAvx2
                                               : kPortable;
  return best;
}

}  // namespace spec_decode

#endif  // SPEC_DECODE_KERNELS_CPU_FEATURES_H_
