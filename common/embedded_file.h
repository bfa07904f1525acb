// A text file compiled into the binary (presets, default training text); see cmake/SlidedpEmbed.cmake.
#pragma once

#include <optional>
#include <span>
#include <string_view>

namespace slidedp {

struct EmbeddedFile {
  std::string_view name;  // file name without folder, e.g. "h100-sxm-x4.yaml"
  std::string_view text;
};

inline std::optional<std::string_view> find_embedded(std::span<const EmbeddedFile> files,
                                                     std::string_view name) {
  for (const auto& f : files)
    if (f.name == name) return f.text;
  return std::nullopt;
}

}  // namespace slidedp
