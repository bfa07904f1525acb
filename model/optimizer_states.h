// How the host holds AdamW's moments m and v: fp32 (8 bytes per parameter), bf16 rounded
// stochastically (4), or 8-bit codes with an fp32 scale per block of 256 (2.03125,
// kernels/cpu/optim/moment_codes.h). The last two are lossy: the planner picks them only where the
// user allows it. Read by the plan, the hardware profile's update rates and the step model.
#pragma once

#include <string>

namespace slidedp {

enum class OptimizerStates { kFp32, kBf16, k8bit };
const char* optimizer_states_name(OptimizerStates s);  // "fp32" | "bf16" | "8bit"
OptimizerStates parse_optimizer_states(const std::string& s, const std::string& where);
// Host bytes of m and v together per parameter; the update reads and writes each once.
double moment_bytes_per_param(OptimizerStates s);

}  // namespace slidedp
