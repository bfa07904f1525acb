// NodeLink over MPI: one progress thread posts every transfer (MPI_Isend / MPI_Irecv), tests them,
// runs their completions and times them out. MPI is initialised with MPI_THREAD_SERIALIZED: after
// MPI_Init_thread on the caller's thread, only the progress thread calls MPI until it has stopped.
#include <mpi.h>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "executor/node_link.h"

namespace slidedp::exec {
namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

class MpiLink final : public NodeLink {
 public:
  MpiLink(int expected_nodes, double timeout_s) : timeout_(std::chrono::duration<double>(timeout_s)) {
    int provided = 0;
    if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided); rc != MPI_SUCCESS)
      throw RuntimeError("MPI_Init_thread failed: " + mpi_error_string(rc));
    // Errors come back as codes (named in the run's error), not as MPI's default abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &node_);
    MPI_Comm_size(MPI_COMM_WORLD, &nodes_);
    void* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    max_tag_ = flag ? *static_cast<int*>(ub) : 32767;
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw RuntimeError(fmt::format("this MPI provides thread level {}; SlideDP needs MPI_THREAD_SERIALIZED", provided));
    }
    if (expected_nodes > 0 && nodes_ != expected_nodes) {
      const int got = nodes_;
      MPI_Finalize();
      throw InputError("--nodes", fmt::format("the plan has {} nodes but the launcher started {} process(es): run "
                                              "`mpirun -np {} slidedp-run ...` (one process per node)",
                                              expected_nodes, got, expected_nodes));
    }
    thread_ = std::thread([this] { loop(); });
  }

  ~MpiLink() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    // Transfers that never completed would make MPI_Finalize wait forever: the process exits without
    // it (mpirun then reports the node as failed, which it has).
    if (!failed_.load() && !unfinished_) MPI_Finalize();
  }

  int node() const override { return node_; }
  int nodes() const override { return nodes_; }
  int64_t max_tag() const override { return max_tag_; }

  void send(int to, int64_t tag, const std::byte* data, int64_t bytes, std::string what,
            std::function<void()> done) override {
    post(Op{true, to, tag, const_cast<std::byte*>(data), bytes, std::move(what), std::move(done)});
  }
  void recv(int from, int64_t tag, std::byte* data, int64_t bytes, std::string what,
            std::function<void()> done) override {
    post(Op{false, from, tag, data, bytes, std::move(what), std::move(done)});
  }
  void on_failure(std::function<void(std::exception_ptr)> handler) override {
    std::lock_guard<std::mutex> lock(mutex_);
    handler_ = std::move(handler);
  }
  std::exception_ptr failure() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }
  [[noreturn]] void abort_all(int exit_code) override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }

 private:
  struct Op {
    bool is_send = false;
    int peer = 0;
    int64_t tag = 0;
    std::byte* data = nullptr;
    int64_t bytes = 0;
    std::string what;
    std::function<void()> done;
    MPI_Request request = MPI_REQUEST_NULL;
    Clock::time_point posted;
  };

  void post(Op op) {
    if (op.bytes > INT_MAX) throw InputError("plan: chunk_numel", fmt::format("{} ({} bytes) is larger than one MPI message "
                                                                              "carries; use smaller chunks", op.what, op.bytes));
    if (op.tag < 0 || op.tag > max_tag_) throw RuntimeError(fmt::format("{}: MPI tag {} is over MPI_TAG_UB {}", op.what, op.tag, max_tag_));
    if (op.peer < 0 || op.peer >= nodes_ || op.peer == node_) throw RuntimeError(fmt::format("{}: no node {}", op.what, op.peer));
    std::lock_guard<std::mutex> lock(mutex_);
    incoming_.push_back(std::move(op));
    cv_.notify_all();
  }

  void fail(std::string message) {
    auto e = std::make_exception_ptr(RuntimeError(fmt::format("node {}: {}", node_, message)));
    std::function<void(std::exception_ptr)> handler;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure_) return;
      failure_ = e;
      handler = handler_;
    }
    failed_.store(true);
    if (handler) handler(e);
  }

  void loop() {
    std::vector<Op> active;
    bool cancelled = false;
    Clock::time_point stop_deadline;
    for (;;) {
      std::deque<Op> fresh;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (active.empty() && incoming_.empty()) {
          if (stop_) return;
          cv_.wait_for(lock, std::chrono::milliseconds(20));
        }
        fresh.swap(incoming_);
      }
      if (stopping()) {
        // Shutting down: a receive still outstanding will not be answered (the run stopped early, or
        // failed) and is cancelled; a send is always matched by a receive its peer has posted (or
        // posts before it can finish), so it gets the timeout to complete.
        if (failed_.load()) return;
        for (Op& op : fresh) {
          if (!op.is_send) continue;
          MPI_Isend(op.data, static_cast<int>(op.bytes), MPI_BYTE, op.peer, static_cast<int>(op.tag), MPI_COMM_WORLD, &op.request);
          active.push_back(std::move(op));
        }
        fresh.clear();
        if (active.empty()) return;
        if (!cancelled) {
          for (Op& op : active)
            if (!op.is_send) MPI_Cancel(&op.request);
          cancelled = true;
          stop_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_);
        }
        for (size_t i = 0; i < active.size();) {
          int flag = 0;
          MPI_Test(&active[i].request, &flag, MPI_STATUS_IGNORE);
          if (flag) active[i] = std::move(active.back()), active.pop_back();
          else ++i;
        }
        if (Clock::now() > stop_deadline) {
          unfinished_ = true;
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      for (Op& op : fresh) {
        if (failed_.load()) break;
        op.posted = Clock::now();
        const int n = static_cast<int>(op.bytes), peer = op.peer, tag = static_cast<int>(op.tag);
        const int rc = op.is_send ? MPI_Isend(op.data, n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &op.request)
                                  : MPI_Irecv(op.data, n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &op.request);
        if (rc != MPI_SUCCESS) {
          fail(fmt::format("{} {} node {} failed: {}", op.is_send ? "sending" : "receiving", op.what, peer, mpi_error_string(rc)));
          break;
        }
        active.push_back(std::move(op));
      }
      if (failed_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      bool progressed = false;
      const auto now = Clock::now();
      for (size_t i = 0; i < active.size();) {
        int flag = 0;
        const int rc = MPI_Test(&active[i].request, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
          fail(fmt::format("{} {} node {} failed: {}", active[i].is_send ? "sending" : "receiving", active[i].what,
                           active[i].peer, mpi_error_string(rc)));
          break;
        }
        if (flag) {
          Op op = std::move(active[i]);
          active[i] = std::move(active.back());
          active.pop_back();
          if (op.done) op.done();
          progressed = true;
          continue;
        }
        if (now - active[i].posted > timeout_) {
          const Op& op = active[i];
          fail(fmt::format("waited {:.0f} s {} node {} for {} (the node is hung or gone; --node-timeout sets the bound)",
                           timeout_.count(), op.is_send ? "to send to" : "to hear from", op.peer, op.what));
          break;
        }
        ++i;
      }
      // MPI progresses only inside MPI calls: poll often while transfers are outstanding, without
      // spinning a core the updater needs.
      if (!progressed && !active.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  bool stopping() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stop_;
  }

  std::chrono::duration<double> timeout_;
  int node_ = 0, nodes_ = 1;
  int64_t max_tag_ = 32767;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Op> incoming_;
  bool stop_ = false;
  std::atomic<bool> failed_{false};
  bool unfinished_ = false;  // transfers left when the progress thread stopped
  std::exception_ptr failure_;
  std::function<void(std::exception_ptr)> handler_;
  std::thread thread_;
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<NodeLink> make_mpi_link(int expected_nodes, double timeout_s) {
  return std::make_unique<MpiLink>(expected_nodes, timeout_s);
}

}  // namespace slidedp::exec
