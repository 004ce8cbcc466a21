# Strategy parity: each strategy launched through ditstudio-cli/mpirun against the goldens.
add_executable(test_strategies test_strategies.cpp)
target_link_libraries(test_strategies PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_strategies PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>")
target_precompile_headers(test_strategies REUSE_FROM dit_backend)
add_dependencies(test_strategies ditstudio-cli ditstudio-worker)
# One ctest entry per strategy (names as in INSTANTIATE_TEST_SUITE_P in test_strategies.cpp).
set(_strategy_cases tp2 tp2_odd tp4 ring2 ring4 ulysses2 ulysses4 unified2x2 ulysses_anything2
    ulysses_anything4 ulysses_anything3_heads ring_anything2 ring_anything4
    ulysses_anything4_text47 ring_anything4_text47 tp2_ulysses2 tp2_ring2 cfg2 cfg2_tp2
    tp2_te_own_rank ulysses2_te_once cfg2_tp2_te_own_rank)
foreach(_c IN LISTS _strategy_cases)
  dit_gtest_filter_test(strategy_${_c} test_strategies "Cpu/Strategies.MatchesSingleRank/${_c}"
                        "parallel;mpi;strategy" 240)
endforeach()
dit_gtest_filter_test(strategy_dp2 test_strategies "DataParallel.*" "parallel;mpi;strategy" 240)
dit_gtest_filter_test(strategy_strict_refusals test_strategies "StrictModes.*"
                      "parallel;mpi;strategy" 240)

# Failure handling of the real process group (fault injection through the worker).
add_executable(test_worker_faults test_worker_faults.cpp)
target_link_libraries(test_worker_faults PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_worker_faults PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>")
target_precompile_headers(test_worker_faults REUSE_FROM dit_backend)
add_dependencies(test_worker_faults ditstudio-cli ditstudio-worker)
gtest_add_tests(TARGET test_worker_faults TEST_LIST _fault_tests)
set_tests_properties(${_fault_tests} PROPERTIES LABELS "parallel;mpi;fault" TIMEOUT 150)

# Malformed requests: error events, the group keeps serving.
add_test(NAME worker_bad_requests COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/worker_protocol_check.sh
         ${MPIEXEC_PROGRAM} $<TARGET_FILE:ditstudio-worker> ${DITSTUDIO_FIXTURE})
set_tests_properties(worker_bad_requests PROPERTIES LABELS "parallel;mpi;errors" TIMEOUT 150)

# Issue 11 through the real CLI (1 and 2 ranks): seeds, checks at the door, true CFG with an
# empty negative prompt (extra_runs golden), warnings, no overwrite, memory estimate.
add_executable(test_cli_requests test_cli_requests.cpp)
target_link_libraries(test_cli_requests PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_cli_requests PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>" DITSTUDIO_MAKE_MODEL="$<TARGET_FILE:ditstudio-make-model>")
target_compile_options(test_cli_requests PRIVATE -Wall -Wextra)
target_precompile_headers(test_cli_requests REUSE_FROM dit_backend)
add_dependencies(test_cli_requests ditstudio-cli ditstudio-worker ditstudio-make-model)
gtest_add_tests(TARGET test_cli_requests TEST_LIST _cli_request_tests)
set_tests_properties(${_cli_request_tests} PROPERTIES LABELS "errors;protocol;golden;mpi" TIMEOUT 240)

# Issue 14 under the strategies: img2img, inpaint, First Block Cache, TaylorSeer (ditstudio-cli).
add_executable(test_strategies_i2i test_strategies_i2i.cpp)
target_link_libraries(test_strategies_i2i PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_strategies_i2i PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>")
target_precompile_headers(test_strategies_i2i REUSE_FROM dit_backend)
add_dependencies(test_strategies_i2i ditstudio-cli ditstudio-worker)
set(_i2i_cases img2img_ulysses2 img2img_ring2 img2img_tp2 inpaint_ulysses2 inpaint_ring2
    inpaint_tp2 fbcache037_ulysses2 fbcache037_ring2 fbcache037_tp2 fbcache054_ring2
    fbcache054_ulysses2_tp2 taylorseer_o2_ulysses2 taylorseer_o1_ring2 taylorseer_o2_tp2
    taylorseer_lite_ring2 taylorseer_lite_tp2 img2img_cfg2 inpaint_cfg2 fbcache037_cfg2
    taylorseer_o2_cfg2)
foreach(_c IN LISTS _i2i_cases)
  dit_gtest_filter_test(strategy_i2i_${_c} test_strategies_i2i
    "Cpu/StrategiesI2I.MatchesSingleRank/${_c}" "parallel;mpi;strategy;pipelines" 240)
endforeach()

# Issue 14 bad input through the worker group: clear errors, the group keeps serving.
add_test(NAME worker_i2i_bad_inputs COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/worker_i2i_check.sh
         ${MPIEXEC_PROGRAM} $<TARGET_FILE:ditstudio-worker> ${DITSTUDIO_FIXTURE})
set_tests_properties(worker_i2i_bad_inputs PROPERTIES LABELS "parallel;mpi;errors;pipelines" TIMEOUT 200)

# Issue 16: the fuzz suite (seeded: request lines, safetensors headers, configs, output-path
# faults, bad lines to live 1- and 2-rank groups) and the group's exposure and liveness checks.
add_executable(test_fuzz test_fuzz.cpp)
target_link_libraries(test_fuzz PRIVATE dit_backend dit_protocol dit_launcher GTest::gtest GTest::gtest_main)
target_compile_definitions(test_fuzz PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_WORKER="$<TARGET_FILE:ditstudio-worker>" DITSTUDIO_MPIRUN="${MPIEXEC_PROGRAM}")
target_precompile_headers(test_fuzz REUSE_FROM dit_backend)
add_dependencies(test_fuzz ditstudio-worker ditstudio-isolate)
gtest_add_tests(TARGET test_fuzz TEST_LIST _fuzz_tests)
set_tests_properties(${_fuzz_tests} PROPERTIES LABELS "fuzz;security;errors" TIMEOUT 180)
foreach(t ${_fuzz_tests})
  if(t MATCHES "Exposure|Liveness|FuzzGroup")
    set_tests_properties(${t} PROPERTIES LABELS "fuzz;security;errors;mpi" PROCESSORS 2)
  endif()
endforeach()

# Issue 18: two hosts (network namespaces + veth + sshd), one rank each. Needs root and
# openssh-server (packaging/install-deps.sh); where namespaces cannot be created every case
# skips with the reason (GTEST_SKIP) and ctest reports the test skipped.
add_executable(test_multihost test_multihost.cpp)
target_link_libraries(test_multihost PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_multihost PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>")
target_precompile_headers(test_multihost REUSE_FROM dit_backend)
add_dependencies(test_multihost ditstudio-cli ditstudio-worker)
# The server's half (issue 45): ditstudio-server's hostfile group, put together by the same
# group start.
if(TARGET ditstudio-server)
  target_compile_definitions(test_multihost PRIVATE
    DITSTUDIO_SERVER="$<TARGET_FILE:ditstudio-server>")
  add_dependencies(test_multihost ditstudio-server)
endif()
# The GUI's half (issue 36): the main window driven against the same hostfile group.
if(DITSTUDIO_BUILD_GUI AND TARGET dit_ui)
  add_executable(multihost_gui_driver multihost_gui_driver.cpp)
  target_link_libraries(multihost_gui_driver PRIVATE dit_ui)
  target_compile_definitions(multihost_gui_driver PRIVATE
    DITSTUDIO_WORKER_PATH="$<TARGET_FILE:ditstudio-worker>")
  target_compile_definitions(test_multihost PRIVATE
    DITSTUDIO_GUI_DRIVER="$<TARGET_FILE:multihost_gui_driver>")
  add_dependencies(test_multihost multihost_gui_driver)
endif()
add_test(NAME multihost COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/multihost_env.sh
         ${DITSTUDIO_FIXTURE} $<TARGET_FILE:test_multihost>)
set_tests_properties(multihost PROPERTIES LABELS "multihost;mpi" TIMEOUT 600 PROCESSORS 2 RUN_SERIAL TRUE
                     SKIP_REGULAR_EXPRESSION "multihost: skipped: "
                     FAIL_REGULAR_EXPRESSION "Running 0 tests")
