// The network stage of slidedp-profile (under `mpirun -np 2` or more): the bandwidth and latency
// between node 0 and node 1 through SlideDP's own MPI link (executor/node_link.h), the path the
// executor's cross-node exchange takes: what it measures is what a multi-node run gets, progress
// thread and all. On one machine the two processes talk over loopback / shared memory, so the
// figures describe this host's MPI transport, not a NIC.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "executor/node_link.h"
#include "profiler/stats.h"

namespace slidedp::profiler {

struct NetworkPlan {
  int reps = 3;
  int latency_round_trips = 200;     // per repetition
  std::vector<int64_t> sizes;        // message bytes of the bandwidth cases
  int messages = 8;                  // back-to-back messages per bandwidth repetition
};

struct NetworkResult {
  Spread latency_us;                 // half a round trip of an 8-byte message
  struct BySize {
    int64_t bytes = 0;
    Spread gbps;                     // one direction, node 0 -> node 1, GB/s
  };
  std::vector<BySize> by_size;
  double best_gbps = 0;              // the largest size's median (the stream the exchange sends)
  int nodes = 0;                     // processes the launcher started
};

// Every node calls it, in step (node 0 and node 1 measure; other nodes only wait for the end).
NetworkResult measure_network(exec::NodeLink& link, const NetworkPlan& plan);

}  // namespace slidedp::profiler
