// slidedp-predict: what a plan does on a machine, real or hypothetical. Prints a readable breakdown
// (bottleneck first) or one JSON object; --trace writes the simulated timeline for Perfetto;
// --system compares SlideDP with the baselines on the same workload.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "card/model_card.h"
#include "cli/plan_flags.h"
#include "common/cli_main.h"
#include "common/cli_parse.h"
#include "common/error.h"
#include "common/file_util.h"
#include "common/output_paths.h"
#include "common/units.h"
#include "model/chrome_trace.h"
#include "model/hardware.h"
#include "model/prediction_report.h"
#include "model/simulator.h"
#include "model/step_model.h"
#include "model/system.h"

namespace slidedp {
namespace {

int predict_main(int argc, char** argv) {
  CLI::App app{
      "slidedp-predict: predict the step time, bottleneck, exposed pipeline time and memory of a plan\n"
      "on a hardware profile (a preset or a slidedp-profile output), for SlideDP or a baseline system."};
  PlanFlags flags;
  flags.add_to(app);
  std::string system = "slidedp";
  std::string method = "analytical";
  std::string trace;
  bool json = false;
  bool clip = false, no_clip = false;
  auto* clip_flag = app.add_flag(
      "--clip", clip,
      "A run that clips its gradient norm or skips non-finite steps (slidedp-run --clip-grad-norm, "
      "--on-nonfinite skip): the update follows the backward and overlaps the next step's forward unit by "
      "unit (plan key verify_updates). SlideDP's alone: the baselines are modeled with their own update "
      "placement");
  app.add_flag("--no-clip", no_clip, "A plan file's verify_updates off: the run neither clips nor skips")
      ->excludes(clip_flag);
  app.add_option("--system", system,
                 "slidedp | slideformer-dp | zero-offload | megatrain | fsdp2 | all (compare every system)");
  app.add_option("--method", method, "analytical (fast closed form) | simulator (discrete-event) | both")
      ->check(CLI::IsMember({"analytical", "simulator", "both"}));
  app.add_option("--trace", trace, "Write the simulated timeline of one step as Chrome trace JSON (Perfetto)");
  app.add_flag("--json", json, "Print one JSON object instead of the readable report");
  app.add_flag_callback("--list-presets", [] {
    fmt::print("models:   {}\nhardware: {}\nsystems:  {}\n", fmt::join(model_preset_names(), ", "),
               fmt::join(hardware_preset_names(), ", "), fmt::join(system_names(), ", "));
    std::exit(0);
  }, "List model, hardware and system names, then exit");
  if (const std::optional<int> done = parse_command_line(app, argc, argv)) return *done;

  PlanFile pf = flags.resolve();
  if (clip) pf.plan.verify_updates = true;
  if (no_clip) pf.plan.verify_updates = false;
  check_output_file_target({"--trace", trace});
  refuse_output_in_checkpoints({"--trace", trace});
  refuse_output_over_inputs({"--trace", trace}, {{"--plan", flags.plan_file}, {"--model", path_exists(pf.model) ? pf.model : ""},
                                                 {"--hardware", path_exists(pf.hardware) ? pf.hardware : ""}});
  if (pf.model.empty()) throw InputError("--model", "required (or a plan file with a model key)");
  if (pf.hardware.empty()) throw InputError("--hardware", "required (or a plan file with a hardware key)");
  if (pf.seq_len <= 0) throw InputError("--seq", "required (or a plan file with seq_len)");
  Workload w = make_workload(load_model_card(pf.model), pf.seq_len);
  pf.plan.validate(static_cast<int>(w.model.num_layers), "plan");  // before anything sizes by it
  Hardware hw = load_hardware(pf.hardware);
  std::vector<System> systems;
  if (system == "all") {
    for (const auto& n : system_names()) systems.push_back(parse_system(n, "--system"));
  } else {
    systems.push_back(parse_system(system, "--system"));
  }
  pf.plan.validate(static_cast<int>(w.model.num_layers), pf.plan_source());
  if (pf.plan.verify_updates && (systems.size() > 1 || systems.front() != System::kSlideDP))
    throw InputError(
        clip ? "--clip" : pf.plan_source() + ": verify_updates",
        "clipping is modeled for SlideDP (--system slidedp); the baselines' presets describe their "
        "published update placement");

  nlohmann::json out = nlohmann::json::array();
  std::vector<std::string> infeasible;  // single-system predictions that cannot fit
  for (System s : systems) {
    std::vector<Prediction> preds;
    if (method != "simulator") preds.push_back(predict_analytical(w, hw, pf.plan, s));
    if (method != "analytical" || !trace.empty()) {
      SimulatorOptions opt;
      opt.record_timeline = !trace.empty();
      Simulation sim = simulate(w, hw, pf.plan, s, opt);
      if (!trace.empty()) {
        std::string path = systems.size() > 1 ? fmt::format("{}.{}.json", trace, system_name(s)) : trace;
        write_chrome_trace(path, sim.timeline, fmt::format("predicted: {} {} on {}", system_name(s), w.model.name, hw.name));
        if (!json) fmt::print(stderr, "wrote timeline ({} spans) to {}\n", sim.timeline.size(), path);
      }
      if (method != "analytical") preds.push_back(sim.prediction);
    }
    for (const Prediction& p : preds) {
      if (!p.feasible && systems.size() == 1 && p.method == preds.front().method)
        infeasible.push_back(p.infeasible_reasons.front());
      if (json) {
        nlohmann::json j = prediction_to_json(p);
        j["model"] = w.model.name;
        j["hardware"] = hw.name;
        j["seq_len"] = w.seq_len;
        j["plan"] = pf.plan.summary(static_cast<int>(w.model.num_layers));
        j["verify_updates"] = pf.plan.verify_updates;
        j["optimizer_states"] = optimizer_states_name(pf.plan.optimizer_states);
        out.push_back(j);
      } else {
        std::string ctx = fmt::format("{} ({}) on {} | seq {} | {}", w.model.name, w.model.params_summary(), hw.name,
                                      w.seq_len,
                                      plan_for_system(pf.plan, s, w.model).summary(static_cast<int>(w.model.num_layers)));
        if (pf.plan.verify_updates) ctx += " | clipped: the update follows the backward (verify_updates)";
        std::cout << prediction_to_text(p, ctx) << "\n";
      }
    }
  }
  if (json) std::cout << (out.size() == 1 ? out[0].dump(2) : out.dump(2)) << "\n";
  // The prediction is printed either way (what-if studies want the numbers), but a plan that cannot
  // fit is an error for scripts: exit code 3. Comparing several systems, some may not fit: exit 0.
  if (!infeasible.empty()) throw InfeasibleError(infeasible.front());
  return 0;
}

}  // namespace
}  // namespace slidedp

int main(int argc, char** argv) {
  return slidedp::run_cli("slidedp-predict", [&] { return slidedp::predict_main(argc, argv); });
}
