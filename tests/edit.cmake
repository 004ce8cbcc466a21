# Issue 46: reference-image editing (Flux2KleinPipeline(image=[...]), FluxKontextPipeline) against
# diffusers' goldens from the prompt text: one rank (with the references' own latents and ids),
# then tp 2, ulysses 2, ring 2 (and their anything modes where a length does not divide), cfg 2
# (the runs with CFG) on 2 ranks, ring 2 x ulysses 2 and tp 2 x ulysses 2 on 4.
add_executable(test_edit test_edit.cpp)
target_link_libraries(test_edit PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_edit PRIVATE DITSTUDIO_TEST_DATA="${DITSTUDIO_TEST_DATA}"
  DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-flux2-A")
target_precompile_headers(test_edit REUSE_FROM dit_backend)
add_test(NAME edit_goldens COMMAND ${DITSTUDIO_MPIRUN} -np 1 $<TARGET_FILE:test_edit>)
set_tests_properties(edit_goldens PROPERTIES LABELS "backend;golden;edit" TIMEOUT 300
  ENVIRONMENT "OMP_NUM_THREADS=1")
foreach(_np 2 4)
  add_test(NAME edit_strategies_np${_np} COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_edit>)
  set_tests_properties(edit_strategies_np${_np} PROPERTIES
    LABELS "backend;parallel;mpi;strategy;edit" PROCESSORS 2 TIMEOUT 600
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()
# Issue 46's bad inputs through ditstudio-cli (not an image, truncated, a 20000 x 20000 header,
# too many, a model that takes none, Kontext's one, too small, with an init image, missing, a
# Kontext folder without its class): each refused naming the file or field, nothing written.
add_test(NAME edit_bad_inputs COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/edit_bad_inputs.sh
         $<TARGET_FILE:ditstudio-cli> ${DITSTUDIO_TEST_DATA})
set_tests_properties(edit_bad_inputs PROPERTIES LABELS "errors;edit" TIMEOUT 120)
