// Few-row matrix products on AMX tiles, for weights packed in pairs
// ([P, K / 2, 64] bfloat16, `bf16_products.cc`'s layout), where the CPU and
// OS allow it:
//   * bfloat16 inputs: the bfloat16-input product of `bf16_products.cc`
//     (same FFI target);
//   * float32 inputs with weights that are bfloat16 values (the shipped
//     models; `SdAmxSplitMatmul`): each input row goes in as three
//     bfloat16 rows, hi + mid + lo = x exactly, so every product is exact
//     and only the float32 sums round; a row's three sums are added
//     smallest first. float32-accurate (in our tests closer to float64
//     than the FMA chain of `few_rows.cc`), not that chain's bits.
//
// AMX (Intel Sapphire Rapids and later): one TDPBF16PS multiplies a 16 x 32
// bfloat16 tile of inputs (16 rows, 16 pairs each) by 16 pair rows of 16
// columns (a panel half, as packed: rows kPairRow values apart) into 16 x 16
// float32 sums, 8K multiply-adds per instruction. On a 2-vCPU Sapphire
// Rapids VM VDPBF16PS ran at half the float32 FMA rate and the float32 tile
// of `few_rows.cc` at 70-80% of the FMA rate, so past ~2-4 rows the vector
// paths were bound by arithmetic; the tiles keep a product bound by
// streaming its weights up to 16 tile rows a pass (~5 float32 rows).
//
// The unit's sums are not VDPBF16PS's chain (it rounds a pair's two
// products together, in its own order: 195 of 256 sums of a 512-deep
// product differed in the last bit on that VM), so these are paths of their
// own (`kAmxIsa`), not checked against the portable bits: against float64,
// and for batch invariance, which holds because each row of a tile is
// computed from its own inputs alone and every call runs this path whatever
// its rows (a tile holds the call's tile rows, up to 16; past that, groups
// of equal rows with zeros past the call's).

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
#define SD_TARGET_AMX \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16,avx512bw,avx512vl")))

namespace {

// 16 bfloat16 values (bits) as float32.
SD_TARGET_AMX inline __m512 WidenBf16x16(__m256i bits) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

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
  const uint16_t* x;  // [groups * tile_rows, K] bfloat16 tile rows, zero
                      // past the call's: parts rows per output row.
  const uint16_t* w;  // [P, K / 2, 64].
  float* y;           // [M, N].
  int64_t m, pairs, n, groups;
  int64_t parts;      // Tile rows per output row (1, or 3 for float32
                      // inputs split in bfloat16 parts).
  int64_t tile_rows;  // Rows of the input and sum tiles: parts x M up to
                      // 16, else split evenly over the groups.
};

// y's columns [column, column + ncols) of every output row from a panel's
// sums, [parts x M][32]: a row's parts added from the smallest (last) to
// the largest, the same order whatever the call's rows.
SD_TARGET_AMX void CombineParts(const AmxJob& job, const float* sums,
                                int64_t column, int64_t ncols) {
  const __mmask16 low_mask = static_cast<__mmask16>(
      ncols >= 16 ? 0xFFFF : (1u << ncols) - 1);
  const __mmask16 high_mask = static_cast<__mmask16>(
      ncols >= 32 ? 0xFFFF : ncols <= 16 ? 0 : (1u << (ncols - 16)) - 1);
  for (int64_t row = 0; row < job.m; ++row) {
    float* out = job.y + row * job.n + column;
    const float* part = sums + row * job.parts * kPanel;
    __m512 low = _mm512_loadu_ps(part + (job.parts - 1) * kPanel);
    __m512 high = _mm512_loadu_ps(part + (job.parts - 1) * kPanel + 16);
    for (int64_t j = job.parts - 2; j >= 0; --j) {
      low = _mm512_add_ps(low, _mm512_loadu_ps(part + j * kPanel));
      high = _mm512_add_ps(high, _mm512_loadu_ps(part + j * kPanel + 16));
    }
    _mm512_mask_storeu_ps(out, low_mask, low);
    _mm512_mask_storeu_ps(out + 16, high_mask, high);
  }
}

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
  constexpr int64_t kSumStride = kPanel * sizeof(float);
  // A panel's sums for every tile row, [groups * tile_rows][32].
  thread_local std::vector<float> panel_sums;
  panel_sums.resize(static_cast<size_t>(job.groups * job.tile_rows * kPanel));
  for (int64_t p = first; p < last; ++p) {
    const uint16_t* panel = job.w + p * job.pairs * kPairRow;
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
      float* sums = panel_sums.data() + g * job.tile_rows * kPanel;
      _tile_stored(0, sums, kSumStride);
      _tile_stored(1, sums + 16, kSumStride);
    }
    CombineParts(job, panel_sums.data(), p * kPanel,
                 std::min<int64_t>(kPanel, job.n - p * kPanel));
  }
  _tile_release();
}

