// Machine resources and usages; see machine_resources.h.
#include "model/machine_resources.h"

#include <fmt/format.h>

namespace slidedp {

int MachineResources::add(const std::string& name, double c) {
  names.push_back(name);
  capacity.push_back(c);
  return static_cast<int>(names.size()) - 1;
}

MachineResources::MachineResources(const Capacities& c) : cap(c) {
  for (int r = 0; r < c.ranks; ++r) {
    gpu.push_back(add(fmt::format("rank{}.gpu", r), 1.0));
    h2d.push_back(add(fmt::format("rank{}.h2d", r), c.h2d_alone_Bps));
    d2h.push_back(add(fmt::format("rank{}.d2h", r), c.d2h_alone_Bps));
    duplex.push_back(add(fmt::format("rank{}.duplex", r), c.duplex_Bps));
    fabric.push_back(add(fmt::format("rank{}.fabric", r), c.allgather_busbw_Bps));
    convert.push_back(add(fmt::format("rank{}.convert_threads", r), c.convert_threads_per_rank));
  }
  h2d_root = add("pcie_root_h2d", c.h2d_root_Bps);
  d2h_root = add("pcie_root_d2h", c.d2h_root_Bps);
  host_mem = add("host_mem", c.host_mem_Bps);
  cpu_update = add("cpu_update", c.update_threads);
  cpu_cores = add("cpu_cores", c.cpu_cores);
  if (c.nodes > 1) network = add("network", c.nic_Bps);
}

MachineResources::Usages MachineResources::copy(int rank, bool to_device) const {
  const auto k = static_cast<std::size_t>(rank);
  const double hm = cap.emulated ? 2.0 : 1.0;
  Usages u = to_device ? Usages{{h2d[k], 1.0}, {h2d_root, 1.0}, {duplex[k], 1.0}, {host_mem, hm}}
                       : Usages{{d2h[k], 1.0}, {d2h_root, 1.0}, {duplex[k], 1.0}, {host_mem, hm}};
  if (cap.emulated) u.push_back({cpu_cores, 1.0 / (to_device ? cap.h2d_alone_Bps : cap.d2h_alone_Bps)});
  return u;
}

MachineResources::Usages MachineResources::collective(double busbw) const {
  Usages u;
  for (int f : fabric) u.push_back({f, cap.allgather_busbw_Bps / busbw});
  // Emulated devices: every port's part is a copy or a sum on that rank's comm thread, a core each
  // (the same rule as an emulated copy), so collectives slow down when compute holds the cores.
  if (cap.emulated) u.push_back({cpu_cores, static_cast<double>(fabric.size()) / busbw});
  return u;
}

MachineResources::Usages MachineResources::collective_port(int rank, double busbw) const {
  Usages u{{fabric[static_cast<std::size_t>(rank)], cap.allgather_busbw_Bps / busbw}};
  if (cap.emulated) u.push_back({cpu_cores, 1.0 / busbw});
  return u;
}

MachineResources::Usages MachineResources::conversion(int rank, double host_mem_per_thread_s) const {
  return {{convert[static_cast<std::size_t>(rank)], 1.0}, {cpu_cores, 1.0}, {host_mem, host_mem_per_thread_s}};
}

MachineResources::Usages MachineResources::compute(int rank) const {
  Usages u{{gpu[static_cast<std::size_t>(rank)], 1.0}};
  if (cap.emulated) u.push_back({cpu_cores, cap.host_threads_per_device});
  return u;
}

MachineResources::Usages MachineResources::cpu(double thread_s, double host_mem_bytes) const {
  if (thread_s <= 0) return {};
  Usages u{{cpu_update, 1.0}, {cpu_cores, 1.0}};
  if (host_mem_bytes > 0) u.push_back({host_mem, host_mem_bytes / thread_s});
  return u;
}

MachineResources::Usages MachineResources::network_exchange(double host_mem_per_byte) const {
  Usages u{{network, 1.0}};
  if (host_mem_per_byte > 0) u.push_back({host_mem, host_mem_per_byte});
  return u;
}

}  // namespace slidedp
