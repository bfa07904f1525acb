// The shared resources of one host with N GPUs and what each kind of work draws from them: the one
// description the discrete-event simulator (simulator.cc) and the CPU backend's pacing
// (executor/cpu/pacer.h) both use, so a paced run and a simulated step share resources by the same
// rules. Per rank: a GPU, an H2D and a D2H link at their standalone rates, the link's duplex limit
// (both directions together), a fabric port and (SlideFormer) conversion threads. Per host: the PCIe
// root complex per direction, host memory, the CPU update threads and the cores. Usages are per unit
// of a task's work (bytes, or seconds of GPU time, or thread-seconds of CPU work).
#pragma once

#include <string>
#include <vector>

#include "model/fluid_engine.h"
#include "model/step_work.h"

namespace slidedp {

struct MachineResources {
  using Usages = std::vector<FluidEngine::Usage>;
  std::vector<std::string> names;   // resource i is names[i] with capacity[i] (units per second)
  std::vector<double> capacity;
  std::vector<int> gpu, h2d, d2h, duplex, fabric, convert;  // per rank
  int h2d_root = -1, d2h_root = -1, host_mem = -1, cpu_update = -1, cpu_cores = -1;
  int network = -1;  // this node's NICs (several nodes only)
  Capacities cap;

  explicit MachineResources(const Capacities& c);

  // An H2D (h2d) or D2H copy on `rank`'s link, per byte: the link, its direction's root complex, the
  // link's duplex limit and host memory (twice on emulated devices, whose copies are memcpy; there the
  // copying thread's core too).
  Usages copy(int rank, bool h2d) const;
  // A collective on every rank's fabric port, per byte per port, at `busbw` (all-gather or
  // reduce-scatter bus bandwidth; ports are sized by the all-gather's); on emulated devices also a
  // core per port (the comm threads that copy and sum).
  Usages collective(double busbw) const;
  // One rank's part of a collective, on its own port only (per byte of that port): what one rank's
  // stream runs when every rank paces its own part, all of them together being collective(busbw).
  Usages collective_port(int rank, double busbw) const;
  // One rank's GPU compute, per second of it (on emulated devices also its threads' cores).
  Usages compute(int rank) const;
  // SlideFormer's per-rank conversion of the fp32 master to bf16 before a delivery, per thread-second:
  // the rank's conversion threads, the cores, and host memory at `host_mem_per_thread_s`.
  Usages conversion(int rank, double host_mem_per_thread_s) const;
  // Host CPU work of the update (reduce + AdamW), per thread-second: the update threads, the cores, and
  // host memory at `host_mem_bytes` over the work's `thread_s` (0: none).
  Usages cpu(double thread_s, double host_mem_bytes) const;
  // An exchange between nodes, per byte this node sends (and receives, full duplex): the NICs and
  // host memory at `host_mem_per_byte` (the DMA reads of what is sent and writes of what arrives).
  Usages network_exchange(double host_mem_per_byte) const;

 private:
  int add(const std::string& name, double cap);
};

}  // namespace slidedp
