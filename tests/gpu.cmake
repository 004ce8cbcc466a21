# GPU checks, registered only on CUDA builds (LibTorch 2.x with CUDA): ctest -L gpu.
if(TARGET torch_cuda)
  add_executable(test_gpu test_gpu.cpp)
  target_link_libraries(test_gpu PRIVATE dit_backend GTest::gtest)
  target_compile_definitions(test_gpu PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}")
  add_test(NAME gpu_parity_and_nccl COMMAND ${DITSTUDIO_MPIRUN} -np 1 $<TARGET_FILE:test_gpu>)
  set_tests_properties(gpu_parity_and_nccl PROPERTIES LABELS "gpu" TIMEOUT 600)
endif()
