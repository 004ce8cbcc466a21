# Context-parallel attention tests (parallel/attention.*, parallel/context_parallel.*): local
# kernels and validation on every rank, and RingAttention / UlyssesAttention / unified / anything
# variants across 1, 2 and 4 MPI ranks.
add_executable(test_context_parallel ${CMAKE_CURRENT_LIST_DIR}/test_context_parallel.cpp)
target_link_libraries(test_context_parallel PRIVATE dit_parallel GTest::gtest MPI::MPI_C)
target_precompile_headers(test_context_parallel REUSE_FROM dit_parallel)
# mpi.h only for its C API (OpenMPI's C++ bindings are not linked).
target_compile_definitions(test_context_parallel PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)

if(DEFINED DITSTUDIO_MPIRUN)
  set(_ditstudio_cp_mpirun ${DITSTUDIO_MPIRUN})
else()
  set(_ditstudio_cp_mpirun ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
      -x OMP_NUM_THREADS=1)
endif()
foreach(_np 1 2 4)
  add_test(NAME context_parallel_np${_np}
           COMMAND ${_ditstudio_cp_mpirun} -np ${_np} $<TARGET_FILE:test_context_parallel>)
  set_tests_properties(context_parallel_np${_np} PROPERTIES
    LABELS "parallel;mpi" PROCESSORS ${_np} TIMEOUT 600
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()
unset(_ditstudio_cp_mpirun)
