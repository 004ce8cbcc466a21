# Issue 31: Z-Image (ZImagePipeline + ZImageTransformer2DModel) against tests/data/tiny-zimage-A
# (diffusers goldens) and its declared plans under every strategy (one binary: 1 to 4 ranks), and
# whole runs through ditstudio-cli.
add_executable(test_zimage test_zimage.cpp)
target_link_libraries(test_zimage PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_zimage PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-zimage-A")
target_precompile_headers(test_zimage REUSE_FROM dit_backend)
add_test(NAME zimage_golden COMMAND ${DITSTUDIO_MPIRUN} -np 1 $<TARGET_FILE:test_zimage>)
set_tests_properties(zimage_golden PROPERTIES LABELS "backend;golden;zimage" TIMEOUT 300)
foreach(_np 2 3 4)
  add_test(NAME zimage_strategies_np${_np}
           COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_zimage>)
  set_tests_properties(zimage_strategies_np${_np} PROPERTIES
    LABELS "backend;parallel;mpi;strategy;zimage" PROCESSORS 2 TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()

# The four whole runs and the strategies through ditstudio-cli (--output-tensors).
add_executable(test_zimage_cli test_zimage_cli.cpp)
target_link_libraries(test_zimage_cli PRIVATE dit_app GTest::gtest GTest::gtest_main)
target_compile_definitions(test_zimage_cli PRIVATE
  DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-zimage-A" DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>"
  DITSTUDIO_TEST_DATA_DIR="${DITSTUDIO_TEST_DATA}")
target_precompile_headers(test_zimage_cli REUSE_FROM dit_backend)
add_dependencies(test_zimage_cli ditstudio-cli ditstudio-worker)
gtest_add_tests(TARGET test_zimage_cli TEST_LIST _zimage_cli_tests)
set_tests_properties(${_zimage_cli_tests} PROPERTIES LABELS "strategy;mpi;zimage" PROCESSORS 2 TIMEOUT 300)

# ditstudio-bench on Z-Image (tests/bench.cmake's checker): one rank with its step profile (the
# categories summing to the step), and tp / ulysses / ring 2 whose measured bytes per step equal
# the family's traffic model (padded to 32 rows).
set(_bench_zimage $<TARGET_FILE:ditstudio-bench> --model ${DITSTUDIO_TEST_DATA}/tiny-zimage-A
  --width 24 --height 40 --text-len 18 --steps 1 --warmup 0 --dtype float32)
list(JOIN _bench_zimage "|" _bench_zimage)
string(REPLACE ";" "|" _bench_zimage_mpirun "${DITSTUDIO_MPIRUN}")
set(_bench_zimage_check ${CMAKE_CURRENT_BINARY_DIR}/bench_check_json.cmake)  # tests/bench.cmake writes it
add_test(NAME bench_smoke_zimage_np1 COMMAND ${CMAKE_COMMAND} -DNP=1 -DPROFILE=1
  -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_zimage_np1.json
  "-DCMD=${_bench_zimage}|--profile|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_zimage_np1.json" -P ${_bench_zimage_check})
set_tests_properties(bench_smoke_zimage_np1 PROPERTIES LABELS "bench;zimage" TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=1")
foreach(_st tp ulysses ring)
  add_test(NAME bench_smoke_zimage_${_st}2 COMMAND ${CMAKE_COMMAND} -DNP=2 -DEXPECT_BYTES=1
    -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_zimage_${_st}2.json
    "-DCMD=${_bench_zimage_mpirun}|-np|2|${_bench_zimage}|--${_st}-degree|2|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_zimage_${_st}2.json" -P ${_bench_zimage_check})
  set_tests_properties(bench_smoke_zimage_${_st}2 PROPERTIES LABELS "bench;zimage" TIMEOUT 120
    PROCESSORS 2 ENVIRONMENT "OMP_NUM_THREADS=1")
endforeach()
unset(_bench_zimage)
unset(_bench_zimage_mpirun)
unset(_bench_zimage_check)
