// float32 inputs on AMX tiles, for weights that are bfloat16 values (the
// shipped models; FFI target `SdAmxSplitMatmul`): each input row goes in as
// three bfloat16 rows, hi + mid + lo = x exactly, so every product is exact
// and only the float32 sums round (`amx_products.cc` adds a row's three
// sums smallest first). float32-accurate (in our tests closer to float64
// than the FMA chain of `few_rows.cc`), not that chain's bits. Three tile
// rows per input row: past ~5 rows a call pays for the tiles' multiplies,
// not for streaming the weights.

#include <cstdint>
#include <vector>

#include "amx_products.h"
#include "cpu_features.h"

namespace spec_decode {

#if SD_AMX
namespace {

// 16 bfloat16 values (bits) as float32.
SD_TARGET_AMX inline __m512 WidenBf16x16(__m256i bits) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
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

void AmxSplitProduct(xla::ffi::ThreadPool& pool, int32_t threads,
                     const float* x, const uint16_t* w, float* y, int64_t m,
                     int64_t k, int64_t n) {
  if (m == 0 || n == 0) return;
  thread_local std::vector<uint16_t> buffer;
  uint16_t* parts = AlignedForTiles(buffer, 3 * m * k);
  SplitInBf16Parts(x, m, k, parts);
  AmxPartsProduct(pool, threads, parts, 3, w, y, m, k, n);
}

#else  // !SD_AMX

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
      y_dims[0] != m || n > w_dims[0] * kPairPanel ||
      n <= (w_dims[0] - 1) * kPairPanel) {
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
