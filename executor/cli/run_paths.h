// What slidedp-run reads and writes, checked before the run begins: no output is, holds or lies in
// an input; no two outputs overlap; each output can be created where it is asked for; a model folder
// is never written over a checkpoint or a checkpoint root (another run's state). The checkpoint
// root's ownership and lock are io/checkpoint_root.h's.
#pragma once

#include <string>

namespace slidedp {

struct RunPaths {
  // inputs
  std::string model;  // a Hugging Face folder, a config.json or a card file ("" for a preset)
  std::string data, eval_data, resume, lr_schedule, plan_file, hardware,
      emulate;  // hardware/emulate: a profile file or ""
  // outputs
  std::string save_model, checkpoint_dir, db, trace;
};

// Throws InputError (exit 2) naming the flags at fault, IoError where a folder cannot be written.
void check_run_paths(const RunPaths& p);

}  // namespace slidedp
