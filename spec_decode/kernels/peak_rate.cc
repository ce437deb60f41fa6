// The CPU's peak multiply-add rate, measured: what bounds a few-row product
// once it stops being bound by streaming the weights.
//
// `scripts/k_token_dots.py` prints it beside the K-curve: K rows of a
// decoder's N weights need K x N multiply-adds, so a K-token call costs at
// least K x N / rate however its products are written. Measured on 1 and 2
// threads, because a VM's "cores" may be two threads of one physical core
// sharing its FMA units (then the rate does not double).

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "cpu_features.h"

namespace spec_decode {
namespace {

constexpr int kChains = 16;  // Independent accumulators: hides FMA latency.

// Runs `rounds` x kChains vector multiply-adds; returns a value that depends
// on all of them (so none is optimised away). Multiply-adds per call:
// rounds x kChains x lanes (x 2 for the bfloat16 dot).
#if SD_X86
SD_TARGET_AVX512 float Fma512(int64_t rounds) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1e-3f * i);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}

SD_TARGET_AVX2 float Fma256(int64_t rounds) {
  __m256 acc[kChains / 2];  // 16 registers in all.
  for (int i = 0; i < kChains / 2; ++i) acc[i] = _mm256_set1_ps(1e-3f * i);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t r = 0; r < 2 * rounds; ++r) {
#pragma GCC unroll 8
    for (int i = 0; i < kChains / 2; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  float out[8];
  __m256 sum = acc[0];
  for (int i = 1; i < kChains / 2; ++i) sum = _mm256_add_ps(sum, acc[i]);
  _mm256_storeu_ps(out, sum);
  return out[0] + out[7];
}

__attribute__((target("avx512f,avx512bf16"))) float Dot512Bf16(int64_t rounds) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1e-3f * i);
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33d633d6));
  for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}
#endif  // SD_X86

}  // namespace
}  // namespace spec_decode

// Multiply-adds per second of `threads` threads together, each running
// `kind` (0: float32 FMA on the widest vector unit; 1: VDPBF16PS) for about
// `seconds`; 0 where this CPU cannot run it.
extern "C" double SdPeakMacRate(int32_t kind, int32_t threads, double seconds) {
  using spec_decode::BestIsa;
  using spec_decode::kChains;
  if (threads < 1 || seconds <= 0) return 0.0;
#if SD_X86
  __builtin_cpu_init();
  float (*run)(int64_t) = nullptr;
  double per_round = 0;
  if (kind == 0 && BestIsa() == spec_decode::kAvx512) {
    run = spec_decode::Fma512;
    per_round = kChains * 16.0;
  } else if (kind == 0 && BestIsa() == spec_decode::kAvx2) {
    run = spec_decode::Fma256;
    per_round = kChains * 8.0;
  } else if (kind == 1 && BestIsa() == spec_decode::kAvx512 &&
             __builtin_cpu_supports("avx512bf16")) {
    run = spec_decode::Dot512Bf16;
    per_round = kChains * 32.0;
  }
  if (run == nullptr) return 0.0;
  // Rounds for about `seconds` on one thread, from a short probe.
  int64_t rounds = 1 << 16;
  for (;;) {
    const auto start = std::chrono::steady_clock::now();
    volatile float sink = run(rounds);
    (void)sink;
    const double spent = std::chrono::duration<double>(
        std::chrono::steady_clock::now() - start).count();
    if (spent > seconds / 8 || rounds > (int64_t{1} << 40)) {
      rounds = static_cast<int64_t>(rounds * seconds / spent) + 1;
      break;
    }
    rounds *= 4;
  }
  std::vector<std::thread> pool;
  const auto start = std::chrono::steady_clock::now();
  for (int32_t t = 0; t < threads; ++t) {
    pool.emplace_back([run, rounds] {
      volatile float sink = run(rounds);
      (void)sink;
    });
  }
  for (auto& thread : pool) thread.join();
  const double spent = std::chrono::duration<double>(
      std::chrono::steady_clock::now() - start).count();
  return threads * rounds * per_round / spent;
#else
  (void)kind;
  return 0.0;
#endif
}
