// Work split over XLA's intra-op thread pool from inside an FFI call, and
// what every kernel's FFI handler shares (its `isa` attribute, resolved).
//
// The calling thread and helpers scheduled on the FFI's ThreadPool (the
// threads XLA's own ops use, idle while a custom call runs, so nothing
// competes for the cores and no thread is started per call) claim chunks
// from one atomic counter. The caller works too and then waits only for
// chunks a helper has already claimed, so it never waits on a helper the
// pool has not started: a pool of one thread, or one busy elsewhere, cannot
// deadlock it. A helper that starts after the work is done finds no chunk
// and touches nothing but the shared counters, which it co-owns.

#ifndef SPEC_DECODE_KERNELS_PARALLEL_H_
#define SPEC_DECODE_KERNELS_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpu_features.h"
#include "xla/ffi/api/ffi.h"

namespace spec_decode {

struct ChunkQueue {
  std::function<void(int64_t)> run;  // Runs one chunk.
  int64_t num_chunks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Drain() {
    for (;;) {
      const int64_t chunk = next.fetch_add(1, std::memory_order_relaxed);
      if (chunk >= num_chunks) return;
      run(chunk);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

inline void CpuRelax() {
#if SD_X86
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Runs run(0) .. run(num_chunks - 1) on up to `workers` threads (the caller
// and workers - 1 helpers from `pool`); returns when all have run.
inline void ParallelFor(xla::ffi::ThreadPool& pool, int64_t num_chunks,
                        int64_t workers, std::function<void(int64_t)> run) {
  auto queue = std::make_shared<ChunkQueue>();
  queue->run = std::move(run);
  queue->num_chunks = num_chunks;
  workers = std::max<int64_t>(1, std::min(workers, num_chunks));
  for (int64_t i = 1; i < workers; ++i) {
    pool.Schedule([queue] { queue->Drain(); });
  }
  queue->Drain();
  while (queue->done.load(std::memory_order_acquire) < num_chunks) {
    CpuRelax();
  }
}

// Threads for a call: `requested` if positive, else the pool's size.
inline int64_t Workers(xla::ffi::ThreadPool& pool, int32_t requested) {
  return requested > 0 ? requested : std::max<int64_t>(1, pool.num_threads());
}

// Below this many weight bytes one thread does a whole product: waking a
// helper costs more than it saves.
constexpr size_t kMinParallelBytes = 256 * 1024;

// Runs a product's column panels [0, panels) as chunks `run(first, last)`
// on up to `Workers(pool, threads)` threads: a few chunks per worker, so a
// worker that starts late still gets a share and none is left with a long
// tail; one chunk when the weights are fewer than kMinParallelBytes.
inline void ParallelOverPanels(
    xla::ffi::ThreadPool& pool, int32_t threads, int64_t panels,
    size_t weight_bytes, const std::function<void(int64_t, int64_t)>& run) {
  int64_t workers = Workers(pool, threads);
  if (weight_bytes < kMinParallelBytes) workers = 1;
  const int64_t target_chunks = workers == 1 ? 1 : 4 * workers;
  const int64_t chunk_panels = (panels + target_chunks - 1) / target_chunks;
  const int64_t num_chunks = (panels + chunk_panels - 1) / chunk_panels;
  ParallelFor(pool, num_chunks, workers, [&](int64_t chunk) {
    run(chunk * chunk_panels, std::min(panels, (chunk + 1) * chunk_panels));
  });
}

// x [rows, depth] as [depth, rows] in `buffer` (so a tile's inputs at one
// depth are adjacent), or x itself for one row (the same layout).
template <typename T>
inline const T* DepthMajor(const T* x, int64_t rows, int64_t depth,
                           std::vector<T>& buffer) {
  if (rows <= 1) return x;
  buffer.resize(static_cast<size_t>(rows * depth));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < depth; ++d) buffer[d * rows + r] = x[r * depth + d];
  }
  return buffer.data();
}

// The code path an FFI call's `isa` attribute names on this CPU (kBest: the
// widest it has), or an error whose message starts with `op`.
inline xla::ffi::Error ResolveIsa(const char* op, int32_t attr, Isa* isa) {
  if (attr < kBest || attr > kAvx512) {
    return xla::ffi::Error::InvalidArgument(std::string(op) + ": unknown isa");
  }
  *isa = attr == kBest ? BestIsa() : static_cast<Isa>(attr);
  if (!CpuSupports(*isa)) {
    return xla::ffi::Error::InvalidArgument(
        std::string(op) + ": this CPU lacks the requested instruction set");
  }
  return xla::ffi::Error::Success();
}

}  // namespace spec_decode

#endif  // SPEC_DECODE_KERNELS_PARALLEL_H_
