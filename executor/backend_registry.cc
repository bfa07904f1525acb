// Backend registry; see backend_registry.h.
#include "executor/backend_registry.h"

#include <fmt/format.h>

#include "common/error.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/device_budget.h"

#if SLIDEDP_HAVE_CUDA
#include "executor/cuda/cuda_backend.h"
#endif

namespace slidedp::exec {

std::vector<std::string> available_backends() {
#if SLIDEDP_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

int64_t backend_activation_bytes(const std::string& name) { return name == "cuda" ? 2 : 4; }

int cuda_device_count() {
#if SLIDEDP_HAVE_CUDA
  return cuda_visible_devices();
#else
  return 0;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name, const ModelCard& card, const ModelLayout& layout,
                                      const BackendOptions& options, RunControl& control) {
  if (name == "cpu") {
    CpuBackendOptions o;
    o.devices = options.devices;
    o.device_budget_bytes = options.device_budget_bytes > 0 ? options.device_budget_bytes : kDefaultEmulatedBudgetBytes;
    o.exact_fp32 = options.exact_fp32;
    o.loss_chunk_tokens = options.loss_chunk_tokens;
    o.mlp_token_tile = options.mlp_token_tile;
    o.blas_threads = options.blas_threads;
    o.pacing = options.pacing;
    o.cross_node = options.cross_node;
    return make_cpu_backend(card, layout, o, control);
  }
  if (options.pacing)
    throw InputError("--emulate", "pacing to a target machine is for the CPU backend (--backend cpu)");
#if SLIDEDP_HAVE_CUDA
  if (name == "cuda") return make_cuda_backend(card, layout, options, control);
#endif
  throw InputError("--backend", fmt::format("'{}' is not available in this build (available: {})", name,
                                            fmt::join(available_backends(), ", ")));
}

}  // namespace slidedp::exec
