# The CUDA backend (slidedp_cuda_backend), included from kernels/cuda/CMakeLists.txt so the target
# exists before executor/CMakeLists.txt links it (see the comment there). It implements
# executor/backend.h and uses the executor's RunControl, so it and slidedp_executor depend on each
# other: a cycle of static libraries, which CMake resolves by repeating them on the link line.
add_library(slidedp_cuda_backend STATIC
  ${PROJECT_SOURCE_DIR}/executor/cuda/cuda_backend.cc
  ${PROJECT_SOURCE_DIR}/executor/cuda/counter_wait.cu)
target_link_libraries(slidedp_cuda_backend PUBLIC slidedp_options slidedp_kernels_cuda slidedp_executor)
target_compile_options(slidedp_cuda_backend PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${SLIDEDP_CUDA_FLAGS}>)
set_target_properties(slidedp_cuda_backend PROPERTIES CUDA_RUNTIME_LIBRARY Static)
