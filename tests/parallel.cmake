# Parallel tests: strategy validation (unit, no MPI), collectives and device mesh under mpirun with
# 2 and 4 ranks, and fault injection (a failing rank must bring the whole group down, quickly,
# with a message naming the rank and the cause).
if(NOT DEFINED DITSTUDIO_MPIRUN)
  find_program(MPIEXEC_PROGRAM NAMES mpirun mpiexec REQUIRED)
  set(DITSTUDIO_MPIRUN ${MPIEXEC_PROGRAM} --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
endif()
if(NOT TARGET GTest::gtest)
  find_package(GTest REQUIRED)
endif()

# --- strategy validation (dit_parallel_core only: no Torch, no MPI, no backend) ---
add_executable(test_strategy test_strategy.cpp)
target_link_libraries(test_strategy PRIVATE dit_parallel_core dit_protocol GTest::gmock GTest::gtest GTest::gtest_main)
add_test(NAME strategy COMMAND test_strategy)
set_tests_properties(strategy PROPERTIES LABELS "unit;parallel" TIMEOUT 60)

# --- collectives + device mesh (gtest main with MPI) ---
add_executable(test_collectives test_collectives.cpp)
target_link_libraries(test_collectives PRIVATE dit_parallel dit_protocol GTest::gtest)
target_precompile_headers(test_collectives REUSE_FROM dit_parallel)
foreach(_np 2 4)
  add_test(NAME collectives_np${_np} COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_collectives>)
  set_tests_properties(collectives_np${_np} PROPERTIES LABELS "parallel;mpi" TIMEOUT 300)
endforeach()

# --- fault injection ---
add_executable(fault_injection fault_injection.cpp)
target_link_libraries(fault_injection PRIVATE dit_backend)
target_precompile_headers(fault_injection REUSE_FROM dit_backend)

# parallel_expect_failure.sh <limit_s> [--expect REGEX]... -- <command...>: passes when the command
# exits non-zero within limit_s seconds and its output matches every REGEX.
set(_dit_expect bash ${CMAKE_CURRENT_SOURCE_DIR}/parallel_expect_failure.sh)
set(_dit_fault $<TARGET_FILE:fault_injection>)
set(_dit_event_rank1 [=[@@DIT \{"event":"error","id":null,"rank":1,"message":"]=])

# Our own event line is the reliable channel: mpirun's "MPI_ABORT was invoked on rank R" help text
# is sometimes lost when the aborting process is killed mid-message (OpenMPI 4.1 show_help race),
# so the tests do not require it.
# (a) rank 1 throws before a collective; ranks 0 and 2 wait in allreduce.
add_test(NAME fault_throw COMMAND ${_dit_expect} 60
  --expect "${_dit_event_rank1}[^\"]*rank 1 throws before allreduce"
  --expect [=["fatal":true\}]=]
  -- ${DITSTUDIO_MPIRUN} -np 3 ${_dit_fault} throw)
# (b) rank 1 calls exit(3) mid-run while the others are blocked in allreduce.
add_test(NAME fault_exit COMMAND ${_dit_expect} 60
  --expect [=[Process name: \[(\[[0-9]+,[0-9]+\]|[^]@ ]+@[0-9]+),1\]]=]
  --expect [=[Exit code: +3]=]
  -- ${DITSTUDIO_MPIRUN} -np 3 ${_dit_fault} exit)
# (c) ranks disagree on an allgather size: every rank reports the mismatch.
add_test(NAME fault_mismatch COMMAND ${_dit_expect} 60
  --expect [=[@@DIT \{"event":"error","id":null,"rank":[01],"message":"collective mismatch on group 'world']=]
  --expect [=[rank 0: 4, rank 1: 5]=]
  --expect [=[rank 0 allgather\(float32 \[4\], 16 B, dim 0\)]=]
  -- ${DITSTUDIO_MPIRUN} -np 2 ${_dit_fault} mismatch)
# (d) rank 1 reads a truncated safetensors file while the others wait in a barrier.
add_test(NAME fault_corrupt_file COMMAND ${_dit_expect} 60
  --expect "${_dit_event_rank1}[^\"]*dit_fault_corrupt_[0-9]+\\.safetensors: [^\"]*truncated"
  -- ${DITSTUDIO_MPIRUN} -np 3 ${_dit_fault} corrupt)
# (e) rank 1 hangs outside any collective: rank 0's allreduce times out (3 s) naming rank 1.
add_test(NAME fault_timeout COMMAND ${_dit_expect} 60
  --expect [=[@@DIT \{"event":"error","id":null,"rank":0,"message":"collective timeout: allreduce]=]
  --expect [=[rank\(s\) 1 \(world 1\) never arrived]=]
  -- ${DITSTUDIO_MPIRUN} -np 2 -x DITSTUDIO_COLLECTIVE_TIMEOUT_S=3 ${_dit_fault} hang)
set_tests_properties(fault_throw fault_exit fault_mismatch fault_corrupt_file fault_timeout
  PROPERTIES LABELS "parallel;mpi;fault" TIMEOUT 90)

# Control: the same program without a fault exits 0 (the wrapper is not fooled by a crash-free run).
add_test(NAME fault_none COMMAND ${DITSTUDIO_MPIRUN} -np 2 ${_dit_fault} none)
set_tests_properties(fault_none PROPERTIES LABELS "parallel;mpi;fault" TIMEOUT 90
  PASS_REGULAR_EXPRESSION "fault_injection: rank 0 finished without a fault")

# --- layering (ARCHITECTURE.md): no model layer names in parallel/, no backend/ui includes there,
# no Torch/MPI headers in ui/ ---
add_test(NAME layering COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/layering_check.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(layering PROPERTIES LABELS "unit;parallel" TIMEOUT 60)
add_test(NAME layering_selftest COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/layering_selftest.sh
  ${CMAKE_CURRENT_SOURCE_DIR}/layering_check.sh)
set_tests_properties(layering_selftest PROPERTIES LABELS "unit;parallel" TIMEOUT 60)
