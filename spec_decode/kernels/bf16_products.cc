// A few-row matrix product with bfloat16 inputs and float32 sums,
// y[M, N] = bf16(x)[M, K] @ W[K, N], called from XLA:CPU as an FFI custom
// call (`spec_decode.kernels.matmul` on a kernel packed with
// `inputs='bfloat16'`).
//
// Why: on a CPU with AVX512_BF16 one VDPBF16PS does two multiply-adds per
// float32 lane (bfloat16 x bfloat16 products, exact in float32), twice the
// arithmetic of a float32 FMA. Past ~4 rows a decoder call on the few-row
// float32 kernel is bound by that arithmetic, not by streaming the weights
// (on a 2-vCPU VM whose two threads share one core's FMA units, 8 rows of the
// shipped target need 3.2 ms of FMAs against 2.5 ms to stream its weights).
// Rounding the activations to bfloat16 at each product is what XLA does on
// TPUs for float32 dots at default precision, and what T5X's bfloat16 models
// do everywhere; it changes results (relative 2^-9 per input), so it is a
// setting, off by default.
//
// Layout. W arrives prepared once (`kernels.pack_kernel(..., inputs=
// 'bfloat16')`) as panels of 32 output columns, [P, K / 2, 64] bfloat16:
// panel row r holds, for columns 0..31 in order, the pair (W[2r][c],
// W[2r + 1][c]); x arrives as bfloat16 [M, K] (K even), read as pairs.
//
// Arithmetic. Per output element, for r = 0, 1, ..., K / 2 - 1:
//
//   acc = fma(x[2r + 1], W[2r + 1][c], acc);  acc = fma(x[2r], W[2r][c], acc)
//
// which is what VDPBF16PS computes lane by lane (Intel's definition; checked
// bit for bit on an AMD Zen 4), except that the instruction treats bfloat16
// inputs below 2^-126 as zero and flushes partial sums below 2^-126 to zero.
// The portable path (the reference) does both; the AVX2 path, for CPUs
// without the instruction, does neither, so it agrees bit for bit wherever
// no partial sum falls below 2^-126 (activations and weights of a trained
// model never get there). As in `few_rows.cc`, the chain does not depend on
// the number of rows, the tile or the thread: a row's result does not depend
// on the rows computed with it.
//
// Where the CPU has AMX-BF16 (and the OS grants it), `isa` kBest hands the
// product to the tiles of `amx_products.cc` instead: the same packed
// panels, sums rounded the unit's own way (see there).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "amx_products.h"
#include "cpu_features.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace spec_decode {
namespace {

constexpr int64_t kPanel = kPairPanel;  // Output columns per panel.
constexpr int64_t kBlockPairs = 32;   // Panel rows per block (4 KB).

inline float WidenBf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// What a tile computes: acc[m][c] for its rows, over panel rows
// [r_begin, r_end) of one panel.
struct PairTile {
  const uint32_t* x;   // Row m0's first input pair: x[r * ldk + m * ldm].
  const float* x_even;  // The same inputs widened (AVX2 and portable paths).
  const float* x_odd;
  int64_t ldk;         // Pairs from one depth step to the next.
  int64_t ldm;         // Pairs from one row to the next.
  const uint16_t* panel;
  int64_t r_begin;
  int64_t r_end;
  float* acc;     // [mt][32] float32 sums; read unless `first`.
  bool first;
  bool prefetch;  // Ask for the next block (the block's first tile does).
};

SD_ALWAYS_INLINE void PrefetchPairRow(const PairTile& t, int64_t r) {
  if (!t.prefetch) return;
  const char* row = reinterpret_cast<const char*>(t.panel + (r + kBlockPairs) * kPairRow);
  __builtin_prefetch(row, 0, 3);
  __builtin_prefetch(row + 64, 0, 3);
}

// ---------------------------------------------------------------------------
// Portable path: the reference, with the instruction's flushing.

inline float FlushTiny(float value) {
  return std::fabs(value) < std::numeric_limits<float>::min()
             ? std::copysign(0.0f, value)
             : value;
}

template <int MT>
void PairTilePortable(const PairTile& t) {
  float acc[MT][kPanel];
  for (int m = 0; m < MT; ++m) {
    for (int64_t c = 0; c < kPanel; ++c) {
      acc[m][c] = t.first ? 0.0f : t.acc[m * kPanel + c];
    }
  }
  for (int64_t r = t.r_begin; r < t.r_end; ++r) {
    PrefetchPairRow(t, r);
    const uint16_t* row = t.panel + r * kPairRow;
    for (int m = 0; m < MT; ++m) {
      const float xe = FlushTiny(t.x_even[r * t.ldk + m * t.ldm]);
      const float xo = FlushTiny(t.x_odd[r * t.ldk + m * t.ldm]);
      for (int64_t c = 0; c < kPanel; ++c) {
        const float we = FlushTiny(WidenBf16(row[2 * c]));
        const float wo = FlushTiny(WidenBf16(row[2 * c + 1]));
        acc[m][c] = FlushTiny(std::fma(xe, we, FlushTiny(std::fma(xo, wo, acc[m][c]))));
      }
    }
  }
  for (int m = 0; m < MT; ++m) {
    for (int64_t c = 0; c < kPanel; ++c) t.acc[m * kPanel + c] = acc[m][c];
  }
}

#if SD_X86

// ---------------------------------------------------------------------------
// AVX2 + FMA: the same chain with two FMAs per pair (no arithmetic saved;
// what CPUs without AVX512_BF16 run). Up to 2 rows a tile: 4 registers of 8
// columns per row.

template <int MT>
SD_TARGET_AVX2 void PairTileAvx2(const PairTile& t) {
  const float* __restrict xe = t.x_even;
  const float* __restrict xo = t.x_odd;
  const uint16_t* __restrict panel = t.panel;
  float* __restrict sums = t.acc;
  const int64_t ldk = t.ldk, ldm = t.ldm, r_end = t.r_end;
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m256 acc[MT][4];
  for (int m = 0; m < MT; ++m) {
    for (int j = 0; j < 4; ++j) {
      acc[m][j] = t.first ? _mm256_setzero_ps()
                          : _mm256_loadu_ps(sums + m * kPanel + 8 * j);
    }
  }
#pragma GCC unroll 2
  for (int64_t r = t.r_begin; r < r_end; ++r) {
    PrefetchPairRow(t, r);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      // Columns 8j .. 8j + 7, each an (even, odd) pair in one 32-bit lane.
      const __m256i v = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(panel + r * kPairRow + 16 * j));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(v, high_half));
#pragma GCC unroll 2
      for (int m = 0; m < MT; ++m) {
        acc[m][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(xo + r * ldk + m * ldm), odd, acc[m][j]);
        acc[m][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(xe + r * ldk + m * ldm), even, acc[m][j]);
      }
    }
  }
  for (int m = 0; m < MT; ++m) {
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(sums + m * kPanel + 8 * j, acc[m][j]);
  }
}

