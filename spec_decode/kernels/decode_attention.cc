// Softmax attention of a decoder call's few query positions over its cache
// (or the encoder output), called from XLA:CPU as an FFI custom call
// (`spec_decode.kernels.attention`).
//
// Why: inside a decoder call the attention arithmetic is tiny (a few query
// positions x heads, each over a few dozen keys), but XLA:CPU runs it as a
// chain of small ops, and its batched dots for more than one query position
// take a general-matrix path that costs ~10x the one-position one: at 4
// tokens the attention cost more than the whole decoder's products. Here
// each (row, position, head) is one item, computed whole by one thread:
//
//   logits[l] = fma chain over d of q[d] * key[d][l]   (d in order)
//   logits[l] += bias[l];  w = exp(logits - max) / sum (sum in l order)
//   out[d]    = fma chain over l of w[l] * value[l][d]  (l in order)
//
// As in `few_rows.cc`, that arithmetic is the same whatever the number of
// positions, the thread or the instruction set (the loops vectorise across
// l or d only, and exp is our own polynomial made of the same fused
// multiply-adds everywhere), so a position's output does not depend on the
// positions scored with it, and the AVX2, AVX-512 and portable paths give
// the same bits. The semantics are T5's: no 1/sqrt(d) scaling (folded into
// the initialisation), an additive bias (masks as -1e10, relative
// positions), float32 throughout.
//
// Keys past the last one an item may see are skipped: a decoder's cache is
// allocated for the whole output (plus the draft's reach) and a query sees
// only the slots written so far, the rest masked by a bias of -1e10. Such a
// key's weight is exactly 0 (its logit is ~1e10 below the peak, and `Exp`
// is 0 below -87.3), it adds exactly 0 to the softmax sum and, through a
// fused multiply-add by 0, nothing to the output: skipping the masked tail
// gives the same bits as attending to it, and attention costs what the
// written prefix costs instead of what the allocation does. Only a tail is
// skipped (masks inside it, as in a candidate tree, are attended as any
// key), and an item whose keys are all masked attends to all of them (T5X's
// uniform weights).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu_features.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace spec_decode {

using Heads = ffi::Buffer<ffi::F32, 4>;

