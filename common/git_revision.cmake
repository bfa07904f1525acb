# Writes the git revision of the source tree into a one-line C++ file, at build time rather than at
# configure time, so a binary never claims the revision its build folder was configured at. The file
# is rewritten only when the revision changes, so an unchanged tree recompiles nothing.
# Usage: cmake -DSOURCE_DIR=... -DOUTPUT=... -P git_revision.cmake
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0 OR NOT rev)
  set(rev "unknown")
elseif(dirty)
  string(APPEND rev "+dirty")
endif()
set(text "// Generated at build time by common/git_revision.cmake; do not edit.\n#include \"common/build_info.h\"\nnamespace slidedp {\nconst char kBuildGitRevision[] = \"${rev}\";\n}  // namespace slidedp\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE ${OUTPUT} "${text}")
