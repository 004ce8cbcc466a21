# dit_launcher (app/launcher/): GroupProcess (process group, line streams, the teardown policy
# with a child that ignores SIGTERM and a grandchild in a session of its own), WorkerSession (state
# machine, queue, cancel, fatal-event dedup, failure attribution) against a scripted bash worker,
# and the typed events of dit_protocol (same JSON as the worker wrote before). Torch-free: builds
# and runs in seconds.
add_executable(test_launcher ${CMAKE_CURRENT_LIST_DIR}/test_launcher.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_events.cpp)
target_link_libraries(test_launcher PRIVATE dit_launcher GTest::gtest GTest::gtest_main)
target_compile_options(test_launcher PRIVATE -Wall -Wextra)
gtest_add_tests(TARGET test_launcher TEST_LIST _launcher_tests)
set_tests_properties(${_launcher_tests} PROPERTIES LABELS "unit;protocol;launcher" TIMEOUT 60)

# parallel/runtime's default event and fatal lines (for programs without the protocol) equal the
# protocol's, which the worker installs: the copy cannot drift.
add_executable(test_runtime_lines ${CMAKE_CURRENT_LIST_DIR}/test_runtime_lines.cpp)
target_link_libraries(test_runtime_lines PRIVATE dit_parallel dit_protocol GTest::gtest GTest::gtest_main)
target_compile_options(test_runtime_lines PRIVATE -Wall -Wextra)
add_test(NAME runtime_lines COMMAND test_runtime_lines)
set_tests_properties(runtime_lines PROPERTIES LABELS "unit;protocol;parallel" TIMEOUT 60)
