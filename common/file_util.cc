// File helpers; see file_util.h.
#include "common/file_util.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/hash.h"

namespace slidedp {

namespace {

std::filesystem::file_status status_of(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    throw IoError(path, ec.message());
  return st;
}

}  // namespace

bool path_exists(const std::string& path) { return std::filesystem::exists(status_of(path)); }
bool is_folder(const std::string& path) { return std::filesystem::is_directory(status_of(path)); }

std::string read_text_file(const std::string& path) {
  if (!path_exists(path)) throw IoError(path, "no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path, "cannot open for reading");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw IoError(path, "read failed");
  return ss.str();
}

namespace {

void fingerprint_into(const std::filesystem::path& p, const std::string& name, std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(p, ec)) entries.push_back(e.path());
    if (ec) throw IoError(p.string(), "cannot list folder: " + ec.message());
    std::sort(entries.begin(), entries.end());
    out += name + "/{";
    for (const fs::path& e : entries) fingerprint_into(e, e.filename().string(), out);
    out += "}";
    return;
  }
  const uintmax_t size = fs::file_size(p, ec);
  if (ec) throw IoError(p.string(), "cannot read: " + ec.message());
  std::ifstream in(p, std::ios::binary);
  if (!in) throw IoError(p.string(), "cannot open for reading");
  // The whole file up to 3 MiB, else its first, middle and last MiB.
  constexpr uintmax_t kSample = uintmax_t{1} << 20;
  std::string sample;
  auto read_at = [&](uintmax_t at, uintmax_t n) {
    std::string buf(static_cast<std::size_t>(n), '\0');
    in.seekg(static_cast<std::streamoff>(at));
    in.read(buf.data(), static_cast<std::streamsize>(n));
    if (!in) throw IoError(p.string(), "read failed");
    sample += buf;
  };
  if (size <= 3 * kSample) {
    read_at(0, size);
  } else {
    for (uintmax_t at : {uintmax_t{0}, size / 2, size - kSample}) read_at(at, kSample);
  }
  out += fmt::format("{}:{}:{:016x};", name, size, fnv1a(sample));
}

}  // namespace

std::string content_fingerprint(const std::string& path) {
  std::string out;
  fingerprint_into(path, std::filesystem::path(path).filename().string(), out);
  return fmt::format("{:016x} ({} bytes of listing)", fnv1a(out), out.size());
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw IoError(path, std::string("cannot open for fsync: ") + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw IoError(path, std::string("fsync failed: ") + std::strerror(err));
}

void write_file_atomic(const std::string& path, std::string_view content) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw IoError(tmp, std::string("cannot create: ") + std::strerror(errno));
  const char* p = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IoError(path, std::string("write failed: ") + std::strerror(err));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw IoError(path, std::string("fsync/close failed: ") + std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw IoError(path, std::string("rename failed: ") + std::strerror(err));
  }
  fsync_path(dir.string());
}

}  // namespace slidedp