namespace {

// exp(x) in float32 to ~1 ulp (Cody-Waite reduction and a degree-6
// polynomial, as Cephes' expf), 0 below -87.3 (where float32 underflows).
// Only adds, fused multiply-adds and bit operations, so a vectorised loop
// and a scalar one round alike.
inline float Exp(float x) {
  const float clamped = std::max(x, -87.3f);
  // Round to the nearest integer by the 1.5 * 2^23 trick: exact for
  // |v| < 2^22, and the same in every lane and every path.
  const float shift = 12582912.0f;
  // One fused multiply-add, written out: left to the compiler, a * b + c
  // may be contracted on one path and not on another.
  const float n = std::fma(clamped, 1.44269504088896341f, shift) - shift;
  float r = std::fma(n, -0.693359375f, clamped);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.3f ? 0.0f : p * scale;
}

// A key whose bias is at most this is masked (T5X masks with -1e10; a
// relative-position bias or a logit q.k never comes near 5e9).
constexpr float kMaskedBelow = -5e9f;

// Keys [0, n) an item attends to: up to its last unmasked key, or all of
// them where every key is masked.
inline int64_t AttendedLength(const float* bias, int64_t length) {
  int64_t n = length;
  while (n > 0 && bias[n - 1] <= kMaskedBelow) --n;
  return n == 0 ? length : n;
}

// One item: query [D] over the first `length` keys of keys [D][stride] and
// values [length][D] with bias [length]. `scratch` holds `length` floats.
// Inlined into each instruction set's wrapper, which the compiler
// vectorises for that target.
__attribute__((always_inline)) inline void AttendItem(
    const float* __restrict query, const float* __restrict keys,
    const float* __restrict values, const float* __restrict bias, int64_t depth,
    int64_t length, int64_t stride, float* __restrict scratch,
    float* __restrict out) {
  for (int64_t l = 0; l < length; ++l) scratch[l] = 0.0f;
  for (int64_t d = 0; d < depth; ++d) {
    const float q = query[d];
    const float* key_row = keys + d * stride;
    for (int64_t l = 0; l < length; ++l) {
      scratch[l] = std::fma(q, key_row[l], scratch[l]);
    }
  }
  float peak = -std::numeric_limits<float>::infinity();
  for (int64_t l = 0; l < length; ++l) {
    scratch[l] += bias[l];
    peak = std::max(peak, scratch[l]);
  }
  for (int64_t l = 0; l < length; ++l) scratch[l] = Exp(scratch[l] - peak);
  float total = 0.0f;
  for (int64_t l = 0; l < length; ++l) total += scratch[l];
  for (int64_t d = 0; d < depth; ++d) out[d] = 0.0f;
  for (int64_t l = 0; l < length; ++l) {
    const float weight = scratch[l] / total;
    const float* value_row = values + l * depth;
    for (int64_t d = 0; d < depth; ++d) {
      out[d] = std::fma(weight, value_row[d], out[d]);
    }
  }
}

using ItemFn = void (*)(const float*, const float*, const float*, const float*,
                        int64_t, int64_t, int64_t, float*, float*);

void AttendItemPortable(const float* query, const float* keys,
                        const float* values, const float* bias, int64_t depth,
                        int64_t length, int64_t stride, float* scratch,
                        float* out) {
  AttendItem(query, keys, values, bias, depth, length, stride, scratch, out);
}

#if SD_X86
SD_TARGET_AVX2 void AttendItemAvx2(const float* query, const float* keys,
                                   const float* values, const float* bias,
                                   int64_t depth, int64_t length,
                                   int64_t stride, float* scratch, float* out) {
  AttendItem(query, keys, values, bias, depth, length, stride, scratch, out);
}

// AVX-512: the same arithmetic per element as `AttendItem` (each logit a
// fused multiply-add chain over d from 0, each output a chain over l from
// 0, the sum in l order), with the chains of up to 4 vectors held in
// registers and masked loads for the tails. Compiled as plain C++ the
// chains round-trip through memory at every step and each row's tail of
// fewer than 16 keys runs scalar: a 112-key item took ~1 us of ~0.15 us
// of multiply-adds.
inline __mmask16 SD_TARGET_AVX512 TailMask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF)
                         : static_cast<__mmask16>((1u << remaining) - 1u);
}

// scratch[l0 .. l0 + 16 * kVectors) (masked at `length`) = q . keys + bias.
template <int kVectors>
SD_TARGET_AVX512 inline void LogitsBlock(const float* query, const float* keys,
                                         const float* bias, int64_t depth,
                                         int64_t length, int64_t stride,
                                         int64_t l0, float* scratch) {
  __mmask16 mask[kVectors];
  __m512 acc[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    mask[v] = TailMask(length - l0 - 16 * v);
    acc[v] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < depth; ++d) {
    const __m512 q = _mm512_set1_ps(query[d]);
    const float* row = keys + d * stride + l0;
    for (int v = 0; v < kVectors; ++v) {
      acc[v] = _mm512_fmadd_ps(q, _mm512_maskz_loadu_ps(mask[v], row + 16 * v),
                               acc[v]);
    }
  }
  for (int v = 0; v < kVectors; ++v) {
    const int64_t l = l0 + 16 * v;
    _mm512_mask_storeu_ps(
        scratch + l, mask[v],
        _mm512_add_ps(acc[v], _mm512_maskz_loadu_ps(mask[v], bias + l)));
  }
}

// out[d0 .. d0 + 16 * kVectors) (masked at `depth`) = sum_l w[l] value[l].
template <int kVectors>
SD_TARGET_AVX512 inline void OutputBlock(const float* weights,
                                         const float* values, int64_t depth,
                                         int64_t length, int64_t d0,
                                         float* out) {
  __mmask16 mask[kVectors];
  __m512 acc[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    mask[v] = TailMask(depth - d0 - 16 * v);
    acc[v] = _mm512_setzero_ps();
  }
  for (int64_t l = 0; l < length; ++l) {
    const __m512 w = _mm512_set1_ps(weights[l]);
    const float* row = values + l * depth + d0;
    for (int v = 0; v < kVectors; ++v) {
      acc[v] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(mask[v], row + 16 * v),
                               acc[v]);
    }
  }
  for (int v = 0; v < kVectors; ++v) {
    _mm512_mask_storeu_ps(out + d0 + 16 * v, mask[v], acc[v]);
  }
}

