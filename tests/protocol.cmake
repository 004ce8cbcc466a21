# dit_protocol (app/protocol/): requests, events, seeds, strategy JSON and flags, mpirun line and
# failure parsing. Torch-free and Qt-free, so it builds and runs in seconds.
add_executable(test_protocol ${CMAKE_CURRENT_LIST_DIR}/test_protocol.cpp)
target_link_libraries(test_protocol PRIVATE dit_protocol dit_launcher CLI11::CLI11 GTest::gtest GTest::gtest_main)
target_compile_options(test_protocol PRIVATE -Wall -Wextra)
add_test(NAME protocol COMMAND test_protocol)
set_tests_properties(protocol PROPERTIES LABELS "unit;protocol")

# Issue 14 request fields (init image, mask, strength, cache).
add_executable(test_protocol_i2i ${CMAKE_CURRENT_LIST_DIR}/test_protocol_i2i.cpp)
target_link_libraries(test_protocol_i2i PRIVATE dit_protocol GTest::gtest GTest::gtest_main)
target_compile_options(test_protocol_i2i PRIVATE -Wall -Wextra)
add_test(NAME protocol_i2i COMMAND test_protocol_i2i)
set_tests_properties(protocol_i2i PROPERTIES LABELS "unit;protocol;pipelines")
