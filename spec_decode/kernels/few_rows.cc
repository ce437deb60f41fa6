// A matrix product for few rows, y[M, N] = x[M, K] @ W[K, N], called from
// XLA:CPU as an FFI custom call (`spec_decode.kernels.matmul`).
//
// Why: a decoder call on M = batch x chunk tokens streams every weight once;
// at small M its cost is the weight bytes over the memory bandwidth, whatever
// M is, as long as each loaded weight is reused for all M rows from
// registers. XLA:CPU sends a 1-row product to a matrix-vector kernel and a
// 2..16-row one to a general matrix multiply that repacks the weight on
// every call, so scoring 4 tokens cost ~2-3 single-token calls there.
//
// Layout. W arrives prepared once per model (`kernels.pack_kernel`) as
// panels of kPanel = 32 output columns, [P, K, 32], float32 or bfloat16
// (zero-padded past N): a panel is one contiguous stream. A tile keeps
// rows x columns float32 accumulators in registers; for every k it loads
// the tile's weights of the panel row once and does one fused multiply-add
// per row:
//
//   acc[m][n] = fma(x[m][k], W[k][n], acc[m][n]),  k = 0, 1, ..., K - 1
//
// The inputs are read depth-major (x transposed once per call, [K, M]), so
// the tile's inputs at one k share a cache line, and on AVX-512 each x[m][k]
// is broadcast inside its FMA's memory operand.
//
// That chain is the whole arithmetic of an output element. It is the same
// whatever tile size (mt), thread or instruction set computes the element,
// and a vector FMA is a scalar FMA per lane, so:
//   * a row's result does not depend on how many rows come with it
//     (batch invariance by construction);
//   * the AVX2, AVX-512 and portable paths give the same bits, and the
//     portable path (plain C++, std::fma) is their reference.
// bfloat16 weights widen to float32 exactly (a 16-bit shift).
//
// Memory. The depth is walked in blocks of 64 rows of a panel (4-8 KB):
// every tile of rows reads the block, the first from memory and the others
// from L1, and each asks for the weights one block ahead, so the weights
// stream from memory once and steadily while the tiles compute. Up to
// ~10 rows the product then costs what streaming the weights costs.
//
// Threads. Chunks of panels are shared by the calling thread and helpers on
// XLA's intra-op thread pool (`parallel.h`); each output element is
// computed by one thread, whole.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_features.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace spec_decode {

using Rows = ffi::Buffer<ffi::F32, 2>;  // [M, K] or [M, N], float32.

