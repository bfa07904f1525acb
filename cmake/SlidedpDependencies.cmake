# Third-party dependencies, all from Debian packages (scripts/install_deps.sh installs them).
find_package(Threads REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(GTest REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(fmt REQUIRED)
if(SLIDEDP_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
# BLAS for the CPU transformer math (OpenBLAS from Debian; cblas interface).
find_package(PkgConfig REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)

# yaml-cpp 0.7 in Debian exports the target as `yaml-cpp`; newer releases as yaml-cpp::yaml-cpp.
if(NOT TARGET yaml-cpp::yaml-cpp)
  add_library(yaml-cpp::yaml-cpp ALIAS yaml-cpp)
endif()

if(SLIDEDP_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    # sm_90 for H100/H200, sm_89 for RTX 4090, sm_80 for A100/A800.
    set(CMAKE_CUDA_ARCHITECTURES 80;89;90)
  endif()
  # The attention kernels use sm_80 tensor-core instructions (bf16 WMMA): below that they would trap.
  foreach(arch ${CMAKE_CUDA_ARCHITECTURES})
    string(REGEX MATCH "^[0-9]+" arch_number "${arch}")
    if(arch_number AND arch_number LESS 80)
      message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES has ${arch}: SlideDP's CUDA kernels need sm_80 or newer (A100, RTX 30xx/40xx, H100)")
    endif()
  endforeach()
  enable_language(CUDA)
  # CMake 3.25 does not know how to ask nvcc for C++20 (it maps CUDA standards only up to 17 for
  # NVIDIA); nvcc >= 12 accepts -std=c++20, so name the flag once for every CUDA folder.
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  find_package(CUDAToolkit REQUIRED)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib /usr/local/cuda/lib64 REQUIRED)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include REQUIRED)
  # nvcc flags of every CUDA folder (kernels/cuda, executor/cuda): line info for profilers,
  # host-compiler warnings as in C++ code, device warnings as errors under SLIDEDP_WERROR.
  set(SLIDEDP_CUDA_FLAGS -lineinfo -Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr)
  if(SLIDEDP_WERROR)
    list(APPEND SLIDEDP_CUDA_FLAGS -Werror=all-warnings)
  endif()
endif()
