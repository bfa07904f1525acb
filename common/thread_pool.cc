// ThreadPool: workers sleep on one condition variable and join the oldest job that still has
// unclaimed tiles; tiles are claimed with one atomic fetch_add each. A job is unlisted as soon as its
// tiles run out, and its caller waits (under the pool mutex) until every worker that entered it has
// left, which also publishes the workers' writes to the caller.
#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <string>

#include "common/error.h"

namespace slidedp {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads < 1 || num_threads > kMaxThreads) {
    throw InputError("ThreadPool", "num_threads must be in [1, " + std::to_string(kMaxThreads) + "], got " +
                                       std::to_string(num_threads));
  }
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 0; i + 1 < num_threads; ++i) {
    workers_.emplace_back([this] { worker_loop(); });
    // Named so profilers and `top -H` show whose threads these are (best effort: 15 chars max).
    pthread_setname_np(workers_.back().native_handle(), "slidedp-pool");
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

void ThreadPool::run_tiles(Job& job) {
  for (;;) {
    const int64_t tile = job.next_tile.fetch_add(1, std::memory_order_relaxed);
    if (tile >= job.num_tiles) return;
    try {
      job.call(job.ctx, tile);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!job.error) job.error = std::current_exception();
      // Skip the tiles nobody has claimed yet; tiles already running finish normally.
      job.next_tile.store(job.num_tiles, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::unlist(Job& job) {
  if (!job.listed) return;
  job.listed = false;
  auto it = std::find(jobs_.begin(), jobs_.end(), &job);
  SLIDEDP_CHECK(it != jobs_.end(), "listed job missing from the pool's queue");
  jobs_.erase(it);
}

void ThreadPool::run(Job& job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job.listed = true;
    jobs_.push_back(&job);
  }
  // Wake only as many workers as there are tiles beyond the caller's first one.
  const int64_t helpers = std::min<int64_t>(job.num_tiles - 1, static_cast<int64_t>(workers_.size()));
  if (helpers >= static_cast<int64_t>(workers_.size())) {
    work_cv_.notify_all();
  } else {
    for (int64_t i = 0; i < helpers; ++i) work_cv_.notify_one();
  }

  run_tiles(job);

  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    unlist(job);  // all tiles are claimed: no new worker may enter
    job.left_cv.wait(lock, [&] { return job.workers_inside == 0; });
    error = job.error;
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping_ and nothing left to help with
    Job& job = *jobs_.front();
    ++job.workers_inside;
    lock.unlock();
    run_tiles(job);
    lock.lock();
    unlist(job);
    // Notify while holding the lock: the caller cannot wake (and destroy the job) before we release.
    if (--job.workers_inside == 0) job.left_cv.notify_all();
  }
}

}  // namespace slidedp
