#include "common/cli_parse.h"

#include "common/error.h"

namespace slidedp {

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : static_cast<int>(ErrorKind::kInput);  // exit() prints help or the error
  }
  return std::nullopt;
}

}  // namespace slidedp