// Splits float32 x [M, K] into three bfloat16 parts per row, hi + mid + lo
// = x exactly (each rounding to nearest takes 8 of x's 24 significant
// bits; what is left after two has at most 8): rows 3i, 3i + 1, 3i + 2 of
// `parts` [>= 3M, K]. VCVTNEPS2BF16 treats inputs below 2^-126 as zero, so
// parts under that are lost (|x| below ~2^-110).
SD_TARGET_AMX void SplitInBf16Parts(const float* x, int64_t m, int64_t k,
                                    uint16_t* parts) {
  for (int64_t row = 0; row < m; ++row) {
    const float* in = x + row * k;
    uint16_t* hi = parts + 3 * row * k;
    uint16_t* mid = hi + k;
    uint16_t* lo = mid + k;
    for (int64_t d = 0; d < k; d += 16) {
      const __mmask16 mask = static_cast<__mmask16>(
          k - d >= 16 ? 0xFFFF : (1u << (k - d)) - 1);
      const __m512 value = _mm512_maskz_loadu_ps(mask, in + d);
      const __m256i high = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(value));
      const __m512 rest = _mm512_sub_ps(value, WidenBf16x16(high));
      const __m256i middle = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(rest));
      const __m256i low = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(
          _mm512_sub_ps(rest, WidenBf16x16(middle))));
      _mm256_mask_storeu_epi16(hi + d, mask, high);
      _mm256_mask_storeu_epi16(mid + d, mask, middle);
      _mm256_mask_storeu_epi16(lo + d, mask, low);
    }
  }
}

}  // namespace

namespace {

// Runs `job` (x, w, y, m, k, n and parts set) over the column panels; x
// holds parts x M rows, padded here to whole tiles past 16 rows.
void RunAmxProduct(xla::ffi::ThreadPool& pool, int32_t threads, AmxJob& job,
                   int64_t k) {
  const int64_t rows = job.parts * job.m;
  job.pairs = k / 2;
  // Past 16 rows, tiles of equal rows: a tile's multiply takes time in
  // proportion to its rows, so 18 rows go as 9 + 9, not 16 + 16 with 14
  // rows of zeros (a 512 x 2048 product of 8 float32 rows in parts, 24
  // tile rows, on a 2-vCPU Sapphire Rapids VM: 103-111 -> 86 us).
  job.groups = (rows + kAmxRows - 1) / kAmxRows;
  job.tile_rows = (rows + job.groups - 1) / job.groups;
  // Past 16 rows, whole tiles: the call's rows, then zeros (once per call,
  // rows x K values; it lives until every helper is done, the caller
  // waits). Up to 16, one tile of the call's rows reads them as given.
  thread_local std::vector<uint16_t> padded;
  if (rows > kAmxRows) {
    padded.assign(static_cast<size_t>(job.groups * job.tile_rows * k), 0);
    std::memcpy(padded.data(), job.x,
                static_cast<size_t>(rows * k) * sizeof(uint16_t));
    job.x = padded.data();
  }
  const int64_t panels = (job.n + kPanel - 1) / kPanel;
  ParallelOverPanels(pool, threads, panels,
                     static_cast<size_t>(panels) * k * kPanel * 2,
                     [&job](int64_t first, int64_t last) {
                       RunAmxPanels(job, first, last);
                     });
}

}  // namespace

