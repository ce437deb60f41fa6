// Products on AMX tiles (`amx_products.cc`): the bfloat16-input product
// `bf16_products.cc`'s handler runs where the CPU has AMX-BF16 and the OS
// lets the process use it (`isa` kBest or kAmxIsa), and the float32-input
// product in bfloat16 parts (`amx_split.cc`, its own FFI target,
// `SdAmxSplitMatmul`).

#ifndef SPEC_DECODE_KERNELS_AMX_PRODUCTS_H_
#define SPEC_DECODE_KERNELS_AMX_PRODUCTS_H_

#include <cstdint>
#include <vector>

#include "cpu_features.h"
#include "xla/ffi/api/ffi.h"

// AMX intrinsics came with GCC 11 and Clang 12; an older compiler builds
// the library without the AMX paths (AmxUsable() is then false).
#if SD_X86 && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define SD_AMX 1
#define SD_TARGET_AMX                                                  \
  __attribute__((target(                                               \
      "amx-tile,amx-bf16,avx512f,avx512bf16,avx512bw,avx512vl")))
#else
#define SD_AMX 0
#endif

namespace spec_decode {

// The `isa` attribute value naming the AMX paths (`library.ISA_AMX`).
constexpr int32_t kAmxIsa = 4;

// The pair layout of `bf16_products.cc` ([P, K / 2, 64] bfloat16): output
// columns per panel, and bfloat16 values per panel row (a pair per column).
constexpr int64_t kPairPanel = 32;
constexpr int64_t kPairRow = 2 * kPairPanel;

// `buffer` resized to hold `values` bfloat16 values from a 64-byte aligned
// start, which is returned: a tile row (64 bytes) that straddles two cache
// lines loads slower (a 512 x 512 product of 8 float32 rows in parts on a
// 2-vCPU Sapphire Rapids class VM: 38-41 us from an unaligned buffer,
// 31-34 us aligned).
inline uint16_t* AlignedForTiles(std::vector<uint16_t>& buffer,
                                 int64_t values) {
  constexpr uintptr_t kLine = 64;
  buffer.resize(static_cast<size_t>(values) + kLine / sizeof(uint16_t));
  const uintptr_t start = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<uint16_t*>((start + kLine - 1) & ~(kLine - 1));
}

// Whether this CPU has AMX-BF16 and the OS lets this process use the tile
// data (Linux grants it per process on request; asked once).
bool AmxUsable();

// y[M, N] = x[M, K] @ W in float32 sums on AMX tiles, K even; x bfloat16
// bits [M, K], W packed as `bf16_products.cc` describes ([P, K / 2, 64]).
// Call only where AmxUsable().
void AmxProduct(xla::ffi::ThreadPool& pool, int32_t threads,
                const uint16_t* x, const uint16_t* w, float* y, int64_t m,
                int64_t k, int64_t n);

// y[i] = sum over j < parts of x[parts * i + j] @ W for i < M, K even:
// each row of y from `parts` consecutive bfloat16 rows of x ([parts * M, K]
// bits), their sums added from the last to the first (the same order
// whatever M). W packed as above. Call only where AmxUsable().
void AmxPartsProduct(xla::ffi::ThreadPool& pool, int32_t threads,
                     const uint16_t* x, int64_t parts, const uint16_t* w,
                     float* y, int64_t m, int64_t k, int64_t n);

// y[M, N] = x[M, K] @ W for float32 x on AMX tiles, W packed as above and
// holding bfloat16 values: each row of x goes in as three bfloat16 parts
// that add up to it exactly, so every product is exact and only the float32
// sums round (float32-accurate, but not the FMA chain's bits). K even.
// Call only where AmxUsable().
void AmxSplitProduct(xla::ffi::ThreadPool& pool, int32_t threads,
                     const float* x, const uint16_t* w, float* y, int64_t m,
                     int64_t k, int64_t n);

}  // namespace spec_decode

#endif  // SPEC_DECODE_KERNELS_AMX_PRODUCTS_H_
