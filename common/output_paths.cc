// Output paths against inputs and against each other; see output_paths.h.
#include "common/output_paths.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>

#include "common/error.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;

// The path with every link in its existing part resolved and "." / ".." removed; the part that does
// not exist yet is kept as written.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  if (ec) throw IoError(p, "cannot resolve: " + ec.message());
  fs::path r = fs::weakly_canonical(abs, ec);
  if (ec) throw IoError(p, "cannot resolve: " + ec.message());
  return r.lexically_normal();
}

// Whether `outer` is a proper ancestor of `inner` (component by component: /a/b holds /a/b/c, not /a/bc).
bool holds(const fs::path& outer, const fs::path& inner) {
  auto o = outer.begin(), i = inner.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *o != *i) return false;
  }
  for (; i != inner.end(); ++i)
    if (!i->empty()) return true;
  return false;
}

bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

std::string describe(PathOverlap o) {
  switch (o) {
    case PathOverlap::kSame: return "is";
    case PathOverlap::kFirstHolds: return "holds";
    case PathOverlap::kSecondHolds: return "lies inside";
    case PathOverlap::kNone: break;
  }
  return "";
}

// The nearest part of `p` that exists (p itself, or a parent).
fs::path nearest_existing(const fs::path& p) {
  fs::path q = p;
  std::error_code ec;
  while (!q.empty() && !fs::exists(q, ec)) {
    if (q == q.parent_path()) break;
    q = q.parent_path();
  }
  return q.empty() ? fs::path(".") : q;
}

// Temporary names beside an output add up to about 40 characters (".NAME.tmp.PID", ".tmp-NAME-PID-N"):
// a longer name would fail only when the output is written, after the work.
constexpr std::size_t kMaxOutputNameChars = 200;

void check_name_length(const NamedPath& output, const fs::path& target) {
  const std::string name = target.filename().string();
  if (name.size() > kMaxOutputNameChars)
    throw InputError(output.flag, fmt::format("the name '{}...' has {} characters; at most {} (its temporary file "
                                              "needs the rest of the file system's 255)",
                                              name.substr(0, 40), name.size(), kMaxOutputNameChars));
}

void check_writable_parent(const NamedPath& output, const fs::path& target) {
  const fs::path base = nearest_existing(target.parent_path());
  std::error_code ec;
  if (!fs::is_directory(base, ec))
    throw InputError(output.flag, fmt::format("'{}' cannot be created: {} is not a folder", output.path, base.string()));
  if (::access(base.c_str(), W_OK | X_OK) != 0)
    throw IoError(output.path, fmt::format("{} cannot write in {} (no permission)", output.flag, base.string()));
}

}  // namespace

PathOverlap path_overlap(const std::string& a, const std::string& b) {
  const fs::path ra = resolved(a), rb = resolved(b);
  if (ra == rb || same_file(ra, rb)) return PathOverlap::kSame;
  if (holds(ra, rb)) return PathOverlap::kFirstHolds;
  if (holds(rb, ra)) return PathOverlap::kSecondHolds;
  return PathOverlap::kNone;
}

void refuse_output_over_inputs(const NamedPath& output, const std::vector<NamedPath>& inputs) {
  if (output.path.empty()) return;
  for (const NamedPath& in : inputs) {
    if (in.path.empty()) continue;
    const PathOverlap o = path_overlap(output.path, in.path);
    if (o == PathOverlap::kNone) continue;
    throw InputError(output.flag, fmt::format("'{}' {} {} '{}': writing it would destroy what the run reads; "
                                              "choose another path",
                                              output.path, describe(o), in.flag, in.path));
  }
}

void refuse_overlapping_outputs(const std::vector<NamedPath>& outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i)
    for (std::size_t j = i + 1; j < outputs.size(); ++j) {
      if (outputs[i].path.empty() || outputs[j].path.empty()) continue;
      const PathOverlap o = path_overlap(outputs[i].path, outputs[j].path);
      if (o == PathOverlap::kNone) continue;
      throw InputError(outputs[i].flag, fmt::format("'{}' {} {} '{}': two outputs of one run would overwrite each "
                                                    "other; choose separate paths",
                                                    outputs[i].path, describe(o), outputs[j].flag, outputs[j].path));
    }
}

void check_output_file_target(const NamedPath& output) {
  if (output.path.empty()) return;
  const fs::path target = resolved(output.path);
  std::error_code ec;
  if (fs::is_directory(target, ec))
    throw InputError(output.flag, fmt::format("'{}' is a folder; give a file path", output.path));
  check_name_length(output, target);
  check_writable_parent(output, target);
}

void check_output_folder_target(const NamedPath& output) {
  if (output.path.empty()) return;
  const fs::path target = resolved(output.path);
  std::error_code ec;
  if (fs::exists(target, ec) && !fs::is_directory(target, ec))
    throw InputError(output.flag, fmt::format("'{}' exists and is not a folder", output.path));
  check_name_length(output, target);
  if (fs::is_directory(target, ec) && ::access(target.c_str(), W_OK | X_OK) != 0)
    throw IoError(output.path, fmt::format("{}: the folder is not writable", output.flag));
  check_writable_parent(output, target);
}

void refuse_output_in_checkpoints(const NamedPath& output, bool itself_too) {
  if (output.path.empty()) return;
  const fs::path target = resolved(output.path);
  std::error_code ec;
  for (fs::path p = itself_too ? target : target.parent_path(); !p.empty(); p = p.parent_path()) {
    // (the names io/checkpoint.h and io/checkpoint_root.h write)
    const bool checkpoint = fs::exists(p / "trainer_state.json", ec), root = fs::exists(p / "run.json", ec);
    if (checkpoint || root)
      throw InputError(output.flag, fmt::format("'{}' {} the {} '{}': another run's checkpoints would lose it or it "
                                                "would lose them; choose a path outside",
                                                output.path, p == target ? "is" : "lies inside",
                                                checkpoint ? "checkpoint" : "checkpoint root", p.string()));
    if (p == p.parent_path()) break;
  }
}

}  // namespace slidedp
