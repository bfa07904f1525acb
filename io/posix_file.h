// POSIX file primitives shared by every io/ reader and writer: a read-only memory map, an output file
// that writes fully and fsyncs, and the publish steps that make a file or a whole directory appear
// atomically (write beside the target, fsync, rename, fsync the parent). Readers validate sizes before
// touching mapped bytes, so a short file is an error naming it, never a SIGBUS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace slidedp {

// A whole file mapped read-only (MAP_PRIVATE). An empty file maps to an empty span. The mapping is
// valid until destruction; the file must not be truncated by someone else while it is mapped.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws IoError naming the path
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(addr_), size_}; }
  std::size_t size() const { return size_; }

 private:
  void reset();
  std::string path_;
  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

// A file being written: created (or truncated) on construction, written in full (EINTR and short
// writes retried), fsynced and closed by finish(). Destruction without finish() closes the file and
// leaves it on disk (callers write into temporary paths, so a half file is never published).
class OutputFile {
 public:
  explicit OutputFile(std::string path);  // throws IoError naming the path
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, std::size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // fsync (when `sync`) and close; throws IoError naming the path.
  void finish(bool sync = true);
  int64_t bytes_written() const { return bytes_written_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t bytes_written_ = 0;
};

// Renames `tmp_path` over `final_path` (a file) and fsyncs the parent folder.
void publish_file(const std::string& tmp_path, const std::string& final_path);

// A fresh, empty temporary folder beside `final_dir` (same parent, so the final rename stays on one
// file system): "<parent>/.tmp-<name>-<pid>-<n>". The pid lets cleanup tell a dead writer's leftovers
// from a live writer's folder (see remove_stale_temp_dirs).
std::string make_temp_dir_beside(const std::string& final_dir);

// fsyncs `tmp_dir` and every regular file in it, then makes it appear as `final_dir` in one step:
// rename() when `final_dir` does not exist; when it exists and `replace` is set, the two are
// exchanged atomically (renameat2 RENAME_EXCHANGE) and the old content, now at `tmp_dir`, is removed.
// Finally the parent folder is fsynced. Throws IoError naming the folder (and leaves `tmp_dir`).
void publish_dir(const std::string& tmp_dir, const std::string& final_dir, bool replace);

// Removes "<parent>/.tmp-*-<pid>-<n>" folders in `parent` whose writer process no longer exists (a
// writer killed mid-write). Folders of live processes, this one included, are left alone. With
// `target_name`, only that target's (".tmp-<target_name>-<pid>-<n>"). Returns how many were removed.
int remove_stale_temp_dirs(const std::string& parent, const std::string& target_name = "");

}  // namespace slidedp