// ---------------------------------------------------------------------------
// AVX512_BF16: one VDPBF16PS per 16 columns and row, up to 8 rows a tile.

#define SD_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bf16,avx2,fma")))

// acc += pairwise dot of w with the broadcast pair *x, the broadcast inside
// the instruction's memory operand (no vector-pipe slot of its own).
SD_TARGET_AVX512_BF16 inline void DotBroadcastBf16(const uint32_t* x,
                                                   __m512bh w, __m512* acc) {
  __asm__("vdpbf16ps %[x]%{1to16%}, %[w], %[acc]"
          : [acc] "+v"(*acc)
          : [w] "v"(w), [x] "m"(*x));
}

template <int MT>
SD_TARGET_AVX512_BF16 void PairTileAvx512Bf16(const PairTile& t) {
  const uint32_t* __restrict x = t.x;
  const uint16_t* __restrict panel = t.panel;
  float* __restrict sums = t.acc;
  const int64_t ldk = t.ldk, ldm = t.ldm, r_end = t.r_end;
  __m512 acc[MT][2];
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m) {
    for (int j = 0; j < 2; ++j) {
      acc[m][j] = t.first ? _mm512_setzero_ps()
                          : _mm512_loadu_ps(sums + m * kPanel + 16 * j);
    }
  }