namespace {

constexpr int64_t kPanel = 32;  // Output columns per panel.

// What a tile computes: running sums acc[m][c] for its rows and columns,
// over k in [k_begin, k_end), against one panel.
struct Tile {
  const float* x;  // x[k][m0]: the inputs depth-major, row m0 first.
  int64_t ldk;     // Floats from one depth step to the next (all rows: M).
  const void* panel;
  int64_t k_begin;
  int64_t k_end;
  float* acc;     // [mt][32] float32 sums (AVX-512 with bfloat16 panels:
                  // register order, `SumsGroup`); read unless `first`.
  bool first;     // The first block: start the sums at zero.
  bool prefetch;  // Ask for the next block (the block's first tile does).
  int half;       // Half-width tiles (AVX2): columns 16 * half .. + 15.
};

// Rows ahead of k the first tile of a block asks for: one block, so the
// next block streams in from memory while every tile of this one computes
// from L1. (Prefetches never fault, so reaching past the last panel is
// harmless; the other tiles do not ask again: a prefetch a step costs a
// load slot, ~30% of a tile's speed.)
constexpr int64_t kBlockDepth = 64;

template <bool kBf16>
SD_ALWAYS_INLINE void PrefetchRow(const Tile& t, const void* panel, int64_t k) {
  if (!t.prefetch) return;
  constexpr int64_t kRowBytes = kBf16 ? 2 * kPanel : 4 * kPanel;
  const char* row =
      static_cast<const char*>(panel) + (k + kBlockDepth) * kRowBytes;
  __builtin_prefetch(row, 0, 3);
  if (kRowBytes > 64) __builtin_prefetch(row + 64, 0, 3);
}

// bfloat16 panels store each 16-column half interleaved: slot 2i holds
// column i and slot 2i + 1 column 8 + i, so one 16-slot load widens to two
// registers of 8 consecutive columns with two ops (even slots: << 16;
// odd slots: the high half masked). `kernels.pack_kernel` lays panels out so.
constexpr int64_t Bf16Slot(int64_t column) {
  return (column / 16) * 16 + 2 * (column % 8) + (column % 16) / 8;
}

inline float Bf16ToFloat(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// ---------------------------------------------------------------------------
// Portable path: plain C++ (what non-x86 machines run; the reference).

template <int MT, bool kBf16>
void TilePortable(const Tile& t) {
  float acc[MT][kPanel];
  for (int m = 0; m < MT; ++m) {
    for (int64_t j = 0; j < kPanel; ++j) {
      acc[m][j] = t.first ? 0.0f : t.acc[m * kPanel + j];
    }
  }
  for (int64_t k = t.k_begin; k < t.k_end; ++k) {
    PrefetchRow<kBf16>(t, t.panel, k);
    float w[kPanel];
    if (kBf16) {
      const uint16_t* row = static_cast<const uint16_t*>(t.panel) + k * kPanel;
      for (int64_t j = 0; j < kPanel; ++j) w[j] = Bf16ToFloat(row[Bf16Slot(j)]);
    } else {
      const float* row = static_cast<const float*>(t.panel) + k * kPanel;
      for (int64_t j = 0; j < kPanel; ++j) w[j] = row[j];
    }
    for (int m = 0; m < MT; ++m) {
      const float xv = t.x[k * t.ldk + m];
      for (int64_t j = 0; j < kPanel; ++j) {
        acc[m][j] = std::fma(xv, w[j], acc[m][j]);
      }
    }
  }
  for (int m = 0; m < MT; ++m) {
    for (int64_t j = 0; j < kPanel; ++j) t.acc[m * kPanel + j] = acc[m][j];
  }
}

#if SD_X86

// ---------------------------------------------------------------------------
// AVX2 + FMA (16 registers). One or two rows: full-width tiles, four
// registers a row (at least 4 independent chains per row keep the FMA
// units busy). More rows: half-width tiles of up to 6 rows, two registers a
// row, 12 accumulators (a full-width tile of 3 rows would need 17 registers
// with bfloat16's widening and spill one accumulator every step).

// Columns 16h .. 16h + 15 of panel row k as two registers of 8 columns.
template <bool kBf16>
SD_TARGET_AVX2 inline void LoadHalfAvx2(const void* panel, int64_t k, int h,
                                        __m256* low, __m256* high) {
  if (kBf16) {
    const uint16_t* row = static_cast<const uint16_t*>(panel) + k * kPanel;
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * h));
    *low = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *high = _mm256_castsi256_ps(
        _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
    return;
  }
  const float* row = static_cast<const float*>(panel) + k * kPanel;
  *low = _mm256_loadu_ps(row + 16 * h);
  *high = _mm256_loadu_ps(row + 16 * h + 8);
}

// Full width: columns 0..31, MT <= 2 rows.
template <int MT, bool kBf16>
SD_TARGET_AVX2 void TileAvx2(const Tile& t) {
  // Locals, not the struct's fields: the compiler then keeps every
  // accumulator in a register for the whole k loop.
  const float* __restrict x = t.x;
  const void* __restrict panel = t.panel;
  float* __restrict sums = t.acc;
  const int64_t ldk = t.ldk, k_end = t.k_end;
  __m256 acc[MT][4];
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      acc[m][j] = t.first ? _mm256_setzero_ps()
                          : _mm256_loadu_ps(sums + m * kPanel + 8 * j);
    }
  }
