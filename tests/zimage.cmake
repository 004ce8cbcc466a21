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
  DITSTUDIO_FIXTURE="${DITSTUDIO_TEST_DATA}/tiny-zimage-A" DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>")
target_precompile_headers(test_zimage_cli REUSE_FROM dit_backend)
add_dependencies(test_zimage_cli ditstudio-cli ditstudio-worker)
gtest_add_tests(TARGET test_zimage_cli TEST_LIST _zimage_cli_tests)
set_tests_properties(${_zimage_cli_tests} PROPERTIES LABELS "strategy;mpi;zimage" PROCESSORS 2 TIMEOUT 300)
