// System names; see system.h.
#include "model/system.h"

#include <fmt/format.h>

#include "common/error.h"

namespace slidedp {

const char* system_name(System s) {
  switch (s) {
    case System::kSlideDP: return "slidedp";
    case System::kSlideFormerDP: return "slideformer-dp";
    case System::kZeroOffload: return "zero-offload";
    case System::kMegaTrain: return "megatrain";
    case System::kFsdp2: return "fsdp2";
    case System::kZero3Offload: return "zero3-offload";
    case System::kFsdpOffload: return "fsdp-offload";
  }
  return "?";
}

std::vector<std::string> system_names() {
  return {"slidedp", "slideformer-dp", "zero-offload", "megatrain", "fsdp2", "zero3-offload", "fsdp-offload"};
}

System parse_system(const std::string& name, const std::string& where) {
  for (System s : {System::kSlideDP, System::kSlideFormerDP, System::kZeroOffload, System::kMegaTrain,
                   System::kFsdp2, System::kZero3Offload, System::kFsdpOffload})
    if (name == system_name(s)) return s;
  throw InputError(where, fmt::format("unknown system '{}' (one of: {})", name, fmt::join(system_names(), ", ")));
}

}  // namespace slidedp
