// Where a tool may write: never onto, into or around what it reads, and never over another output of
// the same command. Paths are compared after resolving links (a symbolic link to an input is the
// input) and by file identity (a hard link to an input is the input), so the check holds however the
// user spells the path. Every tool checks its outputs this way before it does any work.
#pragma once

#include <string>
#include <vector>

namespace slidedp {

// A path and the flag or argument that gave it ("--save-model", "INPUT"), for messages.
struct NamedPath {
  std::string flag;
  std::string path;
};

// How two paths relate once links are resolved.
enum class PathOverlap {
  kNone,
  kSame,          // one file or folder
  kFirstHolds,    // the first is a folder the second lies in
  kSecondHolds,   // the second is a folder the first lies in
};
PathOverlap path_overlap(const std::string& a, const std::string& b);

// Throws InputError naming both flags when `output` is one of `inputs`, holds one or lies inside one.
// Empty paths are skipped.
void refuse_output_over_inputs(const NamedPath& output, const std::vector<NamedPath>& inputs);

// Throws InputError when any two of `outputs` are the same path or one holds the other.
void refuse_overlapping_outputs(const std::vector<NamedPath>& outputs);

// An output file the command will create or replace at the end: it must not be a folder, and its
// folder must exist (or be creatable) and be writable. Throws InputError / IoError naming the flag,
// so a run fails before its first step instead of after all its work.
void check_output_file_target(const NamedPath& output);

// An output folder the command will create or fill: it must not be an existing non-folder, it (or,
// when new, its parent) must be writable. Throws InputError / IoError naming the flag.
void check_output_folder_target(const NamedPath& output);

// An output inside another run's checkpoints would be deleted by that run's rotation or corrupt what
// it resumes: refused when the path, or a folder above it, is a checkpoint (it holds
// trainer_state.json) or a checkpoint root (it holds run.json; io/checkpoint_root.h). `itself_too`:
// also when the path is one (a file output; a checkpoint root's own lease decides for --checkpoint-dir).
void refuse_output_in_checkpoints(const NamedPath& output, bool itself_too = true);

}  // namespace slidedp
