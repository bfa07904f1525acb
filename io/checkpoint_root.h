// A checkpoint root belongs to one run. <root>/run.json names the run (a random id, when and for
// which model it began, what it resumed from), and <root>/run.lock is held with flock() by the process
// writing into the root for as long as it runs. So two live runs never share a root, a fresh run never
// rotates an older run's step-* folders together with its own, and `--resume ROOT` continues the run
// the root names. Roots written before run.json existed are adopted by the first run that resumes
// from them.
#pragma once

#include <optional>
#include <string>

namespace slidedp {

struct CheckpointRootOwner {
  std::string run_id;        // 16 hex digits
  std::string created_utc;   // ISO 8601
  std::string model;         // the run's model name
  std::string resumed_from;  // the checkpoint folder the run started from ("" for a fresh start)
};

// run.json of `root`, or nullopt when there is none (a new root, or one from before run.json).
// Throws InputError naming the file for a malformed one.
std::optional<CheckpointRootOwner> read_checkpoint_root_owner(const std::string& root);

class CheckpointRootLease {
 public:
  // Takes `root` (the value of `flag`) for a run of `model`. `resume_dir` is the checkpoint folder the
  // run starts from ("" for a fresh start). Refused, with InputError naming `flag`:
  //  * a root another live process holds (its lock);
  //  * a fresh start into a root that holds another run's checkpoints (its run.json, or step-* folders);
  //  * resuming from inside the root from a step older than the root's newest (the run would mix with
  //    the newer steps of the run it branches from).
  // Resuming from the root's newest checkpoint continues the root's run (adopting a root without
  // run.json); resuming from elsewhere into an empty root starts a new run recording where it came from.
  static CheckpointRootLease acquire(const std::string& root, const std::string& flag, const std::string& model,
                                     const std::string& resume_dir);
  CheckpointRootLease(CheckpointRootLease&& other) noexcept;
  CheckpointRootLease& operator=(CheckpointRootLease&&) = delete;
  CheckpointRootLease(const CheckpointRootLease&) = delete;
  // Releases the lock. run.json stays while the root holds a checkpoint of the run; a run that began
  // the root and published nothing (it failed before its first checkpoint) leaves no trace of it.
  ~CheckpointRootLease();

  const CheckpointRootOwner& owner() const { return owner_; }
  bool continues() const { return continues_; }  // the root's run goes on (vs. a new run begins)

 private:
  CheckpointRootLease(std::string root, int lock_fd, CheckpointRootOwner owner, bool continues, bool created_root)
      : root_(std::move(root)), lock_fd_(lock_fd), owner_(std::move(owner)), continues_(continues),
        created_root_(created_root) {}
  std::string root_;
  int lock_fd_ = -1;
  CheckpointRootOwner owner_;
  bool continues_ = false;
  bool created_root_ = false;  // the folder did not exist before this run
};

}  // namespace slidedp
