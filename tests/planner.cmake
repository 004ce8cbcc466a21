# Issue 47: the placement planner and `ditstudio-cli plan` (Torch-free planner; the CLI run on the
# known FLUX.2 [dev] config and on tiny-flux2dev-A): its figures against the one memory model.
add_executable(test_placement_planner test_placement_planner.cpp)
target_link_libraries(test_placement_planner PRIVATE dit_backend_core GTest::gtest GTest::gtest_main)
target_compile_definitions(test_placement_planner PRIVATE
  DITSTUDIO_TEST_DATA="${DITSTUDIO_TEST_DATA}" DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>")
add_dependencies(test_placement_planner ditstudio-cli)
gtest_add_tests(TARGET test_placement_planner TEST_LIST _planner_tests)
set_tests_properties(${_planner_tests} PROPERTIES LABELS "backend;planner;unit" TIMEOUT 120)
