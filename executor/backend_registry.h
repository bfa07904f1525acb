// Creates a backend by name. The only place that knows which backends were compiled in: the CUDA
// backend registers here when the build has it (SLIDEDP_HAVE_CUDA), and nowhere else in the executor
// does a CUDA type or #if appear (STYLE habit 2).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "executor/backend.h"
#include "executor/backend_options.h"
#include "executor/run_control.h"

namespace slidedp::exec {

// "cpu" or "cuda". Throws InputError for an unknown or unavailable backend, naming the ones built in.
std::unique_ptr<Backend> make_backend(const std::string& name, const ModelCard& card, const ModelLayout& layout,
                                      const BackendOptions& options, RunControl& control);
std::vector<std::string> available_backends();
// Bytes per activation element of the named backend's units (fp32 on the CPU, bf16 on CUDA): what an
// offloaded layer input takes in host memory, known before the backend is made.
int64_t backend_activation_bytes(const std::string& name);
// GPUs the CUDA backend sees (0 without CUDA or without a GPU); never throws.
int cuda_device_count();

}  // namespace slidedp::exec
