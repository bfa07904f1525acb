// Whole-file reads and atomic writes. Atomic = write to a temporary file in the same folder, fsync,
// rename over the target, fsync the folder: a reader sees the old file or the new one, never half.
#pragma once

#include <string>
#include <string_view>

namespace slidedp {

// Whether `path` exists / is a folder; "no" for a missing path, IoError naming the path for anything
// the system refuses to say (a loop of symbolic links, a name too long, no permission), where
// std::filesystem's own calls would throw an exception the tools report as an internal error.
bool path_exists(const std::string& path);
bool is_folder(const std::string& path);

// Throws IoError naming the path when the file is missing or unreadable.
std::string read_text_file(const std::string& path);

// Throws IoError naming the path when any step fails; the temporary file is removed.
void write_file_atomic(const std::string& path, std::string_view content);

// What tells two copies of a file or folder apart without reading all of a model's gigabytes: every
// file's name and size and the FNV-1a of its first, middle and last MiB (a whole file up to 3 MiB),
// folders recursively in name order. For checking that processes on several hosts read the same
// inputs. Throws IoError naming the path when it cannot be read.
std::string content_fingerprint(const std::string& path);

// fsync a file or folder by path (throws IoError).
void fsync_path(const std::string& path);

}  // namespace slidedp
