# test_tokenizers: CLIPTokenizer / T5Tokenizer against the tiny-flux-A goldens (torch-free).
if(NOT TARGET GTest::gtest_main)
  find_package(GTest REQUIRED)
endif()
include(GoogleTest)

if(DEFINED DITSTUDIO_FIXTURE)
  set(_tok_fixture "${DITSTUDIO_FIXTURE}")
else()
  set(_tok_fixture "${CMAKE_CURRENT_LIST_DIR}/data/tiny-flux-A")
endif()

add_executable(test_tokenizers ${CMAKE_CURRENT_LIST_DIR}/test_tokenizers.cpp)
target_link_libraries(test_tokenizers PRIVATE dit_backend_core GTest::gtest_main)
target_compile_definitions(test_tokenizers PRIVATE TOKENIZER_TEST_FIXTURE="${_tok_fixture}")
# One ctest test per TEST() (found in the source at configure time). LABELS is set afterwards:
# gtest_discover_tests' PROPERTIES would flatten the label list.
gtest_add_tests(TARGET test_tokenizers
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tokenizers.cpp
  TEST_LIST _tok_tests)
set_tests_properties(${_tok_tests} PROPERTIES LABELS "unit;backend;golden" TIMEOUT 120)
unset(_tok_tests)
unset(_tok_fixture)
