# Executor tests on the CUDA backend (label gpu): its primitives, the pipeline's equivalence oracle
# on as many GPUs as are present, and a tiny model's loss curve against the CPU backend's. Every test
# skips with the reason where no GPU is visible; the binaries build wherever CUDA compiles (CI).
if(NOT TARGET slidedp_cuda_backend)
  return()
endif()
slidedp_test(test_executor_cuda_backend SOURCES cuda_backend_test.cc DEPS slidedp_executor LABELS gpu TIMEOUT 300)
slidedp_test(test_executor_cuda_pipeline SOURCES cuda_pipeline_test.cc DEPS slidedp_executor LABELS gpu TIMEOUT 600)
slidedp_test(test_executor_cuda_training SOURCES cuda_training_test.cc DEPS slidedp_executor LABELS gpu TIMEOUT 300)
slidedp_test(test_executor_cuda_copy_bytes SOURCES cuda_copy_bytes_test.cc DEPS slidedp_executor LABELS gpu TIMEOUT 300)
