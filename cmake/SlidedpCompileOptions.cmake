# Project-wide warnings and sanitizer switches, applied through the slidedp_options interface target
# so third-party code (Eigen, yaml-cpp headers) is not forced into our warning level.
add_library(slidedp_options INTERFACE)
target_compile_options(slidedp_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers>)
if(SLIDEDP_WERROR)
  target_compile_options(slidedp_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
target_include_directories(slidedp_options INTERFACE ${PROJECT_SOURCE_DIR})

# SLIDEDP_FUZZ (clang): coverage instrumentation for libFuzzer everywhere; fuzz/ links the engine.
option(SLIDEDP_FUZZ "Build fuzz/ as libFuzzer targets (clang)" OFF)
if(SLIDEDP_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
if(SLIDEDP_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
  # GCC's -Wmaybe-uninitialized misfires inside libstdc++'s std::function and std::regex once ASan
  # instruments them (a false positive that -Werror would turn into a failed build).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>)
  endif()
elseif(SLIDEDP_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

# SLIDEDP_UNITY_BUILD: compile each target's sources in batches of up to 8 (CMake unity builds), so the
# heavy headers (nlohmann/json, fmt, CLI11, GoogleTest) are parsed and their templates instantiated
# once per batch rather than once per file: CI's builds take about half the CPU time. Off by default,
# so that a developer's build checks that every file includes what it uses; a file's anonymous-namespace
# names must not repeat within its library (a batch is one translation unit).
option(SLIDEDP_UNITY_BUILD "Compile the project's targets as unity batches (CI)" OFF)
if(SLIDEDP_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC warns when a type from an anonymous namespace reaches a lambda of a function template, except
  # in the main file; in a batch no source is the main file.
  target_compile_options(slidedp_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
endif()
function(slidedp_unity target)
  if(SLIDEDP_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()

# Helper: a project library with our options. Usage: slidedp_library(name SOURCES... DEPS ...)
function(slidedp_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_link_libraries(${name} PUBLIC slidedp_options ${ARG_DEPS})
  slidedp_unity(${name})
endfunction()

# Helper: a command-line tool, placed in build/bin so scripts find every slidedp-* in one folder.
function(slidedp_tool name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE slidedp_options ${ARG_DEPS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
  slidedp_unity(${name})
endfunction()
