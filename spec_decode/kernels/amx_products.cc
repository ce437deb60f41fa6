// Few-row matrix products on AMX tiles, for weights packed in pairs
// ([P, K / 2, 64] bfloat16, `bf16_products.cc`'s layout), where the CPU and
// OS allow it: the bfloat16-input product of `bf16_products.cc` (same FFI
// target), and float32 inputs as bfloat16 parts (`amx_split.cc`), each
// row's parts summed here.
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

#if SD_AMX
#include <cpuid.h>
#endif

namespace spec_decode {
namespace {

constexpr int64_t kAmxRows = 16;   // Rows of an input or sum tile.
constexpr int64_t kAmxPairs = 16;  // Pairs of a depth step.

}  // namespace

#if SD_AMX
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
  const uint16_t* x;  // [groups * tile_rows, K] bfloat16 tile rows, zero
                      // past the call's: parts rows per output row.
  const uint16_t* w;  // [P, K / 2, 64].
  float* y;           // [M, N].
  int64_t m, pairs, n, groups;
  int64_t parts;      // Tile rows per output row (1, or 3 for float32
                      // inputs split in bfloat16 parts).
  int64_t tile_rows;  // Rows of the input and sum tiles: parts x M up to
                      // 16, else split evenly over the groups.
  int joint;          // Groups run together (AccumulatePanel<joint>): 2
                      // past one group where the depth has no tail (the
                      // tiles would not hold a tail's three), else 1.
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
    const float* part = sums + row * job.parts * kPairPanel;
    __m512 low = _mm512_loadu_ps(part + (job.parts - 1) * kPairPanel);
    __m512 high = _mm512_loadu_ps(part + (job.parts - 1) * kPairPanel + 16);
    for (int64_t j = job.parts - 2; j >= 0; --j) {
      low = _mm512_add_ps(low, _mm512_loadu_ps(part + j * kPairPanel));
      high = _mm512_add_ps(high, _mm512_loadu_ps(part + j * kPairPanel + 16));
    }
    _mm512_mask_storeu_ps(out, low_mask, low);
    _mm512_mask_storeu_ps(out + 16, high_mask, high);
  }
}

// Asks for the weights of the depth step after `step` (16 pair rows of a
// panel, 2 KB; after a panel's last step, the next panel's first), so
// that more of the stream is in flight than a step's tile loads ask for.
SD_ALWAYS_INLINE void PrefetchNextStep(const uint16_t* step) {
  const char* next = reinterpret_cast<const char*>(step + kAmxPairs * kPairRow);
  for (int64_t line = 0; line < kAmxPairs * kPairRow * 2; line += 64) {
    _mm_prefetch(next + line, _MM_HINT_T0);
  }
}

