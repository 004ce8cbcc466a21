# Backend tests: golden parity with diffusers (tests/data/tiny-flux-A/golden) and model-file errors.
add_executable(test_golden test_golden.cpp)
target_link_libraries(test_golden PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_golden PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}")
target_precompile_headers(test_golden REUSE_FROM dit_backend)
add_test(NAME golden COMMAND test_golden)
set_tests_properties(golden PROPERTIES LABELS "backend;golden" ENVIRONMENT "OMP_NUM_THREADS=2")

add_executable(test_model_errors test_model_errors.cpp)
target_link_libraries(test_model_errors PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_model_errors PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}")
target_precompile_headers(test_model_errors REUSE_FROM dit_backend)
add_test(NAME model_errors COMMAND test_model_errors)
set_tests_properties(model_errors PROPERTIES LABELS "backend;errors;unit")

# Issue 48: every JSON file of each family's folder with a top level that is not an object (and
# a config declaring another component) is refused naming that file.
add_executable(test_config_guards test_config_guards.cpp)
target_link_libraries(test_config_guards PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_config_guards PRIVATE DITSTUDIO_TEST_DATA="${DITSTUDIO_TEST_DATA}"
  DITSTUDIO_SHARED_FIXTURES="${PROJECT_SOURCE_DIR}/../shared/fixtures")