#pragma GCC unroll 4
  for (int64_t k = t.k_begin; k < k_end; ++k) {
    PrefetchRow<kBf16>(t, panel, k);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256 low, high;
      LoadHalfAvx2<kBf16>(panel, k, h, &low, &high);
#pragma GCC unroll 8
      for (int m = 0; m < MT; ++m) {
        const __m256 xk = _mm256_broadcast_ss(x + k * ldk + m);
        acc[m][2 * h] = _mm256_fmadd_ps(xk, low, acc[m][2 * h]);
        acc[m][2 * h + 1] = _mm256_fmadd_ps(xk, high, acc[m][2 * h + 1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(sums + m * kPanel + 8 * j, acc[m][j]);
  }
}

// Half width: columns 16 * t.half .. + 15, MT <= 6 rows.
template <int MT, bool kBf16>
SD_TARGET_AVX2 void TileHalfAvx2(const Tile& t) {
  const float* __restrict x = t.x;
  const void* __restrict panel = t.panel;
  float* __restrict sums = t.acc + 16 * t.half;
  const int64_t ldk = t.ldk, k_end = t.k_end;
  const int h = t.half;
  __m256 acc[MT][2];
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m) {
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      acc[m][j] = t.first ? _mm256_setzero_ps()
                          : _mm256_loadu_ps(sums + m * kPanel + 8 * j);
    }
  }
#pragma GCC unroll 4
  for (int64_t k = t.k_begin; k < k_end; ++k) {
    PrefetchRow<kBf16>(t, panel, k);
    __m256 low, high;
    LoadHalfAvx2<kBf16>(panel, k, h, &low, &high);
#pragma GCC unroll 8
    for (int m = 0; m < MT; ++m) {
      const __m256 xk = _mm256_broadcast_ss(x + k * ldk + m);
      acc[m][0] = _mm256_fmadd_ps(xk, low, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(xk, high, acc[m][1]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m) {
    _mm256_storeu_ps(sums + m * kPanel, acc[m][0]);
    _mm256_storeu_ps(sums + m * kPanel + 8, acc[m][1]);
  }
}

// ---------------------------------------------------------------------------
// AVX-512F (32 registers): full-width tiles of up to 8 rows, two registers
// a row. Each register holds two 8-column groups: float32 panels columns
// 0-15 and 16-31; bfloat16 panels (one load, then even and odd slots)
// columns {0-7, 16-23} and {8-15, 24-31}. The running sums stay in that
// register order between depth blocks (plain 64-byte loads and stores; the
// 32-byte halves a column-order buffer needs made GCC 12 copy every
// accumulator twice per depth step) and go to column order once, when a
// panel's sums are copied out (`SumsGroup`).

template <bool kBf16>
SD_TARGET_AVX512 inline void LoadAvx512(const void* panel, int64_t k, __m512 w[2]) {
  if (kBf16) {
    const uint16_t* row = static_cast<const uint16_t*>(panel) + k * kPanel;
    const __m512i v = _mm512_loadu_si512(row);
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    w[1] = _mm512_castsi512_ps(
        _mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
    return;
  }
  const float* row = static_cast<const float*>(panel) + k * kPanel;
  w[0] = _mm512_loadu_ps(row);
  w[1] = _mm512_loadu_ps(row + 16);
}

// acc + broadcast(*x) * w with the broadcast inside the FMA's memory
// operand: a separate broadcast costs a vector-pipe slot per row and depth
// step beside the tile's two FMAs (same arithmetic, same bits).
SD_TARGET_AVX512 inline __m512 FmaBroadcast512(const float* x, __m512 w,
                                               __m512 acc) {
  __asm__("vfmadd231ps %[x]%{1to16%}, %[w], %[acc]"
          : [acc] "+v"(acc)
          : [w] "v"(w), [x] "m"(*x));
  return acc;
}

// The tile's accumulators are named variables, one pair per row (low and
// high 16 columns), not an array: around the inline asm GCC 12 copied an
// array's vectors into fresh registers and back at every depth step, and
// the 8-row tile stored three of them to the stack and reloaded them (alone
// in L1 on a Sapphire Rapids-class VM: 70 G multiply-adds/s, 75 without).
// Rows past MT are dead code.
#define SD_TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

template <int MT, bool kBf16>
SD_TARGET_AVX512 void TileAvx512(const Tile& t) {
  static_assert(MT >= 1 && MT <= 8, "AVX-512 tiles hold up to 8 rows");
  const float* __restrict x = t.x;
  const void* __restrict panel = t.panel;
  float* __restrict sums = t.acc;
  const int64_t ldk = t.ldk, k_end = t.k_end;
  const bool first = t.first;
#define SD_TILE_START(m)                                        \
  __m512 low##m = _mm512_setzero_ps(), high##m = low##m;        \
  if (m < MT && !first) {                                       \
    low##m = _mm512_loadu_ps(sums + (m) * kPanel);              \
    high##m = _mm512_loadu_ps(sums + (m) * kPanel + 16);        \
  }
  SD_TILE_ROWS(SD_TILE_START)
#undef SD_TILE_START
#pragma GCC unroll 4
  for (int64_t k = t.k_begin; k < k_end; ++k) {
    PrefetchRow<kBf16>(t, panel, k);
    __m512 w[2];
    LoadAvx512<kBf16>(panel, k, w);
    const float* xk = x + k * ldk;
#define SD_TILE_STEP(m)                                         \
  if constexpr (m < MT) {                                       \
    low##m = FmaBroadcast512(xk + (m), w[0], low##m);           \
    high##m = FmaBroadcast512(xk + (m), w[1], high##m);         \
  }
    SD_TILE_ROWS(SD_TILE_STEP)
#undef SD_TILE_STEP
  }
#define SD_TILE_STORE(m)                                        \
  if constexpr (m < MT) {                                       \
    _mm512_storeu_ps(sums + (m) * kPanel, low##m);              \
    _mm512_storeu_ps(sums + (m) * kPanel + 16, high##m);        \
  }
  SD_TILE_ROWS(SD_TILE_STORE)
#undef SD_TILE_STORE
}
#undef SD_TILE_ROWS
#endif  // SD_X86

// ---------------------------------------------------------------------------
// Dispatch.

using TileFn = void (*)(const Tile&);

// How the rows of a product are cut into tiles on an instruction set.
struct RowPlan {
  int64_t tiles;  // Tiles of near-equal size (a 1-row tile beside full ones
                  // would wait on its few accumulator chains).
  bool halves;    // Each tile runs as two half-width tiles.
};

RowPlan PlanRows(Isa isa, int64_t m) {
  switch (isa) {
    case kAvx512: return {(m + 7) / 8, false};
    case kAvx2:
      if (m <= 2) return {1, false};
      return {(m + 5) / 6, true};
    default: return {(m + 3) / 4, false};
  }
}

template <bool kBf16>
TileFn PickTile(Isa isa, int mt, bool halves) {
#if SD_X86
  if (isa == kAvx512) {
    switch (mt) {
      case 1: return TileAvx512<1, kBf16>;
      case 2: return TileAvx512<2, kBf16>;
      case 3: return TileAvx512<3, kBf16>;
      case 4: return TileAvx512<4, kBf16>;
      case 5: return TileAvx512<5, kBf16>;
      case 6: return TileAvx512<6, kBf16>;
      case 7: return TileAvx512<7, kBf16>;
      default: return TileAvx512<8, kBf16>;
    }
  }
  if (isa == kAvx2 && halves) {
    switch (mt) {
      case 1: return TileHalfAvx2<1, kBf16>;
      case 2: return TileHalfAvx2<2, kBf16>;
      case 3: return TileHalfAvx2<3, kBf16>;
      case 4: return TileHalfAvx2<4, kBf16>;
      case 5: return TileHalfAvx2<5, kBf16>;
      default: return TileHalfAvx2<6, kBf16>;
    }
  }
  if (isa == kAvx2) {
    return mt == 1 ? TileAvx2<1, kBf16> : TileAvx2<2, kBf16>;
  }
#endif
  switch (mt) {
    case 1: return TilePortable<1, kBf16>;
    case 2: return TilePortable<2, kBf16>;
    case 3: return TilePortable<3, kBf16>;
    default: return TilePortable<4, kBf16>;
  }
}

// ---------------------------------------------------------------------------
// One product, split into chunks of panels.

struct Job {
  const float* x;  // [K, M]: x transposed (M = 1: as given).
  const void* w;
  float* y;
  int64_t m, k, n, panels;
  size_t weight_bytes;  // Bytes per weight element: 4 or 2.
  bool bf16;
  Isa isa;
};

// Where a panel's 8-column group sits among the running sums the AVX-512
// tiles leave for bfloat16 panels: groups 1 and 2 trade places.
constexpr int64_t SumsGroup(int64_t group) {
  return group == 1 ? 2 : group == 2 ? 1 : group;
}

// Panels [first, last) of the product.
void RunPanels(const Job& job, int64_t first, int64_t last,
               std::vector<float>& sums) {
  const RowPlan plan = PlanRows(job.isa, job.m);
  const int64_t panel_bytes = job.k * kPanel * job.weight_bytes;
  const char* weights = static_cast<const char*>(job.w);
  sums.resize(static_cast<size_t>(job.m * kPanel));
  for (int64_t p = first; p < last; ++p) {
    Tile tile;
    tile.panel = weights + p * panel_bytes;
    tile.ldk = job.m;
    for (int64_t k0 = 0; k0 < job.k; k0 += kBlockDepth) {
      tile.k_begin = k0;
      tile.k_end = std::min(job.k, k0 + kBlockDepth);
      tile.first = k0 == 0;
      int64_t m0 = 0;
      for (int64_t i = 0; i < plan.tiles; ++i) {
        const int64_t mt = job.m / plan.tiles + (i < job.m % plan.tiles ? 1 : 0);
        tile.x = job.x + m0;
        tile.acc = sums.data() + m0 * kPanel;
        TileFn fn = job.bf16
                        ? PickTile<true>(job.isa, static_cast<int>(mt), plan.halves)
                        : PickTile<false>(job.isa, static_cast<int>(mt), plan.halves);
        for (int half = 0; half < (plan.halves ? 2 : 1); ++half) {
          tile.half = half;
          tile.prefetch = i == 0 && half == 0;
          fn(tile);
        }
        m0 += mt;
      }
    }
    const int64_t ncols = std::min<int64_t>(kPanel, job.n - p * kPanel);
    const bool register_order = job.bf16 && job.isa == kAvx512;
    for (int64_t m = 0; m < job.m; ++m) {
      float* out = job.y + m * job.n + p * kPanel;
      const float* row = sums.data() + m * kPanel;
      for (int64_t group = 0; 8 * group < ncols; ++group) {
        const int64_t from = register_order ? SumsGroup(group) : group;
        std::memcpy(out + 8 * group, row + 8 * from,
                    std::min<int64_t>(8, ncols - 8 * group) * sizeof(float));
      }
    }
  }
}


ffi::Error FewRowMatmul(ffi::ThreadPool pool, Rows x, ffi::AnyBuffer packed,
                        int32_t isa_attr, int32_t threads_attr,
                        ffi::Result<Rows> y) {
  const auto x_dims = x.dimensions();
  const auto w_dims = packed.dimensions();
  const auto y_dims = y->dimensions();
  if (w_dims.size() != 3 || w_dims[2] != kPanel) {
    return ffi::Error::InvalidArgument(
        "few_row_matmul: packed weight must be [panels, K, 32]");
  }
  const ffi::DataType dtype = packed.element_type();
  if (dtype != ffi::DataType::F32 && dtype != ffi::DataType::BF16) {
    return ffi::Error::InvalidArgument(
        "few_row_matmul: packed weight must be float32 or bfloat16");
  }
  const int64_t m = x_dims[0], k = x_dims[1], n = y_dims[1];
  if (w_dims[1] != k || y_dims[0] != m || n > w_dims[0] * kPanel ||
      n <= (w_dims[0] - 1) * kPanel) {
    return ffi::Error::InvalidArgument(
        "few_row_matmul: shapes of x [M, K], packed [ceil(N / 32), K, 32] "
        "and y [M, N] disagree");
  }
  Isa isa;
  if (ffi::Error error = ResolveIsa("few_row_matmul", isa_attr, &isa);
      error.failure()) {
    return error;
  }
  if (m == 0 || n == 0) return ffi::Error::Success();

  Job job;
  // The inputs go depth-major, [K, M], so a tile's inputs at one depth are
  // adjacent: rows K floats apart share L1 sets and evict each other under
  // the weight stream (measured, 2 threads, 100 MB of bfloat16 panels:
  // 8 rows 0.74x, 4 rows 0.88x the time as given). Once per call (M x K
  // floats, small beside the weights); it lives until every helper is done
  // (the caller waits).
  thread_local std::vector<float> transposed;
  job.x = DepthMajor(x.typed_data(), m, k, transposed);
  job.w = packed.untyped_data();
  job.y = y->typed_data();
  job.m = m;
  job.k = k;
  job.n = n;
  job.panels = (n + kPanel - 1) / kPanel;
  job.bf16 = dtype == ffi::DataType::BF16;
  job.weight_bytes = job.bf16 ? 2 : 4;
  job.isa = isa;

  ParallelOverPanels(
      pool, threads_attr, job.panels,
      static_cast<size_t>(job.panels) * k * kPanel * job.weight_bytes,
      [&job](int64_t first, int64_t last) {
        // Per-thread running sums, reused across calls.
        thread_local std::vector<float> sums;
        RunPanels(job, first, last, sums);
      });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace spec_decode

XLA_FFI_DEFINE_HANDLER_SYMBOL(SdFewRowMatmul, spec_decode::FewRowMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<spec_decode::Rows>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Attr<int32_t>("isa")
                                  .Attr<int32_t>("threads")
                                  .Ret<spec_decode::Rows>());

// The instruction set `isa = 0` resolves to on this CPU (1 portable, 2 AVX2,
// 3 AVX-512), and whether an explicit one can run here.
extern "C" int32_t SdFewRowBestIsa() { return spec_decode::BestIsa(); }
extern "C" int32_t SdFewRowSupports(int32_t isa) {
  return isa >= spec_decode::kBest && isa <= spec_decode::kAvx512 &&
         spec_decode::CpuSupports(static_cast<spec_decode::Isa>(isa));
}