// One panel's sums over the whole depth for kJoint groups of tile rows
// from `first_group` on, into `sums` ([kJoint * tile_rows][32]). Tiles:
// group j's sums in 2j (columns 0-15) and 2j + 1 (16-31), its inputs in
// 2 kJoint + j, the weights in 3 kJoint and 3 kJoint + 1; with one group,
// a depth tail of fewer than 16 pairs in 5, 6 and 7. Two groups share
// each weight tile, so past 16 tile rows (float32 inputs past 5 rows) the
// panel streams once, not once per group, and the next step's weights are
// asked for ahead. On a chain of 24 products of 512 x 2048 bfloat16
// weights on a 2-vCPU Sapphire Rapids class VM (interleaved in one
// process, two runs): 6 float32 rows 2.05-2.07 -> 1.85-1.93 ms, 8 rows
// 2.20-2.27 -> 2.11 ms; either change alone gained nothing. With one group
// (1 row) the prefetch gained nothing either and one-token decoder calls
// measured 4-5% dearer with it, so one group runs as before. Past 16 tile
// rows the tiles' multiplies (four per depth step against two) set the
// cost, not the weights. Each row's sums take the same steps in the same
// order whichever tile holds it.
template <int kJoint>
SD_TARGET_AMX void AccumulatePanel(const AmxJob& job, const uint16_t* panel,
                                   int64_t first_group, float* sums) {
  const int64_t x_stride = 4 * job.pairs;          // Bytes per input row.
  constexpr int64_t kWeightStride = 2 * kPairRow;  // Bytes per pair row.
  constexpr int64_t kSumStride = kPairPanel * sizeof(float);
  const int64_t group_values = job.tile_rows * 2 * job.pairs;
  const uint16_t* x = job.x + first_group * group_values;
  // Later pairs of groups find the panel in L2.
  const bool prefetch = kJoint == 2 && first_group == 0;
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kJoint == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  // (The tile intrinsics take literal tile numbers.)
  int64_t r = 0;
  for (; r + kAmxPairs <= job.pairs; r += kAmxPairs) {
    const uint16_t* w = panel + r * kPairRow;
    if (prefetch) PrefetchNextStep(w);
    if constexpr (kJoint == 1) {
      _tile_loadd(3, w, kWeightStride);
      _tile_loadd(4, w + kPairPanel, kWeightStride);
      _tile_loadd(2, x + 2 * r, x_stride);
      _tile_dpbf16ps(0, 2, 3);
      _tile_dpbf16ps(1, 2, 4);
    } else {
      _tile_loadd(6, w, kWeightStride);
      _tile_loadd(7, w + kPairPanel, kWeightStride);
      _tile_loadd(4, x + 2 * r, x_stride);
      _tile_loadd(5, x + group_values + 2 * r, x_stride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  if constexpr (kJoint == 1) {
    if (r < job.pairs) {
      _tile_loadd(5, x + 2 * r, x_stride);
      _tile_loadd(6, panel + r * kPairRow, kWeightStride);
      _tile_loadd(7, panel + r * kPairRow + kPairPanel, kWeightStride);
      _tile_dpbf16ps(0, 5, 6);
      _tile_dpbf16ps(1, 5, 7);
    }
  }
  _tile_stored(0, sums, kSumStride);
  _tile_stored(1, sums + 16, kSumStride);
  if constexpr (kJoint == 2) {
    float* next_sums = sums + job.tile_rows * kPairPanel;
    _tile_stored(2, next_sums, kSumStride);
    _tile_stored(3, next_sums + 16, kSumStride);
  }
}

// The tile configuration of AccumulatePanel<kJoint> (palette 1: rows and
// bytes per row of each tile).
void ConfigureTiles(const AmxJob& job, AmxTileConfig& config) {
  config = {};
  config.palette = 1;
  const int inputs_end = 3 * job.joint;  // Sums and inputs: tile_rows rows.
  for (int tile = 0; tile < inputs_end + 2; ++tile) {
    config.rows[tile] = static_cast<uint8_t>(
        tile < inputs_end ? job.tile_rows : kAmxPairs);
    config.bytes_per_row[tile] = 64;
  }
  const int64_t tail = job.pairs % kAmxPairs;
  if (job.joint == 1 && tail > 0) {
    config.rows[5] = static_cast<uint8_t>(job.tile_rows);
    config.bytes_per_row[5] = static_cast<uint16_t>(4 * tail);
    config.rows[6] = config.rows[7] = static_cast<uint8_t>(tail);
    config.bytes_per_row[6] = config.bytes_per_row[7] = 64;
  }
}

// Panels [first, last): for each, every group of tile rows over the whole
// depth, `job.joint` at a time, then the panel's columns of y.
SD_TARGET_AMX void RunAmxPanels(const AmxJob& job, int64_t first,
                                int64_t last) {
  AmxTileConfig config;
  ConfigureTiles(job, config);
  _tile_loadconfig(&config);
  // A panel's sums for every tile row, [groups * tile_rows][32].
  thread_local std::vector<float> panel_sums;
  panel_sums.resize(
      static_cast<size_t>(job.groups * job.tile_rows * kPairPanel));
  for (int64_t p = first; p < last; ++p) {
    const uint16_t* panel = job.w + p * job.pairs * kPairRow;
    for (int64_t g = 0; g < job.groups; g += job.joint) {
      float* sums = panel_sums.data() + g * job.tile_rows * kPairPanel;
      if (job.joint == 2) {
        AccumulatePanel<2>(job, panel, g, sums);
      } else {
        AccumulatePanel<1>(job, panel, g, sums);
      }
    }
    CombineParts(job, panel_sums.data(), p * kPairPanel,
                 std::min<int64_t>(kPairPanel, job.n - p * kPairPanel));
  }
  _tile_release();
}

}  // namespace

void AmxPartsProduct(xla::ffi::ThreadPool& pool, int32_t threads,
                     const uint16_t* x, int64_t parts, const uint16_t* w,
                     float* y, int64_t m, int64_t k, int64_t n) {
  if (m == 0 || n == 0) return;
  AmxJob job;
  job.x = x;
  job.w = w;
  job.y = y;
  job.m = m;
  job.n = n;
  job.parts = parts;
  job.pairs = k / 2;
  const int64_t rows = parts * m;
  // Past 16 rows, tiles of equal rows: a tile's multiply takes time in
  // proportion to its rows, so 18 rows go as 9 + 9, not 16 + 16 with 14
  // rows of zeros (a 512 x 2048 product of 8 float32 rows in parts, 24
  // tile rows, on a 2-vCPU Sapphire Rapids VM: 103-111 -> 86 us), and a
  // count of groups that goes two by two where they run together: 33 rows
  // as 4 x 9, not 3 x 11, at the same multiply cost.
  job.groups = (rows + kAmxRows - 1) / kAmxRows;
  job.joint = job.groups > 1 && job.pairs % kAmxPairs == 0 ? 2 : 1;
  job.groups += job.groups % job.joint;
  job.tile_rows = (rows + job.groups - 1) / job.groups;
  // Whole tiles: the call's rows, then zeros where the groups hold more
  // (once per call; it lives until every helper is done, the caller
  // waits). Where they hold exactly the call's rows (up to 16, and 18 or
  // 24 rows of 6 or 8 float32 rows in parts) the tiles read them as given.
  const int64_t tile_rows_total = job.groups * job.tile_rows;
  thread_local std::vector<uint16_t> buffer;
  if (tile_rows_total > rows) {
    uint16_t* padded = AlignedForTiles(buffer, tile_rows_total * k);
    std::memcpy(padded, job.x,
                static_cast<size_t>(rows * k) * sizeof(uint16_t));
    std::memset(padded + rows * k, 0,
                static_cast<size_t>((tile_rows_total - rows) * k) *
                    sizeof(uint16_t));
    job.x = padded;
  }
  const int64_t panels = (job.n + kPairPanel - 1) / kPairPanel;
  ParallelOverPanels(pool, threads, panels,
                     static_cast<size_t>(panels) * k * kPairPanel * 2,
                     [&job](int64_t first, int64_t last) {
                       RunAmxPanels(job, first, last);
                     });
}

void AmxProduct(xla::ffi::ThreadPool& pool, int32_t threads,
                const uint16_t* x, const uint16_t* w, float* y, int64_t m,
                int64_t k, int64_t n) {
  AmxPartsProduct(pool, threads, x, 1, w, y, m, k, n);
}

#else  // !SD_AMX

bool AmxUsable() { return false; }

void AmxPartsProduct(xla::ffi::ThreadPool&, int32_t, const uint16_t*,
                     int64_t, const uint16_t*, float*, int64_t, int64_t,
                     int64_t) {}

void AmxProduct(xla::ffi::ThreadPool&, int32_t, const uint16_t*,
                const uint16_t*, float*, int64_t, int64_t, int64_t) {}

#endif  // SD_AMX

}  // namespace spec_decode

// Whether `isa = 4` (AMX tiles) can run bfloat16-input products here, and

// `isa = 0` then does.
extern "C" int32_t SdHasAmxBf16() { return spec_decode::AmxUsable(); }
