// Empty on purpose. clang's CUDA runtime wrapper (__clang_cuda_runtime_wrapper.h, clang 19) still
// includes this header, which CUDA 12 removed with texture references; scripts/style_check.sh puts
// this folder on clang-tidy's include path so it can parse .cu files against CUDA 12 and 13. Nothing
// in SlideDP uses texture references.
#pragma once