// `Exp` on 16 lanes: the same operations in the same order per lane.
SD_TARGET_AVX512 inline __m512 ExpAvx512(__m512 x) {
  const __m512 floor = _mm512_set1_ps(-87.3f);
  // (floor > x ? floor : x), as std::max(x, floor).
  const __m512 clamped = _mm512_max_ps(floor, x);
  const __m512 shift = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(
      _mm512_fmadd_ps(clamped, _mm512_set1_ps(1.44269504088896341f), shift),
      shift);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), clamped);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
                    _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 value = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, floor, _CMP_LT_OQ);
  return _mm512_mask_blend_ps(underflow, value, _mm512_setzero_ps());
}

// Calls block<1..4> over [0, extent) in steps of 64.
template <template <int> class Block, typename... Args>
SD_TARGET_AVX512 inline void OverBlocks(int64_t extent, Args... args) {
  for (int64_t start = 0; start < extent; start += 64) {
    const int64_t vectors = std::min<int64_t>(4, (extent - start + 15) / 16);
    if (vectors == 4) {
      Block<4>::Run(start, args...);
    } else if (vectors == 3) {
      Block<3>::Run(start, args...);
    } else if (vectors == 2) {
      Block<2>::Run(start, args...);
    } else {
      Block<1>::Run(start, args...);
    }
  }
}

template <int kVectors>
struct Logits {
  SD_TARGET_AVX512 static void Run(int64_t l0, const float* query,
                                   const float* keys, const float* bias,
                                   int64_t depth, int64_t length,
                                   int64_t stride, float* scratch) {
    LogitsBlock<kVectors>(query, keys, bias, depth, length, stride, l0,
                          scratch);
  }
};

template <int kVectors>
struct Output {
  SD_TARGET_AVX512 static void Run(int64_t d0, const float* weights,
                                   const float* values, int64_t depth,
                                   int64_t length, float* out) {
    OutputBlock<kVectors>(weights, values, depth, length, d0, out);
  }
};

SD_TARGET_AVX512 void AttendItemAvx512(const float* query, const float* keys,
                                       const float* values, const float* bias,
                                       int64_t depth, int64_t length,
                                       int64_t stride, float* scratch,
                                       float* out) {
  OverBlocks<Logits>(length, query, keys, bias, depth, length, stride,
                     scratch);
  // The maximum does not depend on the order it is taken in.
  __m512 peaks = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t l = 0; l < length; l += 16) {
    peaks = _mm512_max_ps(
        _mm512_mask_loadu_ps(peaks, TailMask(length - l), scratch + l), peaks);
  }
  const __m512 peak = _mm512_set1_ps(_mm512_reduce_max_ps(peaks));
  for (int64_t l = 0; l < length; l += 16) {
    const __mmask16 mask = TailMask(length - l);
    _mm512_mask_storeu_ps(
        scratch + l, mask,
        ExpAvx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, scratch + l),
                                peak)));
  }
  float total = 0.0f;  // In l order, as every path sums.
  for (int64_t l = 0; l < length; ++l) total += scratch[l];
  // Division is correctly rounded: vectorised or not, the same weights.
  const __m512 totals = _mm512_set1_ps(total);
  for (int64_t l = 0; l < length; l += 16) {
    const __mmask16 mask = TailMask(length - l);
    _mm512_mask_storeu_ps(
        scratch + l, mask,
        _mm512_div_ps(_mm512_maskz_loadu_ps(mask, scratch + l), totals));
  }
  OverBlocks<Output>(depth, scratch, values, depth, length, out);
}
#endif

ItemFn PickItem(Isa isa) {
#if SD_X86
  if (isa == kAvx512) return AttendItemAvx512;
  if (isa == kAvx2) return AttendItemAvx2;
#endif
  return AttendItemPortable;
}

