// The tools' exit codes for failures that are not SlideDP's own error types: what the system refuses
// is an I/O error (a path) or a runtime error (a thread, memory), never exit 1, which is kept for bugs.
#include "common/cli_main.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <new>
#include <stdexcept>
#include <system_error>

#include "common/error.h"

namespace slidedp {
namespace {

int exit_code_of(const std::function<void()>& failing) {
  return run_cli("test", [&] {
    failing();
    return 0;
  });
}

TEST(CliMain, SystemRefusalsAreNotInternalErrors) {
  testing::internal::CaptureStderr();
  const int path = exit_code_of([] {
    throw std::filesystem::filesystem_error("cannot open", std::filesystem::path("/some/loop/x"),
                                            std::make_error_code(std::errc::too_many_symbolic_link_levels));
  });
  const std::string path_message = testing::internal::GetCapturedStderr();
  EXPECT_EQ(path, static_cast<int>(ErrorKind::kIo));
  EXPECT_NE(path_message.find("/some/loop/x"), std::string::npos) << path_message;

  // std::thread's constructor when the system has no thread to give (EAGAIN).
  testing::internal::CaptureStderr();
  EXPECT_EQ(exit_code_of([] { throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again)); }),
            static_cast<int>(ErrorKind::kRuntime));
  testing::internal::GetCapturedStderr();
  testing::internal::CaptureStderr();
  EXPECT_EQ(exit_code_of([] { throw std::bad_alloc(); }), static_cast<int>(ErrorKind::kRuntime));
  EXPECT_NE(testing::internal::GetCapturedStderr().find("out of memory"), std::string::npos);
}

TEST(CliMain, OwnErrorsKeepTheirCodesAndBugsStayOne) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(exit_code_of([] { throw InputError("plan.yaml", "bad"); }), 2);
  EXPECT_EQ(exit_code_of([] { throw IoError("x", "gone"); }), 4);
  EXPECT_EQ(exit_code_of([] { throw std::logic_error("a bug"); }), 1);
  testing::internal::GetCapturedStderr();
}

}  // namespace
}  // namespace slidedp
