// A persistent pool of worker threads with an explicit size, for CPU kernels and the executor.
// parallel_for(num_tiles, fn) runs fn(tile) for every tile index on the workers AND the calling
// thread (so a pool of N threads uses N cores, and nested or concurrent calls always make progress),
// hands tiles out dynamically from an atomic counter, and rethrows the first exception in the
// caller. No OpenMP: the team size is the pool's, never inherited from whichever thread calls.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.h"

namespace slidedp {

class ThreadPool {
 public:
  // Starts num_threads - 1 workers (num_threads >= 1; the caller of parallel_for is the last one).
  // Throws InputError for num_threads < 1 or above kMaxThreads.
  explicit ThreadPool(int num_threads);
  // Stops and joins the workers. No parallel_for may be running on this pool (its caller would be
  // inside a member of a destroyed object).
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  static constexpr int kMaxThreads = 1024;

  // Threads a job can use at once: the workers plus one calling thread.
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // CPUs this process may run on (sched_getaffinity, so taskset/cgroup limits count), at least 1.
  static int available_cpus();

  // Calls fn(tile) exactly once for each tile in [0, num_tiles), spread over the workers and the
  // calling thread, and returns when all calls have returned. Tile order and thread assignment are
  // unspecified, so results must not depend on them. If calls throw, the remaining unstarted tiles
  // are skipped and the first exception is rethrown here. Safe to call from several threads at
  // once and from inside fn (each caller works on its own job; idle workers help the oldest job).
  template <class Fn>
  void parallel_for(int64_t num_tiles, Fn&& fn);

  // Splits [begin, end) into consecutive tiles of tile_numel elements (the last may be shorter) and
  // calls fn(tile_begin, tile_end) for each, as parallel_for. tile_numel must be > 0.
  template <class Fn>
  void parallel_for_range(int64_t begin, int64_t end, int64_t tile_numel, Fn&& fn);

 private:
  // One parallel_for call; lives on the caller's stack until every thread inside it has left.
  struct Job {
    void (*call)(void* ctx, int64_t tile) = nullptr;
    void* ctx = nullptr;
    int64_t num_tiles = 0;
    std::atomic<int64_t> next_tile{0};  // tiles below this have been claimed
    int workers_inside = 0;             // guarded by mutex_
    bool listed = false;                // guarded by mutex_: in jobs_, so workers may join it
    std::exception_ptr error;           // guarded by mutex_: first exception thrown by a tile
    std::condition_variable left_cv;    // signalled when workers_inside drops to 0
  };

  void run(Job& job);
  void run_tiles(Job& job);  // claims and runs tiles until none are left
  void unlist(Job& job);     // requires mutex_ held
  void worker_loop();

  std::mutex mutex_;
  std::condition_variable work_cv_;  // workers wait here for jobs
  std::deque<Job*> jobs_;            // guarded by mutex_: jobs that still have unclaimed tiles
  bool stopping_ = false;            // guarded by mutex_
  std::vector<std::thread> workers_;
};

template <class Fn>
void ThreadPool::parallel_for(int64_t num_tiles, Fn&& fn) {
  if (num_tiles <= 0) return;
  using F = std::remove_reference_t<Fn>;
  if (num_tiles == 1 || workers_.empty()) {
    // Nothing to share: run inline without touching the lock (exceptions propagate directly).
    for (int64_t t = 0; t < num_tiles; ++t) fn(t);
    return;
  }
  Job job;
  job.call = [](void* ctx, int64_t tile) { (*static_cast<F*>(ctx))(tile); };
  job.ctx = const_cast<void*>(static_cast<const void*>(&fn));
  job.num_tiles = num_tiles;
  run(job);
}

template <class Fn>
void ThreadPool::parallel_for_range(int64_t begin, int64_t end, int64_t tile_numel, Fn&& fn) {
  SLIDEDP_CHECK(tile_numel > 0, "parallel_for_range: tile_numel must be positive");
  if (end <= begin) return;
  const int64_t num_tiles = (end - begin + tile_numel - 1) / tile_numel;
  parallel_for(num_tiles, [&](int64_t t) {
    const int64_t b = begin + t * tile_numel;
    const int64_t e = (end - b < tile_numel) ? end : b + tile_numel;
    fn(b, e);
  });
}

}  // namespace slidedp
