# FLUX.2 [dev] (Flux2Pipeline, issue 47) against tests/data/tiny-flux2dev-A: the Mistral text side
# (MistralTokenizer, the Mistral decoder, the stacked prompt embeddings).
set(_flux2dev_fixture "${DITSTUDIO_TEST_DATA}/tiny-flux2dev-A")
add_executable(test_mistral ${CMAKE_CURRENT_LIST_DIR}/test_mistral.cpp)
target_link_libraries(test_mistral PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_mistral PRIVATE DITSTUDIO_FIXTURE="${_flux2dev_fixture}")
gtest_add_tests(TARGET test_mistral SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mistral.cpp
                TEST_LIST _mistral_tests TEST_PREFIX "mistral.")
set_tests_properties(${_mistral_tests} PROPERTIES LABELS "unit;backend;golden;flux2" TIMEOUT 300)
unset(_mistral_tests)

# The pipeline (Flux2Pipeline through the FLUX.2 family): transformer with the guidance embedding,
# the schedule, the three runs from embeddings and from the prompt on one rank; tp 2, ulysses 2,
# ring 2 (2 ranks), tp 2 x ulysses 2 and the text encoder at tp 4 (4 ranks).
add_executable(test_flux2dev ${CMAKE_CURRENT_LIST_DIR}/test_flux2dev.cpp)
target_link_libraries(test_flux2dev PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_flux2dev PRIVATE
  DITSTUDIO_FIXTURE="${_flux2dev_fixture}")
target_precompile_headers(test_flux2dev REUSE_FROM dit_backend)
add_test(NAME flux2dev_np1 COMMAND ${DITSTUDIO_MPIRUN} -np 1 $<TARGET_FILE:test_flux2dev>)
set_tests_properties(flux2dev_np1 PROPERTIES LABELS "backend;golden;flux2" TIMEOUT 300)
foreach(_np 2 4)
  add_test(NAME flux2dev_strategies_np${_np}
           COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_flux2dev>)
  set_tests_properties(flux2dev_strategies_np${_np} PROPERTIES
    LABELS "backend;golden;parallel;mpi;strategy;flux2" PROCESSORS 2 TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()
# Issue 47: the text encoder on one rank of a 3-rank group (Ulysses 3, anything), its
# embeddings broadcast (the 1- and 2-rank placement cases run in flux2dev_np1 / _np2).
add_test(NAME flux2dev_placement_np3
         COMMAND ${DITSTUDIO_MPIRUN} -np 3 $<TARGET_FILE:test_flux2dev>
                 --gtest_filter=Flux2DevPlacement.*)
set_tests_properties(flux2dev_placement_np3 PROPERTIES
  LABELS "backend;golden;parallel;mpi;strategy;flux2" PROCESSORS 2 TIMEOUT 300
  ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
unset(_flux2dev_fixture)

# Through ditstudio-cli (in-process and mpirun + ditstudio-worker): run 0 on one rank, tp 2,
# ulysses 2, ring 2, tp 2 x ulysses 2; the negative prompt's note and the cfg 2 refusal.
add_executable(test_flux2dev_cli ${CMAKE_CURRENT_LIST_DIR}/test_flux2dev_cli.cpp)
target_link_libraries(test_flux2dev_cli PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_flux2dev_cli PRIVATE
  DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-flux2dev-A" DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>")
target_precompile_headers(test_flux2dev_cli REUSE_FROM dit_backend)
add_dependencies(test_flux2dev_cli ditstudio-cli ditstudio-worker)
gtest_add_tests(TARGET test_flux2dev_cli TEST_LIST _flux2dev_cli_tests)
set_tests_properties(${_flux2dev_cli_tests} PROPERTIES LABELS "strategy;mpi;flux2" PROCESSORS 2 TIMEOUT 240)
unset(_flux2dev_cli_tests)
