// Names and sizes of the moment formats; see optimizer_states.h.
#include "model/optimizer_states.h"

#include "common/error.h"
#include "common/q8_block.h"

namespace slidedp {

const char* optimizer_states_name(OptimizerStates s) {
  switch (s) {
    case OptimizerStates::kFp32:
      return "fp32";
    case OptimizerStates::kBf16:
      return "bf16";
    case OptimizerStates::k8bit:
      return "8bit";
  }
  return "?";
}

OptimizerStates parse_optimizer_states(const std::string& s, const std::string& where) {
  for (OptimizerStates f : {OptimizerStates::kFp32, OptimizerStates::kBf16, OptimizerStates::k8bit})
    if (s == optimizer_states_name(f)) return f;
  throw InputError(where, "'" + s + "' is not fp32, bf16 or 8bit");
}

double moment_bytes_per_param(OptimizerStates s) {
  switch (s) {
    case OptimizerStates::kFp32:
      return 8.0;
    case OptimizerStates::kBf16:
      return 4.0;
    case OptimizerStates::k8bit:
      return 2.0 + 2.0 * 4.0 / static_cast<double>(kQ8Block);  // a byte each, two fp32 scales per block
  }
  return 8.0;
}

}  // namespace slidedp
