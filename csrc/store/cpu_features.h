// Optional x86 instruction sets, detected at run time: the build targets baseline x86-64, so a kernel
// that needs more (compiled with a target attribute) runs only where cpu_has_avx2_fma() says so, and
// a portable version runs elsewhere.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RECDEV_STORE_AVX2_KERNELS 1
#define RECDEV_STORE_AVX2_FMA __attribute__((target("avx2,fma")))
#define RECDEV_STORE_AVX2_FMA_F16C __attribute__((target("avx2,fma,f16c")))

namespace recdev::store {

inline bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// Float16 <-> float32 conversion 8 at a time (every AVX2 CPU made has it, but it is its own flag).
inline bool cpu_has_avx2_f16c() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
}

inline bool cpu_has_avx2_fma_f16c() {
  static const bool has = cpu_has_avx2_fma() && __builtin_cpu_supports("f16c");
  return has;
}

inline bool cpu_has_avx512f() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

}  // namespace recdev::store
#endif
