# LoRA (issue 13): file formats and the diffusers goldens (one process), tensor parallel at the
# transformer level (mpirun -np 2 / 4), strategies and request switching through the real CLI /
# worker.
add_executable(test_lora test_lora.cpp)
target_link_libraries(test_lora PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_lora PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}")
target_precompile_headers(test_lora REUSE_FROM dit_backend)
gtest_add_tests(TARGET test_lora TEST_LIST _lora_tests)
set_tests_properties(${_lora_tests} PROPERTIES LABELS "backend;golden;lora" TIMEOUT 120
                     ENVIRONMENT "OMP_NUM_THREADS=2")

# Strategies with LoRAs against the one-rank run, and request switching in one worker group.
add_executable(test_lora_strategies test_lora_strategies.cpp)
target_link_libraries(test_lora_strategies PRIVATE dit_app GTest::gtest GTest::gtest_main)
target_compile_definitions(test_lora_strategies PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>" DITSTUDIO_WORKER="$<TARGET_FILE:ditstudio-worker>"
  DITSTUDIO_MPIRUN="${MPIEXEC_PROGRAM}")
target_precompile_headers(test_lora_strategies REUSE_FROM dit_backend)
add_dependencies(test_lora_strategies ditstudio-cli ditstudio-worker)
foreach(_c tp2 tp4 ulysses2 ring2 cfg2 dp2)
  dit_gtest_filter_test(lora_strategy_${_c} test_lora_strategies "Cpu/LoraStrategies.*/${_c}"
                        "parallel;mpi;strategy;lora" 300)
endforeach()
dit_gtest_filter_test(lora_worker_switching test_lora_strategies "LoraWorker.*"
                      "parallel;mpi;lora;errors" 600)
# Issue 35: non-finite LoRA factors / overflowing scales through the CLI (1 rank) and a tp 2
# worker, directory and FIFO LoRA paths named.
dit_gtest_filter_test(lora_nonfinite test_lora_strategies "LoraNonFinite.*"
                      "parallel;mpi;lora;errors;security" 300)
dit_gtest_filter_test(lora_cache_budget test_lora_strategies "LoraCache.*" "backend;lora" 120)

# Tensor parallel at the transformer level: tp 2 / tp 4 with LoRAs equal tp 1, each rank holding
# only its slices (bytes per rank asserted).
add_executable(test_lora_tp test_lora_tp.cpp)
target_link_libraries(test_lora_tp PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_lora_tp PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}")
target_precompile_headers(test_lora_tp REUSE_FROM dit_backend)
foreach(_np 2 4)
  add_test(NAME lora_tp_np${_np} COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_lora_tp>)
  set_tests_properties(lora_tp_np${_np} PROPERTIES LABELS "backend;parallel;mpi;lora"
    PROCESSORS ${_np} TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()

# The request field "loras" (Torch-free protocol library).
add_executable(test_lora_protocol test_lora_protocol.cpp)
target_link_libraries(test_lora_protocol PRIVATE dit_protocol GTest::gtest GTest::gtest_main)
add_test(NAME lora_protocol COMMAND test_lora_protocol)
set_tests_properties(lora_protocol PROPERTIES LABELS "unit;protocol;lora")