void AmxProduct(xla::ffi::ThreadPool& pool, int32_t threads,
                const uint16_t* x, const uint16_t* w, float* y, int64_t m,
                int64_t k, int64_t n) {
  if (m == 0 || n == 0) return;
  AmxJob job;
  job.x = x;
  job.w = w;
  job.y = y;
  job.m = m;
  job.n = n;
  job.parts = 1;
  RunAmxProduct(pool, threads, job, k);
}

void AmxSplitProduct(xla::ffi::ThreadPool& pool, int32_t threads,
                     const float* x, const uint16_t* w, float* y, int64_t m,
                     int64_t k, int64_t n) {
  if (m == 0 || n == 0) return;
  thread_local std::vector<uint16_t> parts;
  parts.resize(static_cast<size_t>(3 * m * k));
  SplitInBf16Parts(x, m, k, parts.data());
  AmxJob job;
  job.x = parts.data();
  job.w = w;
  job.y = y;
  job.m = m;
  job.n = n;
  job.parts = 3;
  RunAmxProduct(pool, threads, job, k);
}

#else  // !SD_AMX

bool AmxUsable() { return false; }

void AmxProduct(xla::ffi::ThreadPool&, int32_t, const uint16_t*,
                const uint16_t*, float*, int64_t, int64_t, int64_t) {}

void AmxSplitProduct(xla::ffi::ThreadPool&, int32_t, const float*,
                     const uint16_t*, float*, int64_t, int64_t, int64_t) {}

#endif  // SD_AMX

namespace {

namespace ffi = xla::ffi;

using F32Matrix = ffi::Buffer<ffi::F32, 2>;   // x [M, K], y [M, N].
using PairPanels = ffi::Buffer<ffi::BF16, 3>;  // [P, K / 2, 64].

// float32 x [M, K] by bfloat16-valued weights packed in pairs
// ([P, K / 2, 64]) on AMX tiles, each row as three bfloat16 parts
// (`spec_decode.kernels.matmul` on a kernel packed with layout='pairs' and
// float32 inputs).
ffi::Error AmxSplitMatmul(ffi::ThreadPool pool, F32Matrix x,
                          PairPanels packed, int32_t isa_attr,
                          int32_t threads_attr, ffi::Result<F32Matrix> y) {
  const auto x_dims = x.dimensions();
  const auto w_dims = packed.dimensions();
  const auto y_dims = y->dimensions();
  const int64_t m = x_dims[0], k = x_dims[1], n = y_dims[1];
  if (w_dims[2] != kPairRow || k % 2 != 0 || w_dims[1] * 2 != k ||
      y_dims[0] != m || n > w_dims[0] * kPanel ||
      n <= (w_dims[0] - 1) * kPanel) {
    return ffi::Error::InvalidArgument(
        "amx_split_matmul: shapes of x [M, K] (K even), packed "
        "[ceil(N / 32), K / 2, 64] and y [M, N] disagree");
  }
  if (isa_attr != kBest && isa_attr != kAmxIsa) {
    return ffi::Error::InvalidArgument(
        "amx_split_matmul: runs on AMX tiles only (isa 0 or 4)");
  }
  if (!AmxUsable()) {
    return ffi::Error::InvalidArgument(
        "amx_split_matmul: AMX tiles are not usable on this CPU or OS");
  }
  AmxSplitProduct(pool, threads_attr, x.typed_data(),
                  reinterpret_cast<const uint16_t*>(packed.untyped_data()),
                  y->typed_data(), m, k, n);
  return ffi::Error::Success();
}

}  // namespace

using AmxF32Matrix = F32Matrix;
using AmxPairPanels = PairPanels;

}  // namespace spec_decode

XLA_FFI_DEFINE_HANDLER_SYMBOL(SdAmxSplitMatmul, spec_decode::AmxSplitMatmul,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<spec_decode::AmxF32Matrix>()
                                  .Arg<spec_decode::AmxPairPanels>()
                                  .Attr<int32_t>("isa")
                                  .Attr<int32_t>("threads")
                                  .Ret<spec_decode::AmxF32Matrix>());

// Whether `isa = 4` (AMX tiles) can run bfloat16-input products here, and
// `isa = 0` then does.
extern "C" int32_t SdHasAmxBf16() { return spec_decode::AmxUsable(); }
