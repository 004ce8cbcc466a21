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
target_link_libraries(test_tokenizers PRIVATE dit_core GTest::gtest_main)
target_compile_definitions(test_tokenizers PRIVATE TOKENIZER_TEST_FIXTURE="${_tok_fixture}")
gtest_discover_tests(test_tokenizers
  DISCOVERY_MODE PRE_TEST
  PROPERTIES LABELS "unit;backend;golden" TIMEOUT 120)
unset(_tok_fixture)
