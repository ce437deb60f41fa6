// A few-row matrix product with bfloat16 inputs on AMX tiles: the
// bfloat16-input product of `bf16_products.cc` (same packed weights, same
// FFI target), run where the CPU and OS allow it.
//
// AMX (Intel Sapphire Rapids and later): one TDPBF16PS multiplies a 16 x 32
// bfloat16 tile of inputs (16 rows, 16 pairs each) by 16 pair rows of 16
// columns (a panel half, as packed: rows kPairRow values apart) into 16 x 16
// float32 sums, 8K multiply-adds per instruction. On a 2-vCPU Sapphire
// Rapids VM VDPBF16PS ran at half the float32 FMA rate, so past ~4 rows the
// vector paths were bound by arithmetic; the tiles keep a product bound by
// streaming its weights up to 16 rows a pass.
//
// The unit's sums are not VDPBF16PS's chain (it rounds a pair's two
// products together, in its own order: 195 of 256 sums of a 512-deep
// product differed in the last bit on that VM), so it is a path of its own
// (`kAmxIsa`), not checked against the portable bits: against float64, and
// for batch invariance, which holds because each row of a tile is computed from
// its own inputs alone and every call runs this path whatever its rows
// (a tile holds the call's rows, up to 16; past that, tiles of 16 with
// zeros past the call's rows).

#include "amx_products.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu_features.h"
#include "parallel.h"

// AMX intrinsics came with GCC 11 and Clang 12; an older compiler builds
// the library without this path (AmxUsable() is then false).
#if SD_X86 && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define SD_AMX 1
#include <cpuid.h>
#else
#define SD_AMX 0
#endif

