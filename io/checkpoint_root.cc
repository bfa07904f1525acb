// Ownership of checkpoint roots; see checkpoint_root.h.
#include "io/checkpoint_root.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "common/file_util.h"
#include "common/output_paths.h"
#include "common/provenance.h"
#include "common/strict_json.h"
#include "io/checkpoint.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;
using OwnerJson = nlohmann::json;  // run.json, the root's owner

constexpr const char* kOwnerFile = "run.json";
constexpr const char* kLockFile = "run.lock";

std::string new_run_id() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  return fmt::format("{:016x}", v);
}

std::string field(const OwnerJson& j, const char* key, const std::string& origin) {
  if (!j.contains(key) || !j[key].is_string()) throw InputError(origin + ": " + key, "expected a string");
  return j[key].get<std::string>();
}

void write_owner(const std::string& root, const CheckpointRootOwner& o) {
  const OwnerJson j = {{"run_id", o.run_id},
                       {"created_utc", o.created_utc},
                       {"model", o.model},
                       {"resumed_from", o.resumed_from}};
  write_file_atomic((fs::path(root) / kOwnerFile).string(), j.dump(2) + "\n");
}

// Holds <root>/run.lock for the lease's life; the holder's pid is written into it for the message of a
// process that finds it held.
int lock_root(const std::string& root, const std::string& flag) {
  const std::string path = (fs::path(root) / kLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(path, std::string("cannot open the checkpoint root's lock: ") + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {};
    const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK) throw IoError(path, std::string("cannot lock: ") + std::strerror(err));
    throw InputError(flag, fmt::format("'{}' is in use by another run (process {}): two runs in one checkpoint root "
                                       "would delete each other's checkpoints; choose another folder",
                                       root, n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : "?"));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    ::close(fd);
    throw IoError(path, std::string("cannot write the lock holder: ") + std::strerror(errno));
  }
  return fd;
}

}  // namespace

std::optional<CheckpointRootOwner> read_checkpoint_root_owner(const std::string& root) {
  const std::string path = (fs::path(root) / kOwnerFile).string();
  if (!path_exists(path)) return std::nullopt;
  const OwnerJson j = parse_json_strict<OwnerJson>(read_text_file(path), path);
  if (!j.is_object()) throw InputError(path, "expected a JSON object");
  CheckpointRootOwner o;
  o.run_id = field(j, "run_id", path);
  o.created_utc = field(j, "created_utc", path);
  o.model = field(j, "model", path);
  o.resumed_from = field(j, "resumed_from", path);
  return o;
}

CheckpointRootLease CheckpointRootLease::acquire(const std::string& root, const std::string& flag,
                                                 const std::string& model, const std::string& resume_dir) {
  check_output_folder_target({flag, root});
  std::error_code ec;
  const bool created_root = !fs::exists(root, ec);
  fs::create_directories(root, ec);
  if (ec) throw IoError(root, "cannot create folder: " + ec.message());
  const int fd = lock_root(root, flag);
  try {
    std::optional<CheckpointRootOwner> owner = read_checkpoint_root_owner(root);
    const auto steps = list_checkpoints(root);
    const bool from_here = !resume_dir.empty() && path_overlap(resume_dir, root) == PathOverlap::kSecondHolds;
    if (from_here) {
      if (steps.empty() || path_overlap(steps.back().second, resume_dir) != PathOverlap::kSame)
        throw InputError(flag, fmt::format("resuming from {} into '{}', which holds a newer checkpoint ({}): the new "
                                           "steps would be rotated together with the newer ones of the run it "
                                           "branches from; give another {} for the branch",
                                           resume_dir, root, steps.empty() ? "none" : steps.back().second, flag));
      if (!owner) {  // a root from before run.json: the run resuming its newest step owns it from now
        owner = CheckpointRootOwner{new_run_id(), utc_timestamp(), model, ""};
        write_owner(root, *owner);
      }
      return CheckpointRootLease(root, fd, *owner, /*continues=*/true, /*created_root=*/false);
    }
    if (owner || !steps.empty())
      throw InputError(flag, fmt::format("'{}' holds the checkpoints of {} ({} step folder{}, newest {}): pass --resume "
                                         "{} to continue that run, or give an empty folder",
                                         root, owner ? "run " + owner->run_id + " of " + owner->model : "an earlier run",
                                         steps.size(), steps.size() == 1 ? "" : "s",
                                         steps.empty() ? "none" : fs::path(steps.back().second).filename().string(), root));
    CheckpointRootOwner fresh{new_run_id(), utc_timestamp(), model, resume_dir};
    write_owner(root, fresh);
    return CheckpointRootLease(root, fd, fresh, /*continues=*/false, created_root);
  } catch (...) {
    ::close(fd);
    throw;
  }
}

CheckpointRootLease::CheckpointRootLease(CheckpointRootLease&& other) noexcept
    : root_(std::move(other.root_)), lock_fd_(other.lock_fd_), owner_(std::move(other.owner_)),
      continues_(other.continues_), created_root_(other.created_root_) {
  other.lock_fd_ = -1;
}

CheckpointRootLease::~CheckpointRootLease() {
  if (lock_fd_ < 0) return;
  // A new run that published nothing takes its marks back (the lock file is removed while held, so
  // no other run can have taken it in between), and the folder too when it made it and it is empty.
  try {
    if (!continues_ && list_checkpoints(root_).empty()) {
      std::error_code ec;
      fs::remove(fs::path(root_) / kOwnerFile, ec);
      fs::remove(fs::path(root_) / kLockFile, ec);
      if (created_root_ && fs::is_empty(root_, ec)) fs::remove(root_, ec);
    }
  } catch (const std::exception&) {  // a destructor reports nothing: the marks stay, harmless
  }
  ::close(lock_fd_);  // closing the last descriptor releases the flock
}

}  // namespace slidedp
