// A build without MPI: multi-node runs are refused with what to install.
#include <fmt/format.h>

#include "common/error.h"
#include "executor/node_link.h"

namespace slidedp::exec {

bool mpi_available() { return false; }

std::unique_ptr<NodeLink> make_mpi_link(int expected_nodes, double) {
  throw InputError("--nodes", fmt::format("{} nodes need MPI, and this slidedp-run was built without it: install "
                                          "libopenmpi-dev and openmpi-bin (scripts/install_deps.sh) and rebuild",
                                          expected_nodes));
}

}  // namespace slidedp::exec