namespace spec_decode {
namespace {

constexpr int64_t kAmxRows = 16;   // Rows of an input or sum tile.
constexpr int64_t kAmxPairs = 16;  // Pairs of a depth step.

constexpr int64_t kPanel = 32;            // Output columns per panel.
constexpr int64_t kPairRow = 2 * kPanel;  // bfloat16 values per panel row.

}  // namespace

#if SD_AMX
#define SD_TARGET_AMX __attribute__((target("amx-tile,amx-bf16,avx512f")))

namespace {

struct AmxTileConfig {  // The 64 bytes LDTILECFG reads (palette 1).
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
};

}  // namespace

bool AmxUsable() {
  static const bool usable = [] {
    unsigned eax, ebx, ecx, edx;
    if (!CpuHasAvx512Bf16() ||
        !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
      return false;
    }
    const bool amx_tile = edx & (1u << 24), amx_bf16 = edx & (1u << 22);
    if (!amx_tile || !amx_bf16) return false;
#if defined(__linux__)
    constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
#else
    return false;
#endif
  }();
  return usable;
}

namespace {

struct AmxJob {
  const uint16_t* x;  // [groups * tile_rows, K] bfloat16, zero past the
                      // call's rows.
  const uint16_t* w;  // [P, K / 2, 64].
  float* y;           // [M, N].
  int64_t m, pairs, n, groups;
  int64_t tile_rows;  // Rows of the input and sum tiles: M up to 16, else 16.
};

// Panels [first, last): for each, every group of 16 rows over the whole
// depth, sums in tiles 0 (columns 0-15) and 1 (16-31); inputs in tile 2,
// weights in 3 and 4; a depth tail of fewer than 16 pairs in 5, 6 and 7.
SD_TARGET_AMX void RunAmxPanels(const AmxJob& job, int64_t first,
                                int64_t last) {
  const int64_t tail = job.pairs % kAmxPairs;
  AmxTileConfig config = {};
  config.palette = 1;
  for (int tile = 0; tile < 5; ++tile) {
    config.rows[tile] =  // Sums and inputs: tile_rows; weights: 16 pairs.
        static_cast<uint8_t>(tile < 3 ? job.tile_rows : kAmxPairs);
    config.bytes_per_row[tile] = 64;
  }
  if (tail > 0) {
    config.rows[5] = static_cast<uint8_t>(job.tile_rows);
    config.bytes_per_row[5] = static_cast<uint16_t>(4 * tail);
    config.rows[6] = config.rows[7] = static_cast<uint8_t>(tail);
    config.bytes_per_row[6] = config.bytes_per_row[7] = 64;
  }
  _tile_loadconfig(&config);
  const int64_t x_stride = 4 * job.pairs;       // Bytes per input row.
  constexpr int64_t kWeightStride = 2 * kPairRow;  // Bytes per pair row.
  alignas(64) float sums[kAmxRows * kPanel];
  for (int64_t p = first; p < last; ++p) {
    const uint16_t* panel = job.w + p * job.pairs * kPairRow;
    const int64_t ncols = std::min<int64_t>(kPanel, job.n - p * kPanel);
    for (int64_t g = 0; g < job.groups; ++g) {
      const uint16_t* x = job.x + g * job.tile_rows * 2 * job.pairs;
      _tile_zero(0);
      _tile_zero(1);
      int64_t r = 0;
      for (; r + kAmxPairs <= job.pairs; r += kAmxPairs) {
        _tile_loadd(2, x + 2 * r, x_stride);
        _tile_loadd(3, panel + r * kPairRow, kWeightStride);
        _tile_loadd(4, panel + r * kPairRow + kPanel, kWeightStride);
        _tile_dpbf16ps(0, 2, 3);
        _tile_dpbf16ps(1, 2, 4);
      }
      if (tail > 0) {
        _tile_loadd(5, x + 2 * r, x_stride);
        _tile_loadd(6, panel + r * kPairRow, kWeightStride);
        _tile_loadd(7, panel + r * kPairRow + kPanel, kWeightStride);
        _tile_dpbf16ps(0, 5, 6);
        _tile_dpbf16ps(1, 5, 7);
      }
      _tile_stored(0, sums, kPanel * sizeof(float));
      _tile_stored(1, sums + 16, kPanel * sizeof(float));
      const int64_t rows = std::min(job.tile_rows, job.m - g * job.tile_rows);
      for (int64_t row = 0; row < rows; ++row) {
        std::memcpy(job.y + (g * job.tile_rows + row) * job.n + p * kPanel,
                    sums + row * kPanel, ncols * sizeof(float));
      }
    }
  }
  _tile_release();
}

}  // namespace

void AmxProduct(xla::ffi::ThreadPool& pool, int32_t threads,
                const uint16_t* x, const uint16_t* w, float* y, int64_t m,
                int64_t k, int64_t n) {
  if (m == 0 || n == 0) return;
  AmxJob job;
  job.m = m;
  job.pairs = k / 2;
  job.n = n;
  job.tile_rows = std::min(m, kAmxRows);
  job.groups = (m + kAmxRows - 1) / kAmxRows;
  job.w = w;
  job.y = y;
  job.x = x;
  // Past 16 rows, whole tiles: the call's inputs, then zeros (once per
  // call, M x K values; it lives until every helper is done, the caller
  // waits). Up to 16, one tile of M rows reads the inputs as given.
  thread_local std::vector<uint16_t> padded;
  if (m > kAmxRows) {
    padded.assign(static_cast<size_t>(job.groups * kAmxRows * k), 0);
    std::memcpy(padded.data(), x,
                static_cast<size_t>(m * k) * sizeof(uint16_t));
    job.x = padded.data();
  }
  const int64_t panels = (n + kPanel - 1) / kPanel;
  ParallelOverPanels(pool, threads, panels,
                     static_cast<size_t>(panels) * k * kPanel * 2,
                     [&job](int64_t first, int64_t last) {
                       RunAmxPanels(job, first, last);
                     });
}

#else  // !SD_AMX

bool AmxUsable() { return false; }

void AmxProduct(xla::ffi::ThreadPool&, int32_t, const uint16_t*,
                const uint16_t*, float*, int64_t, int64_t, int64_t) {}

#endif  // SD_AMX

}  // namespace spec_decode

// Whether `isa = 4` (AMX tiles) can run bfloat16-input products here, and
// `isa = 0` then does.
extern "C" int32_t SdHasAmxBf16() { return spec_decode::AmxUsable(); }