target_precompile_headers(test_config_guards REUSE_FROM dit_backend)
gtest_add_tests(TARGET test_config_guards TEST_LIST _config_guard_tests)
set_tests_properties(${_config_guard_tests} PROPERTIES LABELS "backend;errors;security;unit"
                     TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")

# Other checkpoint shapes through the real CLI (sharded, bf16 on disk, no guidance, deeper VAE).
add_executable(test_checkpoint_variants test_checkpoint_variants.cpp)
target_link_libraries(test_checkpoint_variants PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_checkpoint_variants PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>" DITSTUDIO_MAKE_MODEL="$<TARGET_FILE:ditstudio-make-model>")
target_precompile_headers(test_checkpoint_variants REUSE_FROM dit_backend)
add_dependencies(test_checkpoint_variants ditstudio-cli ditstudio-make-model)
add_test(NAME checkpoint_variants COMMAND test_checkpoint_variants)
set_tests_properties(checkpoint_variants PROPERTIES LABELS "backend;variants" TIMEOUT 300)

# The FLUX.1 plan as the one truth: a rule changed in it changes validation, byte counts and the
# loaded shards together, and tp 2 still equals tp 1 (mpirun -np 2).
add_executable(test_flux_plan test_flux_plan.cpp)
target_link_libraries(test_flux_plan PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_flux_plan PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}")
target_precompile_headers(test_flux_plan REUSE_FROM dit_backend)
add_test(NAME flux_plan_np2 COMMAND ${DITSTUDIO_MPIRUN} -np 2 $<TARGET_FILE:test_flux_plan>)
set_tests_properties(flux_plan_np2 PROPERTIES LABELS "backend;parallel;mpi;strategy" PROCESSORS 2 TIMEOUT 300
  ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")

# Issue 14: img2img, inpaint, VAE encoder + preprocessing, step caching (tiny-flux-A/pipelines).
add_executable(test_pipelines test_pipelines.cpp)
target_link_libraries(test_pipelines PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_pipelines PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}")
target_precompile_headers(test_pipelines REUSE_FROM dit_backend)
gtest_add_tests(TARGET test_pipelines TEST_LIST _pipeline_tests)
set_tests_properties(${_pipeline_tests} PROPERTIES LABELS "backend;golden;pipelines"
                     ENVIRONMENT "OMP_NUM_THREADS=2")

# Issue 16: untrusted model files and outputs (regular files only, index shards inside the
# folder, header limits, non-finite weights, config schema and tensors, safe output writes).
add_executable(test_security test_security.cpp)
target_link_libraries(test_security PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_security PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}")
target_precompile_headers(test_security REUSE_FROM dit_backend)
gtest_add_tests(TARGET test_security TEST_LIST _security_tests)
set_tests_properties(${_security_tests} PROPERTIES LABELS "backend;errors;security;unit" TIMEOUT 120)

# Issue 17: FLUX.2 [klein] transformer against tests/data/tiny-flux2-A (diffusers goldens) and
# its declared plans under tp / ulysses / ring (one binary: 1, 2 and 4 ranks).
add_executable(test_flux2 test_flux2.cpp)
target_link_libraries(test_flux2 PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_flux2 PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-flux2-A")
target_precompile_headers(test_flux2 REUSE_FROM dit_backend)
add_test(NAME flux2_transformer COMMAND ${DITSTUDIO_MPIRUN} -np 1 $<TARGET_FILE:test_flux2>)
set_tests_properties(flux2_transformer PROPERTIES LABELS "backend;golden;flux2" TIMEOUT 300)
foreach(_np 2 4)
  add_test(NAME flux2_strategies_np${_np}
           COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_flux2>)
  set_tests_properties(flux2_strategies_np${_np} PROPERTIES
    LABELS "backend;parallel;mpi;strategy;flux2" PROCESSORS 2 TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()

# FLUX.2 step caching through the shared DiT driver (First Block Cache, TaylorSeer, lite): one
# rank, then ulysses 2 and tp 2 equal to one rank with the same decisions on every rank.
add_executable(test_flux2_step_cache test_flux2_step_cache.cpp)
target_link_libraries(test_flux2_step_cache PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_flux2_step_cache PRIVATE
  DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-flux2-A")
target_precompile_headers(test_flux2_step_cache REUSE_FROM dit_backend)
foreach(_np 1 2)
  add_test(NAME flux2_step_cache_np${_np}
           COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_flux2_step_cache>)
  set_tests_properties(flux2_step_cache_np${_np} PROPERTIES
    LABELS "backend;parallel;mpi;strategy;flux2;cache" PROCESSORS ${_np} TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()

# Issue 46, computed once: FLUX.2 [klein] KV modes (Flux2KVCache) against diffusers'
# Flux2KleinKVPipeline (tests/data/tiny-flux2-kv-A/golden/kv.safetensors), cached = uncached on
# one rank and under tp 2 / ulysses 2 / ring 2 (2 ranks) and tp 2 x ulysses 2 / ring x ulysses (4).
add_executable(test_flux2_kv test_flux2_kv.cpp)
target_link_libraries(test_flux2_kv PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_flux2_kv PRIVATE
  DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-flux2-kv-A")
target_precompile_headers(test_flux2_kv REUSE_FROM dit_backend)
foreach(_np 1 2 4)
  add_test(NAME flux2_kv_np${_np}
           COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_flux2_kv>)
  set_tests_properties(flux2_kv_np${_np} PROPERTIES
    LABELS "backend;golden;parallel;mpi;strategy;flux2" PROCESSORS 2 TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()

# FLUX.2 end to end through ditstudio-cli / mpirun + ditstudio-worker (every strategy, dp 2).
add_executable(test_flux2_cli test_flux2_cli.cpp)
target_link_libraries(test_flux2_cli PRIVATE dit_app GTest::gtest GTest::gtest_main)
target_compile_definitions(test_flux2_cli PRIVATE
  DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-flux2-A" DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>"
  DITSTUDIO_FLUX1_LORA="${DITSTUDIO_TEST_DATA}/tiny-flux-A/lora/lora-diffusers.safetensors")
target_precompile_headers(test_flux2_cli REUSE_FROM dit_backend)
add_dependencies(test_flux2_cli ditstudio-cli ditstudio-worker)
gtest_add_tests(TARGET test_flux2_cli TEST_LIST _flux2_cli_tests)
set_tests_properties(${_flux2_cli_tests} PROPERTIES LABELS "strategy;mpi;flux2" PROCESSORS 2 TIMEOUT 240)

# Issue 31: Qwen-Image against tests/data/tiny-qwenimage-A (diffusers goldens): tokenizer and
# template, Qwen2.5-VL text encoder, transformer, AutoencoderKLQwenImage, scheduler, whole runs.
add_executable(test_qwenimage test_qwenimage.cpp)
target_link_libraries(test_qwenimage PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_qwenimage PRIVATE
  DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-qwenimage-A")
target_precompile_headers(test_qwenimage REUSE_FROM dit_backend)
gtest_add_tests(TARGET test_qwenimage TEST_LIST _qwenimage_tests TEST_PREFIX "qwenimage.")
set_tests_properties(${_qwenimage_tests} PROPERTIES LABELS "backend;golden;qwenimage" TIMEOUT 300)
unset(_qwenimage_tests)

# Qwen-Image through ditstudio-cli: one rank and tp / ulysses / ring / cfg / dp over mpirun.
add_executable(test_qwenimage_cli test_qwenimage_cli.cpp)
target_link_libraries(test_qwenimage_cli PRIVATE dit_app GTest::gtest GTest::gtest_main)
target_compile_definitions(test_qwenimage_cli PRIVATE
  DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-qwenimage-A" DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>"
  DITSTUDIO_MAKE_MODEL="$<TARGET_FILE:ditstudio-make-model>")
target_precompile_headers(test_qwenimage_cli REUSE_FROM dit_backend)
add_dependencies(test_qwenimage_cli ditstudio-cli ditstudio-worker ditstudio-make-model)
gtest_add_tests(TARGET test_qwenimage_cli TEST_LIST _qwenimage_cli_tests)
set_tests_properties(${_qwenimage_cli_tests} PROPERTIES LABELS "strategy;mpi;qwenimage" PROCESSORS 2 TIMEOUT 240)
unset(_qwenimage_cli_tests)

# Qwen-Image's declared tp / cp plans: every case a strategy allows equals one rank.
add_executable(test_qwenimage_strategies test_qwenimage_strategies.cpp)
target_link_libraries(test_qwenimage_strategies PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_qwenimage_strategies PRIVATE
  DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-qwenimage-A")
target_precompile_headers(test_qwenimage_strategies REUSE_FROM dit_backend)
foreach(_np 1 2 4)
  add_test(NAME qwenimage_strategies_np${_np}
           COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_qwenimage_strategies>)
  set_tests_properties(qwenimage_strategies_np${_np} PROPERTIES
    LABELS "backend;parallel;mpi;strategy;qwenimage" PROCESSORS 2 TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()

# The declared request of each family (RequestSpec), resolveRequest's rules, and the docs' family
# tables equal to the specs (Torch-free).
add_executable(test_request_spec test_request_spec.cpp)
target_link_libraries(test_request_spec PRIVATE dit_backend_core GTest::gtest GTest::gtest_main)
target_compile_definitions(test_request_spec PRIVATE DITSTUDIO_TEST_DATA="${DITSTUDIO_TEST_DATA}"
                           DITSTUDIO_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_compile_options(test_request_spec PRIVATE -Wall -Wextra)
gtest_add_tests(TARGET test_request_spec TEST_LIST _request_spec_tests)
set_tests_properties(${_request_spec_tests} PROPERTIES LABELS "backend;errors;unit")

# Image files the CLI, the window and the workers read: cut-short files and malformed JPEG Huffman
# tables refused naming the file (backend/io/image_check, shared with the server; Torch-free).
add_executable(test_image_files test_image_files.cpp)
target_link_libraries(test_image_files PRIVATE dit_backend_core GTest::gtest GTest::gtest_main)
target_include_directories(test_image_files SYSTEM PRIVATE ${STB_INCLUDE_DIR})
target_compile_options(test_image_files PRIVATE -Wall -Wextra)
gtest_add_tests(TARGET test_image_files TEST_LIST _image_files_tests)
set_tests_properties(${_image_files_tests} PROPERTIES LABELS "backend;security;unit")
