// How many elements share one scale in AdamW's 8-bit moments (--optimizer-states 8bit): read by the
// kernels (kernels/cpu/optim/moment_codes.h), the host state that cuts units into blocks, and the
// step model and memory account that charge the scales' bytes.
#pragma once

#include <cstdint>

namespace slidedp {

inline constexpr int64_t kQ8Block = 256;  // as bitsandbytes' blockwise optimizers

}  // namespace slidedp
