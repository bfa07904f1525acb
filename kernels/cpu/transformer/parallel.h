// The only threading of the transformer math outside BLAS: split independent work items over a few
// std::threads for one call (the caller is worker 0). Items write disjoint outputs, so every result
// is bitwise independent of the thread count. Thread start-up (~50 us) is noise next to a unit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace slidedp::kernels {

// body(item, worker) for every item in [0, n); worker w of min(threads, n) takes w, w + workers, ...
template <typename Body>
void for_each_item(int64_t n, int64_t threads, const Body& body) {
  const int64_t workers = std::max<int64_t>(1, std::min(threads, n));
  auto run = [&](int64_t w) {
    for (int64_t item = w; item < n; item += workers) body(item, w);
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(run, w);
  run(0);
  for (auto& t : pool) t.join();
}

// body(begin, end) over `threads` contiguous slices of [0, n) (elementwise loops).
template <typename Body>
void for_each_slice(int64_t n, int64_t threads, const Body& body) {
  const int64_t workers = std::max<int64_t>(1, std::min(threads, n / 4096 + 1));  // small n: one thread
  const int64_t per = (n + workers - 1) / workers;
  for_each_item(workers, workers, [&](int64_t w, int64_t) { body(w * per, std::min(n, (w + 1) * per)); });
}

}  // namespace slidedp::kernels
