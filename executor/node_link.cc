// The link's blocking helpers, over its nonblocking transfers; see node_link.h.
#include "executor/node_link.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>

namespace slidedp::exec {
namespace {

// Counts completed transfers of one helper call; shared with the callbacks so a transfer that
// completes after the helper gave up writes into memory that still exists.
struct HelperState {
  std::mutex mutex;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::byte> out;
};

}  // namespace

std::vector<std::byte> NodeLink::all_gather(const std::byte* mine, int64_t bytes, const std::string& what) {
  const int M = nodes(), me = node();
  auto st = std::make_shared<HelperState>();
  st->out.resize(static_cast<size_t>(bytes * M));
  std::copy(mine, mine + bytes, st->out.begin() + bytes * me);
  const int64_t tag = reserved_tag(0);
  for (int p = 0; p < M; ++p) {
    if (p == me) continue;
    auto count = [st] {
      std::lock_guard<std::mutex> lock(st->mutex);
      ++st->done;
      st->cv.notify_all();
    };
    send(p, tag, st->out.data() + bytes * me, bytes, what, count);
    recv(p, tag, st->out.data() + bytes * p, bytes, what, count);
  }
  std::unique_lock<std::mutex> lock(st->mutex);
  // The progress thread times the transfers out (failure()); this loop only watches for it.
  while (!st->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return st->done == 2 * (M - 1); })) {
    if (std::exception_ptr e = failure()) std::rethrow_exception(e);
  }
  return st->out;
}

void NodeLink::barrier(const std::string& what) {
  const std::byte b{0};
  all_gather(&b, 1, what);
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

}  // namespace slidedp::exec
