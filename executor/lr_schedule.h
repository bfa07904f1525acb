// Learning-rate schedules: constant, and linear warm-up followed by cosine decay to a floor. The rate
// is a pure function of the 1-based optimizer step, so a checkpoint stores the schedule's position
// simply as the step it was taken at, and a resumed run reproduces every rate exactly.
#pragma once

#include <cstdint>
#include <string>

namespace slidedp {
class YamlReader;
}

namespace slidedp::exec {

enum class LrScheduleKind { kConstant, kCosine };
const char* lr_schedule_kind_name(LrScheduleKind k);  // "constant" | "cosine"

// The YAML form (strict; unknown keys and keys of the other kind are rejected):
//   kind: cosine        # constant | cosine
//   lr: 3.0e-4          # the peak rate, reached at the end of warm-up
//   warmup_steps: 100   # optional, default 0
//   total_steps: 1000   # cosine only: the step at which the rate reaches min_lr
//   min_lr: 3.0e-5      # cosine only, optional, default 0
struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  double lr = 1e-4;
  int64_t warmup_steps = 0;  // steps 1..warmup_steps ramp linearly: lr * step / warmup_steps
  int64_t total_steps = 0;   // cosine: decay over steps (warmup_steps, total_steps]; 0 for constant
  double min_lr = 0;         // cosine: the floor, reached at total_steps and kept after it

  // Throws InputError naming `origin` and the field: lr in (0, 1], min_lr in [0, lr], warmup_steps
  // >= 0, and for cosine total_steps > warmup_steps; constant takes neither total_steps nor min_lr.
  void validate(const std::string& origin) const;
  // "cosine 3e-04 -> 3e-05 over 1000 steps, 100 warm-up", "constant 1e-04".
  std::string summary() const;
};

// The rate for optimizer step `step` (1-based; aborts on step < 1, an internal invariant):
//   warm-up, step <= W:  lr * step / W            (step 1 already trains; step W is exactly lr)
//   constant after W:    lr
//   cosine, W < step <= N:  min_lr + (lr - min_lr) * (1 + cos(pi * (step - W) / (N - W))) / 2
//   cosine, step > N:    min_lr
// `config` must be valid.
double lr_at(const LrScheduleConfig& config, int64_t step);

// Reads the map `r` (strict: calls r.done()) and validates it.
LrScheduleConfig lr_schedule_from_yaml_reader(const YamlReader& r);
LrScheduleConfig lr_schedule_from_yaml(const std::string& yaml_text, const std::string& origin);
// The YAML form above; lr_schedule_from_yaml(lr_schedule_to_yaml(c)) == c for a valid c.
std::string lr_schedule_to_yaml(const LrScheduleConfig& config);
// The same keys as one compact JSON object (what a checkpoint records); being JSON it is also YAML, so
// lr_schedule_from_yaml reads it back exactly.
std::string lr_schedule_to_json(const LrScheduleConfig& config);

}  // namespace slidedp::exec
