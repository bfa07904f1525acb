// The link's blocking helpers, over its nonblocking transfers; see node_link.h.
#include "executor/node_link.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>

namespace slidedp::exec {

struct TransferCount::State {
  std::mutex mutex;
  std::condition_variable cv;
  int done = 0;
};

std::shared_ptr<TransferCount::State> TransferCount::make_state() { return std::make_shared<State>(); }

std::function<void()> TransferCount::one() {
  return [s = state_] {
    std::lock_guard<std::mutex> lock(s->mutex);
    ++s->done;
    s->cv.notify_all();
  };
}

void TransferCount::wait(const NodeLink& link, int count, const RunControl* control) const {
  std::unique_lock<std::mutex> lock(state_->mutex);
  // The progress thread times the transfers out (failure()); this loop only watches for it.
  while (!state_->cv.wait_for(lock, RunControl::kPollInterval, [&] { return state_->done >= count; })) {
    if (std::exception_ptr e = link.failure()) std::rethrow_exception(e);
    if (control) control->check();
  }
}

std::vector<std::byte> NodeLink::all_gather(const std::byte* mine, int64_t bytes, const std::string& what, int64_t tag,
                                            const RunControl* control) {
  const int M = nodes(), me = node();
  // Owned by the transfers too (see TransferCount).
  auto out = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(bytes * M));
  std::copy(mine, mine + bytes, out->begin() + bytes * me);
  TransferCount done;
  if (tag < 0) tag = reserved_tag(0);
  for (int p = 0; p < M; ++p) {
    if (p == me) continue;
    auto keep = [out, one = done.one()] { one(); };
    send(p, tag, out->data() + bytes * me, bytes, what, keep);
    recv(p, tag, out->data() + bytes * p, bytes, what, keep);
  }
  done.wait(*this, 2 * (M - 1), control);
  return *out;
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