// Below this many multiply-adds one thread does the whole call.
constexpr int64_t kMinParallelWork = 1 << 18;

ffi::Error DecodeAttention(ffi::ThreadPool pool, Heads query, Heads keys,
                           Heads values, Heads bias, int32_t isa_attr,
                           int32_t threads_attr, ffi::Result<Heads> out) {
  // query [B, Q, H, D], keys [B, H, D, L], values [B, H, L, D],
  // bias [B, 1 or H, 1 or Q, L], out [B, Q, H, D].
  const auto q_dims = query.dimensions();
  const auto k_dims = keys.dimensions();
  const auto v_dims = values.dimensions();
  const auto b_dims = bias.dimensions();
  const int64_t batch = q_dims[0], positions = q_dims[1], heads = q_dims[2],
                depth = q_dims[3], length = k_dims[3];
  const bool shapes_agree =
      k_dims[0] == batch && k_dims[1] == heads && k_dims[2] == depth &&
      v_dims[0] == batch && v_dims[1] == heads && v_dims[2] == length &&
      v_dims[3] == depth && b_dims[0] == batch &&
      (b_dims[1] == 1 || b_dims[1] == heads) &&
      (b_dims[2] == 1 || b_dims[2] == positions) && b_dims[3] == length &&
      std::equal(q_dims.begin(), q_dims.end(), out->dimensions().begin());
  if (!shapes_agree) {
    return ffi::Error::InvalidArgument(
        "decode_attention: shapes of query [B, Q, H, D], keys [B, H, D, L], "
        "values [B, H, L, D], bias [B, 1|H, 1|Q, L] and out disagree");
  }
  Isa isa;
  if (ffi::Error error = ResolveIsa("decode_attention", isa_attr, &isa);
      error.failure()) {
    return error;
  }
  const int64_t items = batch * positions * heads;
  if (items == 0 || depth == 0) return ffi::Error::Success();
  if (length == 0) {
    return ffi::Error::InvalidArgument("decode_attention: no keys to attend to");
  }

  const float* q = query.typed_data();
  const float* k = keys.typed_data();
  const float* v = values.typed_data();
  const float* bias_data = bias.typed_data();
  float* o = out->typed_data();
  const int64_t bias_heads = b_dims[1], bias_positions = b_dims[2];
  const ItemFn item_fn = PickItem(isa);

  int64_t workers = Workers(pool, threads_attr);
  if (items * length * depth * 2 < kMinParallelWork) workers = 1;
  const int64_t num_chunks = workers == 1 ? 1 : std::min(items, 4 * workers);
  const int64_t per_chunk = (items + num_chunks - 1) / num_chunks;
  ParallelFor(pool, num_chunks, workers, [&](int64_t chunk) {
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(length));
    const int64_t last = std::min(items, (chunk + 1) * per_chunk);
    for (int64_t item = chunk * per_chunk; item < last; ++item) {
      // item = (b * Q + p) * H + h: the output's own order.
      const int64_t h = item % heads;
      const int64_t p = (item / heads) % positions;
      const int64_t b = item / (heads * positions);
      const int64_t bh = b * heads + h;
      const float* bias_row =
          bias_data + ((b * bias_heads + (bias_heads == 1 ? 0 : h)) *
                           bias_positions +
                       (bias_positions == 1 ? 0 : p)) *
                          length;
      item_fn(q + item * depth, k + bh * depth * length,
              v + bh * length * depth, bias_row, depth,
              AttendedLength(bias_row, length), length, scratch.data(),
              o + item * depth);
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace spec_decode

XLA_FFI_DEFINE_HANDLER_SYMBOL(SdDecodeAttention, spec_decode::DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<spec_decode::Heads>()
                                  .Arg<spec_decode::Heads>()
                                  .Arg<spec_decode::Heads>()
                                  .Arg<spec_decode::Heads>()
                                  .Attr<int32_t>("isa")
                                  .Attr<int32_t>("threads")
                                  .Ret<spec_decode::Heads>());
