# Strategy parity: each strategy launched through ditstudio-cli/mpirun against the goldens.
add_executable(test_strategies test_strategies.cpp)
target_link_libraries(test_strategies PRIVATE dit_engine GTest::gtest GTest::gtest_main)
target_compile_definitions(test_strategies PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>")
target_precompile_headers(test_strategies REUSE_FROM dit_engine)
add_dependencies(test_strategies ditstudio-cli ditstudio-worker)
gtest_add_tests(TARGET test_strategies TEST_LIST _strategy_tests)
set_tests_properties(${_strategy_tests} PROPERTIES LABELS "parallel;mpi;strategy" TIMEOUT 240)

# Failure handling of the real process group (fault injection through the worker).
add_executable(test_worker_faults test_worker_faults.cpp)
target_link_libraries(test_worker_faults PRIVATE dit_engine GTest::gtest GTest::gtest_main)
target_compile_definitions(test_worker_faults PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>")
target_precompile_headers(test_worker_faults REUSE_FROM dit_engine)
add_dependencies(test_worker_faults ditstudio-cli ditstudio-worker)
gtest_add_tests(TARGET test_worker_faults TEST_LIST _fault_tests)
set_tests_properties(${_fault_tests} PROPERTIES LABELS "parallel;mpi;fault" TIMEOUT 150)
