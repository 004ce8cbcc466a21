# Backend tests: golden parity with diffusers (tests/data/tiny-flux-A/golden) and model-file errors.
add_executable(test_golden test_golden.cpp)
target_link_libraries(test_golden PRIVATE dit_engine GTest::gtest GTest::gtest_main)
target_compile_definitions(test_golden PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}")
target_precompile_headers(test_golden REUSE_FROM dit_engine)
add_test(NAME golden COMMAND test_golden)
set_tests_properties(golden PROPERTIES LABELS "backend;golden" ENVIRONMENT "OMP_NUM_THREADS=2")

add_executable(test_model_errors test_model_errors.cpp)
target_link_libraries(test_model_errors PRIVATE dit_engine GTest::gtest GTest::gtest_main)
target_compile_definitions(test_model_errors PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}")
target_precompile_headers(test_model_errors REUSE_FROM dit_engine)
add_test(NAME model_errors COMMAND test_model_errors)
set_tests_properties(model_errors PROPERTIES LABELS "backend;errors;unit")
