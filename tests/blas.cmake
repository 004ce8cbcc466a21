# BLAS kernel selection (app/common/blas_kernel.h): pure policy + self-check (unit), and the start-up
# re-execution under three environments (the selection each must produce: see the test's header).
add_executable(test_blas_kernel test_blas_kernel.cpp)
target_link_libraries(test_blas_kernel PRIVATE dit_app GTest::gtest)
add_test(NAME blas_kernel COMMAND test_blas_kernel)
set_tests_properties(blas_kernel PROPERTIES LABELS "unit;blas" TIMEOUT 60
  ENVIRONMENT "OPENBLAS_CORETYPE=;DITSTUDIO_BLAS_AUTO=;DITSTUDIO_BLAS_ASSUME_DETECTED=;DITSTUDIO_OMP_SPIN=")
function(dit_blas_select_test mode)
  add_test(NAME blas_select_${mode} COMMAND test_blas_kernel --gtest_filter=BlasKernel.SelectionAtStartUp)
  set_tests_properties(blas_select_${mode} PROPERTIES LABELS "unit;blas" TIMEOUT 60
    ENVIRONMENT "DITSTUDIO_TEST_EXPECT=${mode};${ARGN}")
endfunction()
dit_blas_select_test(assume-prescott DITSTUDIO_BLAS_ASSUME_DETECTED=Prescott OPENBLAS_CORETYPE= DITSTUDIO_BLAS_AUTO=)
dit_blas_select_test(user OPENBLAS_CORETYPE=Prescott DITSTUDIO_BLAS_AUTO= DITSTUDIO_BLAS_ASSUME_DETECTED=)
dit_blas_select_test(spin-two OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS= GOMP_SPINCOUNT= OMP_WAIT_POLICY= DITSTUDIO_OMP_SPIN= OPENBLAS_CORETYPE= DITSTUDIO_BLAS_AUTO= DITSTUDIO_BLAS_ASSUME_DETECTED=)
dit_blas_select_test(spin-marker-only OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS= GOMP_SPINCOUNT= OMP_WAIT_POLICY= DITSTUDIO_OMP_SPIN=10000 OPENBLAS_CORETYPE= DITSTUDIO_BLAS_AUTO= DITSTUDIO_BLAS_ASSUME_DETECTED=)
dit_blas_select_test(spin-user OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS= GOMP_SPINCOUNT=5 OMP_WAIT_POLICY= DITSTUDIO_OMP_SPIN= OPENBLAS_CORETYPE= DITSTUDIO_BLAS_AUTO= DITSTUDIO_BLAS_ASSUME_DETECTED=)
dit_blas_select_test(bad-auto DITSTUDIO_BLAS_AUTO=NoSuchCore OPENBLAS_CORETYPE=NoSuchCore DITSTUDIO_BLAS_ASSUME_DETECTED=)
