// Learning-rate schedules as closed forms of the step (see lr_schedule.h). Validation is shared by the
// YAML path and the programmatic one through a `where` callback, so both name the field the same way.
#include "executor/lr_schedule.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <functional>
#include <numbers>

#include "common/error.h"
#include "common/yaml_reader.h"

namespace slidedp::exec {

const char* lr_schedule_kind_name(LrScheduleKind k) {
  switch (k) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kCosine:
      return "cosine";
  }
  return "?";
}

namespace {

// Rates above 1 are not a schedule anyone means for AdamW (a typo such as 3e4 for 3e-4), so they are
// rejected rather than trained with.
constexpr double kMaxLr = 1.0;

void validate_with(const LrScheduleConfig& c, const std::function<std::string(const std::string&)>& where) {
  if (!(std::isfinite(c.lr) && c.lr > 0 && c.lr <= kMaxLr))
    throw InputError(where("lr"), fmt::format("{} must be in (0, {}]", c.lr, kMaxLr));
  if (c.warmup_steps < 0)
    throw InputError(where("warmup_steps"), fmt::format("{} must be >= 0", c.warmup_steps));
  if (c.kind == LrScheduleKind::kConstant) {
    if (c.total_steps != 0)
      throw InputError(where("total_steps"), "only for kind cosine (a constant schedule has no end)");
    if (c.min_lr != 0)
      throw InputError(where("min_lr"), "only for kind cosine (a constant schedule has no floor)");
    return;
  }
  if (c.total_steps <= c.warmup_steps)
    throw InputError(where("total_steps"),
                     fmt::format("{} must exceed warmup_steps ({}) so that the decay has steps",
                                 c.total_steps, c.warmup_steps));
  if (!(std::isfinite(c.min_lr) && c.min_lr >= 0 && c.min_lr <= c.lr))
    throw InputError(where("min_lr"), fmt::format("{} must be in [0, lr = {}]", c.min_lr, c.lr));
}

// Shortest text that reads back to the same double ("3.0e-04", not "0.00029999999999999997"). A
// mantissa without a dot gets ".0": YAML 1.1 readers (PyYAML) take "3e-04" for a string.
std::string shortest(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  SLIDEDP_CHECK(ec == std::errc(), "to_chars failed");
  std::string text(buf, end);
  const size_t e = text.find('e');
  if (e != std::string::npos && text.find('.') == std::string::npos) text.insert(e, ".0");
  return text;
}

}  // namespace

void LrScheduleConfig::validate(const std::string& origin) const {
  validate_with(*this,
                [&](const std::string& field) { return origin.empty() ? field : origin + ": " + field; });
}

std::string LrScheduleConfig::summary() const {
  std::string warm = warmup_steps > 0 ? fmt::format(", {} warm-up", warmup_steps) : "";
  if (kind == LrScheduleKind::kConstant) return fmt::format("constant {:g}{}", lr, warm);
  return fmt::format("cosine {:g} -> {:g} over {} steps{}", lr, min_lr, total_steps, warm);
}

double lr_at(const LrScheduleConfig& c, int64_t step) {
  SLIDEDP_CHECK(step >= 1, "optimizer steps are 1-based, got " + std::to_string(step));
  if (step <= c.warmup_steps) return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  if (c.kind == LrScheduleKind::kConstant) return c.lr;
  if (step >= c.total_steps) return c.min_lr;
  const double progress =
      static_cast<double>(step - c.warmup_steps) / static_cast<double>(c.total_steps - c.warmup_steps);
  return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

LrScheduleConfig lr_schedule_from_yaml_reader(const YamlReader& r) {
  LrScheduleConfig c;
  const std::string kind = r.text("kind", {"constant", "cosine"});
  c.kind = kind == "cosine" ? LrScheduleKind::kCosine : LrScheduleKind::kConstant;
  c.lr = r.number("lr", 0, kMaxLr, "(learning rate)");
  c.warmup_steps = r.integer_or("warmup_steps", 0, 0, int64_t{1} << 40);
  if (c.kind == LrScheduleKind::kCosine) {
    c.total_steps = r.integer("total_steps", 1, int64_t{1} << 40);
    c.min_lr = r.number_or("min_lr", 0, 0, kMaxLr, "(learning rate)");
  } else {
    for (const char* key : {"total_steps", "min_lr"})
      if (r.has(key)) throw InputError(r.where(key), "only for kind cosine");
  }
  r.done();
  validate_with(c, [&](const std::string& field) { return r.where(field); });
  return c;
}

LrScheduleConfig lr_schedule_from_yaml(const std::string& yaml_text, const std::string& origin) {
  return lr_schedule_from_yaml_reader(YamlReader::load_string(yaml_text, origin));
}

std::string lr_schedule_to_yaml(const LrScheduleConfig& c) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "kind" << YAML::Value << lr_schedule_kind_name(c.kind);
  e << YAML::Key << "lr" << YAML::Value << shortest(c.lr);
  e << YAML::Key << "warmup_steps" << YAML::Value << c.warmup_steps;
  if (c.kind == LrScheduleKind::kCosine) {
    e << YAML::Key << "total_steps" << YAML::Value << c.total_steps;
    e << YAML::Key << "min_lr" << YAML::Value << shortest(c.min_lr);
  }
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

std::string lr_schedule_to_json(const LrScheduleConfig& c) {
  nlohmann::ordered_json j;  // doubles print as the shortest text that reads back the same
  j["kind"] = lr_schedule_kind_name(c.kind);
  j["lr"] = c.lr;
  j["warmup_steps"] = c.warmup_steps;
  if (c.kind == LrScheduleKind::kCosine) {
    j["total_steps"] = c.total_steps;
    j["min_lr"] = c.min_lr;
  }
  return j.dump();
}

}  // namespace slidedp::exec
