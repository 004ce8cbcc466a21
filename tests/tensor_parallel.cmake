# Tensor-parallel sharding plans (Torch-free unit test) and the parallel linear layers plus the
# context-parallel plan runner under mpirun with 2 and 4 ranks (parallel/tensor_parallel/*,
# parallel/context_parallel_plan.*).
add_executable(test_sharding_plan ${CMAKE_CURRENT_LIST_DIR}/test_sharding_plan.cpp)
target_link_libraries(test_sharding_plan PRIVATE dit_parallel_core GTest::gmock GTest::gtest GTest::gtest_main)
add_test(NAME sharding_plan COMMAND test_sharding_plan)
set_tests_properties(sharding_plan PROPERTIES LABELS "unit;parallel" TIMEOUT 60)

add_executable(test_tensor_parallel ${CMAKE_CURRENT_LIST_DIR}/test_tensor_parallel.cpp)
target_link_libraries(test_tensor_parallel PRIVATE dit_parallel GTest::gtest MPI::MPI_C)
target_precompile_headers(test_tensor_parallel REUSE_FROM dit_parallel)
foreach(_np 2 4)
  add_test(NAME tensor_parallel_np${_np}
           COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_tensor_parallel>)
  set_tests_properties(tensor_parallel_np${_np} PROPERTIES
    LABELS "parallel;mpi" PROCESSORS ${_np} TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()
