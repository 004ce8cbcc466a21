# Tiled VAE decode (issue 47, "Big images"): diffusers' tiled_decode goldens (tests/data/vae-tiling)
# on one rank, and the tiles shared out over 2 and 4 MPI ranks, equal to one rank exactly.
add_executable(test_vae_tiling ${CMAKE_CURRENT_LIST_DIR}/test_vae_tiling.cpp)
target_link_libraries(test_vae_tiling PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_vae_tiling PRIVATE DITSTUDIO_TEST_DATA="${DITSTUDIO_TEST_DATA}")
target_precompile_headers(test_vae_tiling REUSE_FROM dit_backend)
dit_gtest_filter_test(vae_tiling test_vae_tiling "VaeTiling.*" "unit;backend;golden" 300)
foreach(_np 2 4)
  add_test(NAME vae_tiling_np${_np}
           COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_vae_tiling>
                   --gtest_filter=VaeTilingRanks.*)
  set_tests_properties(vae_tiling_np${_np} PROPERTIES
    LABELS "parallel;mpi" PROCESSORS ${_np} TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()
# ditstudio-vae-bench (the decode memory per rank, docs/planner.md) still runs: a narrow VAE, 3 x 3
# tiles of 64 px shared by 2 ranks (seconds), its JSON names every rank's decode peak.
if(TARGET ditstudio-vae-bench)
  add_test(NAME vae_bench_smoke_np2
           COMMAND ${DITSTUDIO_MPIRUN} -np 2 $<TARGET_FILE:ditstudio-vae-bench>
                   --block-out-channels 32,32,32,32 --width 128 --height 128 --tile 64)
  set_tests_properties(vae_bench_smoke_np2 PROPERTIES
    LABELS "bench;mpi" PROCESSORS 2 TIMEOUT 120
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120"
    PASS_REGULAR_EXPRESSION "\"max_decode_peak_bytes\": [1-9]")
endif()
