// slidedp-run's inputs and outputs against each other; see run_paths.h.
#include "executor/cli/run_paths.h"

#include <fmt/format.h>

#include <filesystem>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "common/output_paths.h"
#include "io/checkpoint.h"
#include "io/checkpoint_root.h"

namespace slidedp {

void check_run_paths(const RunPaths& p) {
  const std::vector<NamedPath> inputs = {{"--model", p.model},
                                         {"--data", p.data},
                                         {"--eval-data", p.eval_data},
                                         {"--resume", p.resume},
                                         {"--lr-schedule", p.lr_schedule},
                                         {"--plan", p.plan_file},
                                         {"--hardware", p.hardware},
                                         {"--emulate", p.emulate}};
  const NamedPath save{"--save-model", p.save_model}, ckpt{"--checkpoint-dir", p.checkpoint_dir}, db{"--db", p.db},
      trace{"--trace", p.trace};
  refuse_overlapping_outputs({save, ckpt, db, trace});
  for (const NamedPath& out : {save, db, trace}) refuse_output_over_inputs(out, inputs);
  // The checkpoint root may hold the checkpoint a run resumes from (continuing it is the point of a
  // root); whether it may is the root's lease to say.
  std::vector<NamedPath> but_resume(inputs.begin(), inputs.end());
  std::erase_if(but_resume, [](const NamedPath& n) { return n.flag == "--resume"; });
  refuse_output_over_inputs(ckpt, but_resume);

  check_output_folder_target(save);
  check_output_folder_target(ckpt);
  check_output_file_target(db);
  check_output_file_target(trace);
  for (const NamedPath& out : {db, trace}) refuse_output_in_checkpoints(out);
  refuse_output_in_checkpoints(ckpt, /*itself_too=*/false);  // the root itself: its lease decides
  if (!p.save_model.empty() && is_folder(p.save_model)) {
    if (path_exists((std::filesystem::path(p.save_model) / "trainer_state.json").string()))
      throw InputError("--save-model", fmt::format("'{}' is a training checkpoint: saving the model there would drop "
                                                   "its optimizer state; choose another folder",
                                                   p.save_model));
    if (read_checkpoint_root_owner(p.save_model) || !list_checkpoints(p.save_model).empty())
      throw InputError("--save-model", fmt::format("'{}' is a checkpoint root (its step-* folders would be replaced); "
                                                   "choose another folder",
                                                   p.save_model));
    // A model folder is replaced whole, its non-weight files carried over: a sub-folder cannot be.
    for (const auto& e : std::filesystem::directory_iterator(p.save_model))
      if (e.is_directory())
        throw InputError("--save-model", fmt::format("'{}' holds the sub-folder '{}', which saving the model would "
                                                     "drop; choose another folder",
                                                     p.save_model, e.path().filename().string()));
  }
  refuse_output_in_checkpoints(save);
}

}  // namespace slidedp
