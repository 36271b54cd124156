// Optional x86 instruction sets, detected at run time: the build targets baseline x86-64, so a kernel
// that needs more (compiled with a target attribute) runs only where cpu_has_avx2_fma() says so, and
// a portable version runs elsewhere.
#pragma once

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RECDEV_STORE_AVX2_KERNELS 1
#define RECDEV_STORE_AVX2_FMA __attribute__((target("avx2,fma")))
#define RECDEV_STORE_AVX2_FMA_F16C __attribute__((target("avx2,fma,f16c")))
#define RECDEV_STORE_AVX512_F16C __attribute__((target("avx512f,avx2,fma,f16c")))

namespace recdev::store {

// The widest kernels ATEN_CPU_CAPABILITY allows, read as PyTorch reads it: "default" keeps every
// kernel at the baseline build, "avx2" stops short of AVX-512; unset, or any other value, leaves it
// to the CPU. Tests use it to check that every width gives the same bits.
enum class CapabilityCeiling { Baseline = 0, Avx2 = 1, Any = 2 };
inline CapabilityCeiling capability_ceiling() {
  static const CapabilityCeiling ceiling = [] {
    const char* value = std::getenv("ATEN_CPU_CAPABILITY");
    if (value == nullptr) return CapabilityCeiling::Any;
    if (std::strcmp(value, "default") == 0) return CapabilityCeiling::Baseline;
    if (std::strcmp(value, "avx2") == 0) return CapabilityCeiling::Avx2;
    return CapabilityCeiling::Any;
  }();
  return ceiling;
}

inline bool cpu_has_avx2() {
  static const bool has = capability_ceiling() >= CapabilityCeiling::Avx2 && __builtin_cpu_supports("avx2");
  return has;
}

inline bool cpu_has_avx2_fma() {
  static const bool has = cpu_has_avx2() && __builtin_cpu_supports("fma");
  return has;
}

// Float16 <-> float32 conversion 8 at a time (every AVX2 CPU made has it, but it is its own flag).
inline bool cpu_has_avx2_f16c() {
  static const bool has = cpu_has_avx2() && __builtin_cpu_supports("f16c");
  return has;
}

inline bool cpu_has_avx2_fma_f16c() {
  static const bool has = cpu_has_avx2_fma() && __builtin_cpu_supports("f16c");
  return has;
}

inline bool cpu_has_avx512f() {
  static const bool has = capability_ceiling() >= CapabilityCeiling::Any && __builtin_cpu_supports("avx512f");
  return has;
}

inline bool cpu_has_avx512f_f16c() {
  static const bool has = cpu_has_avx512f() && cpu_has_avx2_fma_f16c();
  return has;
}

// The widest kernels the store runs here, named as torch.backends.cpu.get_cpu_capability() names
// PyTorch's: "AVX512", "AVX2" or "DEFAULT".
inline const char* store_kernel_capability() {
  return cpu_has_avx512f_f16c() ? "AVX512" : cpu_has_avx2_fma_f16c() ? "AVX2" : "DEFAULT";
}

}  // namespace recdev::store
#else
namespace recdev::store {
inline const char* store_kernel_capability() { return "DEFAULT"; }
}  // namespace recdev::store
#endif
