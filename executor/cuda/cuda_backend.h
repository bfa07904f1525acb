// The CUDA backend: the executor's Backend on real GPUs (DESIGN section 5). One rank per GPU (rank r
// on GPU r % GPUs; ranks may share a GPU, which the `cpu` gradient route supports and NCCL routes do
// not), four CUDA streams per rank with events for every hand-off, a cudaMalloc arena with the CPU
// backend's byte budget and stream-ordered deferred frees, host counters in pinned memory that
// streams wait on (cuStreamWaitValue64), cuBLASLt + kernels/cuda for the unit operations in bf16, and
// NCCL collectives. No CUDA type appears in this header (STYLE habit 2); docs/CUDA_BACKEND.md has the
// design and what was verified where.
#pragma once

#include <memory>
#include <string>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "executor/backend.h"
#include "executor/backend_options.h"
#include "executor/run_control.h"

namespace slidedp::exec {

// Throws InputError for options the CUDA backend cannot honour (exact_fp32) and RuntimeError when no
// GPU is visible.
std::unique_ptr<Backend> make_cuda_backend(const ModelCard& card, const ModelLayout& layout,
                                           const BackendOptions& options, RunControl& control);

// GPUs visible to this process; 0 without a driver or GPU. Never throws.
int cuda_visible_devices();

// One line per rank of a CUDA backend: its GPU and how its streams wait on host counters, for
// reports and result provenance ("" for another backend).
std::string describe_cuda_backend(Backend& backend);

}  // namespace slidedp::exec
