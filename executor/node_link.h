// The nodes of a multi-node run and the host-buffer messages between them. One process per node,
// launched by mpirun; MPI carries host buffers (reduced gradient chunks, bf16 mirror shards, losses),
// each node's GPUs (emulated ones on the CPU backend) are its ranks. After MPI_Init, every MPI call
// but the final MPI_Abort of a failed run is made by the link's one progress thread
// (MPI_THREAD_SERIALIZED is all it needs), so the executor's threads only post transfers and are told
// when they complete; nothing in the executor blocks inside MPI.
//
// Bounded waits: a transfer outstanding for longer than the link's timeout fails the run with a
// message naming the peer and what was being waited for. A node that dies makes mpirun end the job
// (OpenMPI's default); the timeout is what catches a peer that hangs without dying.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/run_control.h"

namespace slidedp::exec {

class NodeLink {
 public:
  virtual ~NodeLink() = default;
  virtual int node() const = 0;   // this process's node, 0-based
  virtual int nodes() const = 0;  // M

  // Nonblocking transfers of `bytes` host bytes. `done` runs on the progress thread once the transfer
  // is complete (data received, or the send buffer reusable); the buffer must stay valid until then.
  // Messages between two nodes with the same tag must be posted in the same order on both sides.
  // `what` names the transfer in timeout messages ("unit 3 chunk 0 partial sum of step 5").
  virtual void send(int to, int64_t tag, const std::byte* data, int64_t bytes, std::string what,
                    std::function<void()> done) = 0;
  virtual void recv(int from, int64_t tag, std::byte* data, int64_t bytes, std::string what,
                    std::function<void()> done) = 0;
  // The largest tag a transfer may carry (MPI_TAG_UB).
  virtual int64_t max_tag() const = 0;
  // Called (on the progress thread) with the error that stops the run: a transfer timed out or MPI
  // failed. Set before the first transfer.
  virtual void on_failure(std::function<void(std::exception_ptr)> handler) = 0;
  // The error that stopped the link (null while it works).
  virtual std::exception_ptr failure() const = 0;

  // Blocking helpers for start-up and checkpoints, over the same transfers (bounded by the timeout;
  // they throw the error instead of calling the failure handler). Every node calls them in the same
  // order. all_gather: `mine` is this node's `bytes`; returns every node's, in node order. `tag`
  // (default reserved_tag(0)) lets a thread other than start-up's exchange alongside; `control`
  // makes the wait give up when the run aborts.
  std::vector<std::byte> all_gather(const std::byte* mine, int64_t bytes, const std::string& what, int64_t tag = -1,
                                    const RunControl* control = nullptr);
  void barrier(const std::string& what);

  // Ends every node's process now (MPI_Abort): for an error on one node, so no other waits for it.
  [[noreturn]] virtual void abort_all(int exit_code) = 0;

  // Tags: the updater's transfers use [0, backend_tag_base()), the backend's collectives across
  // nodes [backend_tag_base(), max_tag() - 8), and the 8 at the top are kept for the blocking
  // exchanges (reserved_tag(i), i in [0, 8)).
  int64_t backend_tag_base() const { return (max_tag() - 8) / 2; }
  int64_t reserved_tag(int i) const { return max_tag() - 8 + i; }
};

// Counts completed transfers for a thread that waits for them. The count outlives a wait that gave
// up, so a transfer completing after the run failed touches memory that still exists.
class TransferCount {
 public:
  std::function<void()> one();  // the `done` of one transfer
  // Until `count` transfers completed; rethrows the link's failure (a timeout, MPI's error) instead,
  // and gives up (throws Aborted) once `control`'s run is aborted.
  void wait(const NodeLink& link, int count, const RunControl* control = nullptr) const;

 private:
  struct State;
  std::shared_ptr<State> state_ = make_state();
  static std::shared_ptr<State> make_state();
};

// Whether this binary was built with MPI.
bool mpi_available();
// True when this process was started by an MPI launcher (mpirun sets its rank in the environment).
bool launched_by_mpi();
// Initialises MPI and starts the progress thread; `timeout_s` bounds every wait for a peer. Throws
// InputError when the binary has no MPI, and when the launcher started another number of processes
// than `expected_nodes` (0: any number).
std::unique_ptr<NodeLink> make_mpi_link(int expected_nodes, double timeout_s);

}  // namespace slidedp::exec