#pragma GCC unroll 4
  for (int64_t r = t.r_begin; r < r_end; ++r) {
    PrefetchPairRow(t, r);
    const __m512bh w0 = reinterpret_cast<__m512bh>(
        _mm512_loadu_si512(panel + r * kPairRow));
    const __m512bh w1 = reinterpret_cast<__m512bh>(
        _mm512_loadu_si512(panel + r * kPairRow + 32));
#pragma GCC unroll 8
    for (int m = 0; m < MT; ++m) {
      DotBroadcastBf16(x + r * ldk + m * ldm, w0, &acc[m][0]);
      DotBroadcastBf16(x + r * ldk + m * ldm, w1, &acc[m][1]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m) {
    _mm512_storeu_ps(sums + m * kPanel, acc[m][0]);
    _mm512_storeu_ps(sums + m * kPanel + 16, acc[m][1]);
  }
}

#endif  // SD_X86

// ---------------------------------------------------------------------------
// Dispatch: `isa` kAvx512 runs VDPBF16PS where the CPU has it, else AVX2.

enum class PairPath { kPortable, kAvx2, kBf16 };

PairPath PickPath(Isa isa) {
#if SD_X86
  if (isa == kAvx512 && CpuHasAvx512Bf16()) return PairPath::kBf16;
  if (isa == kAvx512 || isa == kAvx2) return PairPath::kAvx2;
#endif
  (void)isa;
  return PairPath::kPortable;
}

// Rows per tile on a path.
int64_t MaxTileRows(PairPath path) {
  switch (path) {
    case PairPath::kBf16: return 8;
    case PairPath::kAvx2: return 2;
    default: return 4;
  }
}

using PairTileFn = void (*)(const PairTile&);

PairTileFn PickPairTile(PairPath path, int64_t mt) {
#if SD_X86
  if (path == PairPath::kBf16) {
    switch (mt) {
      case 1: return PairTileAvx512Bf16<1>;
      case 2: return PairTileAvx512Bf16<2>;
      case 3: return PairTileAvx512Bf16<3>;
      case 4: return PairTileAvx512Bf16<4>;
      case 5: return PairTileAvx512Bf16<5>;
      case 6: return PairTileAvx512Bf16<6>;
      case 7: return PairTileAvx512Bf16<7>;
      default: return PairTileAvx512Bf16<8>;
    }
  }
  if (path == PairPath::kAvx2) {
    return mt == 1 ? PairTileAvx2<1> : PairTileAvx2<2>;
  }
#endif
  switch (mt) {
    case 1: return PairTilePortable<1>;
    case 2: return PairTilePortable<2>;
    case 3: return PairTilePortable<3>;
    default: return PairTilePortable<4>;
  }
}

struct PairJob {
  const uint32_t* x;     // Input pairs: x[r * ldk + m * ldm].
  const float* x_even;   // The same widened (not on the kBf16 path).
  const float* x_odd;
  int64_t ldk, ldm;      // [M, K / 2] as given: 1, K / 2; transposed: M, 1.
  const uint16_t* w;     // [P, K / 2, 64].
  float* y;              // [M, N].
  int64_t m, pairs, n, panels;
  PairPath path;
};

// Panels [first, last) of the product.
void RunPairPanels(const PairJob& job, int64_t first, int64_t last,
                   std::vector<float>& sums) {
  const int64_t max_rows = MaxTileRows(job.path);
  const int64_t tiles = (job.m + max_rows - 1) / max_rows;
  sums.resize(static_cast<size_t>(job.m * kPanel));
  for (int64_t p = first; p < last; ++p) {
    PairTile tile;
    tile.panel = job.w + p * job.pairs * kPairRow;
    tile.ldk = job.ldk;
    tile.ldm = job.ldm;
    for (int64_t r0 = 0; r0 < job.pairs; r0 += kBlockPairs) {
      tile.r_begin = r0;
      tile.r_end = std::min(job.pairs, r0 + kBlockPairs);
      tile.first = r0 == 0;
      int64_t m0 = 0;
      for (int64_t i = 0; i < tiles; ++i) {
        // Tiles of near-equal size, as in few_rows.cc.
        const int64_t mt = job.m / tiles + (i < job.m % tiles ? 1 : 0);
        tile.x = job.x + m0 * job.ldm;
        tile.x_even = job.x_even == nullptr ? nullptr : job.x_even + m0 * job.ldm;
        tile.x_odd = job.x_odd == nullptr ? nullptr : job.x_odd + m0 * job.ldm;
        tile.acc = sums.data() + m0 * kPanel;
        tile.prefetch = i == 0;
        PickPairTile(job.path, mt)(tile);
        m0 += mt;
      }
    }
    const int64_t ncols = std::min<int64_t>(kPanel, job.n - p * kPanel);
    for (int64_t m = 0; m < job.m; ++m) {
      std::memcpy(job.y + m * job.n + p * kPanel, sums.data() + m * kPanel,
                  ncols * sizeof(float));
    }
  }
}

using Bf16Rows = ffi::Buffer<ffi::BF16, 2>;      // x: [M, K].
using Bf16Panels = ffi::Buffer<ffi::BF16, 3>;    // [P, K / 2, 64].
using F32Rows = ffi::Buffer<ffi::F32, 2>;        // y: [M, N].

ffi::Error Bf16InputMatmul(ffi::ThreadPool pool, Bf16Rows x, Bf16Panels packed,
                           int32_t isa_attr, int32_t threads_attr,
                           ffi::Result<F32Rows> y) {
  const auto x_dims = x.dimensions();
  const auto w_dims = packed.dimensions();
  const auto y_dims = y->dimensions();
  const int64_t m = x_dims[0], k = x_dims[1], n = y_dims[1];
  if (w_dims[2] != kPairRow) {
    return ffi::Error::InvalidArgument(
        "bf16_input_matmul: packed weight must be [panels, K / 2, 64]");
  }
  if (k % 2 != 0 || w_dims[1] * 2 != k || y_dims[0] != m ||
      n > w_dims[0] * kPanel || n <= (w_dims[0] - 1) * kPanel) {
    return ffi::Error::InvalidArgument(
        "bf16_input_matmul: shapes of x [M, K] (K even), packed "
        "[ceil(N / 32), K / 2, 64] and y [M, N] disagree");
  }
  // The AMX path: asked for, or the best where the CPU and OS allow it.
  if (isa_attr == kAmxIsa && !AmxUsable()) {
    return ffi::Error::InvalidArgument(
        "bf16_input_matmul: AMX tiles are not usable on this CPU or OS");
  }
  if (isa_attr == kAmxIsa || (isa_attr == kBest && AmxUsable())) {
    AmxProduct(pool, threads_attr,
               reinterpret_cast<const uint16_t*>(x.untyped_data()),
               reinterpret_cast<const uint16_t*>(packed.untyped_data()),
               y->typed_data(), m, k, n);
    return ffi::Error::Success();
  }
  Isa isa;
  if (ffi::Error error = ResolveIsa("bf16_input_matmul", isa_attr, &isa);
      error.failure()) {
    return error;
  }
  if (m == 0 || n == 0) return ffi::Error::Success();

  PairJob job;
  job.x = reinterpret_cast<const uint32_t*>(x.untyped_data());
  job.w = reinterpret_cast<const uint16_t*>(packed.untyped_data());
  job.y = y->typed_data();
  job.m = m;
  job.pairs = k / 2;
  job.n = n;
  job.panels = (n + kPanel - 1) / kPanel;
  job.path = PickPath(isa);
  // Where the rows make more than one tile, the inputs go depth-major
  // ([K / 2, M] pairs), so each tile's inputs at one depth are adjacent:
  // rows K values apart share L1 sets and evict each other under the
  // weight stream while every tile rereads the block (measured at 16 rows:
  // 0.67-0.72x the time as given; at 2-8 rows, one tile, the copy cost
  // more than it saved). The paths without the instruction read the inputs
  // as float32, widened here. Both once per call (M x K values, small
  // beside the weights); they live until every helper is done (the caller
  // waits).
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(x.untyped_data());
  const bool transpose = m > MaxTileRows(job.path);
  job.ldk = transpose ? m : 1;
  job.ldm = transpose ? 1 : job.pairs;
  thread_local std::vector<uint32_t> transposed;
  thread_local std::vector<float> widened;
  job.x_even = job.x_odd = nullptr;
  if (job.path == PairPath::kBf16 && transpose) {
    job.x = DepthMajor(job.x, m, job.pairs, transposed);
  }
  if (job.path != PairPath::kBf16) {
    widened.resize(static_cast<size_t>(m * k));
    float* even = widened.data();
    float* odd = even + m * job.pairs;
    for (int64_t row = 0; row < m; ++row) {
      for (int64_t r = 0; r < job.pairs; ++r) {
        const int64_t i = row * job.pairs + r;
        even[r * job.ldk + row * job.ldm] = WidenBf16(bits[2 * i]);
        odd[r * job.ldk + row * job.ldm] = WidenBf16(bits[2 * i + 1]);
      }
    }
    job.x_even = even;
    job.x_odd = odd;
  }

  ParallelOverPanels(pool, threads_attr, job.panels,
                     static_cast<size_t>(job.panels) * k * kPanel * 2,
                     [&job](int64_t first, int64_t last) {
                       thread_local std::vector<float> sums;
                       RunPairPanels(job, first, last, sums);
                     });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace spec_decode

XLA_FFI_DEFINE_HANDLER_SYMBOL(SdBf16InputMatmul, spec_decode::Bf16InputMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<spec_decode::Bf16Rows>()
                                  .Arg<spec_decode::Bf16Panels>()
                                  .Attr<int32_t>("isa")
                                  .Attr<int32_t>("threads")
                                  .Ret<spec_decode::F32Rows>());

// Whether `isa = 3` (AVX-512) runs VDPBF16PS for bfloat16-input products on
// this CPU (else the AVX2 path).
extern "C" int32_t SdHasAvx512Bf16() {
#if SD_X86
  return spec_decode::CpuHasAvx512Bf16();
#else
  return 0;
#endif
}
