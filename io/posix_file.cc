// POSIX file primitives; see posix_file.h. Every failure throws IoError with the path and strerror.
#include "io/posix_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/file_util.h"

namespace slidedp {
namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    throw IoError(path, err == ENOENT ? "no such file" : "cannot open for reading: " + errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw IoError(path, "cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(path, "not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    addr_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr_ == MAP_FAILED) {
      int err = errno;
      addr_ = nullptr;
      size_ = 0;
      ::close(fd);
      throw IoError(path, "mmap failed: " + errno_text(err));
    }
  }
  ::close(fd);  // the mapping keeps the file referenced
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), addr_(other.addr_), size_(other.size_) {
  other.addr_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    addr_ = other.addr_;
    size_ = other.size_;
    other.addr_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(path_, "cannot create: " + errno_text(errno));
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(const void* data, std::size_t bytes) {
  SLIDEDP_CHECK(fd_ >= 0, "write after finish: " + path_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError(path_, "write failed: " + errno_text(errno));
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
    bytes_written_ += n;
  }
}

void OutputFile::finish(bool sync) {
  SLIDEDP_CHECK(fd_ >= 0, "finish twice: " + path_);
  if (sync && ::fsync(fd_) != 0) {
    int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw IoError(path_, "fsync failed: " + errno_text(err));
  }
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw IoError(path_, "close failed: " + errno_text(errno));
}

void publish_file(const std::string& tmp_path, const std::string& final_path) {
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0)
    throw IoError(final_path, "rename from " + tmp_path + " failed: " + errno_text(errno));
  fs::path parent = fs::path(final_path).parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

std::string make_temp_dir_beside(const std::string& final_dir) {
  static std::atomic<int> counter{0};
  fs::path target = fs::path(final_dir);
  if (!target.has_filename()) target = target.parent_path();  // "dir/" -> "dir"
  fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw IoError(parent.string(), "cannot create folder: " + ec.message());
  for (int attempt = 0; attempt < 1000; ++attempt) {
    fs::path tmp = parent / (".tmp-" + target.filename().string() + "-" + std::to_string(::getpid()) + "-" +
                             std::to_string(counter.fetch_add(1)));
    if (::mkdir(tmp.c_str(), 0755) == 0) return tmp.string();
    if (errno != EEXIST) throw IoError(tmp.string(), "cannot create folder: " + errno_text(errno));
  }
  throw IoError(parent.string(), "cannot find a free temporary folder name");
}

void publish_dir(const std::string& tmp_dir, const std::string& final_dir, bool replace) {
  // Data first: every file, then the folder's own entries, so the rename publishes durable content.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(tmp_dir, ec))
    if (entry.is_regular_file()) fsync_path(entry.path().string());
  if (ec) throw IoError(tmp_dir, "cannot list folder: " + ec.message());
  fsync_path(tmp_dir);

  fs::path target = fs::path(final_dir);
  if (!target.has_filename()) target = target.parent_path();
  bool exists = fs::exists(target, ec);
  if (exists && !replace) throw IoError(target.string(), "already exists (not replaced)");
  if (!exists) {
    if (::rename(tmp_dir.c_str(), target.c_str()) != 0)
      throw IoError(target.string(), "rename from " + tmp_dir + " failed: " + errno_text(errno));
  } else {
    // One atomic step: readers see the old folder or the new one, never neither.
    if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0)
      throw IoError(target.string(), "atomic exchange with " + tmp_dir + " failed: " + errno_text(errno));
    fs::remove_all(tmp_dir, ec);  // the old content; a leftover is cleaned by remove_stale_temp_dirs
  }
  fs::path parent = target.parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

int remove_stale_temp_dirs(const std::string& parent, const std::string& target_name) {
  int removed = 0;
  std::error_code ec;
  const std::string prefix = target_name.empty() ? ".tmp-" : ".tmp-" + target_name + "-";
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !entry.is_directory()) continue;
    // ".tmp-<name>-<pid>-<n>": the pid is the second-to-last dash-separated field.
    std::size_t last = name.rfind('-');
    if (last == std::string::npos || last == 0) continue;
    std::size_t prev = name.rfind('-', last - 1);
    if (prev == std::string::npos) continue;
    std::string pid_text = name.substr(prev + 1, last - prev - 1);
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    long pid = std::stol(pid_text);
    if (pid <= 0) continue;
    // ESRCH: no such process, so the writer is gone. EPERM means alive (another user's process).
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm_ec;
    fs::remove_all(entry.path(), rm_ec);
    if (!rm_ec) ++removed;
  }
  return removed;
}

}  // namespace slidedp
