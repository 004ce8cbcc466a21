# FLUX.2 [dev] (Flux2Pipeline, issue 47) against tests/data/tiny-flux2dev-A: the Mistral text side
# (MistralTokenizer, the Mistral decoder, the stacked prompt embeddings).
set(_flux2dev_fixture "${DITSTUDIO_TEST_DATA}/tiny-flux2dev-A")
add_executable(test_mistral ${CMAKE_CURRENT_LIST_DIR}/test_mistral.cpp)
target_link_libraries(test_mistral PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_mistral PRIVATE DITSTUDIO_FIXTURE="${_flux2dev_fixture}")
gtest_add_tests(TARGET test_mistral SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mistral.cpp
                TEST_LIST _mistral_tests TEST_PREFIX "mistral.")
set_tests_properties(${_mistral_tests} PROPERTIES LABELS "unit;backend;golden;flux2" TIMEOUT 300)
unset(_mistral_tests)
unset(_flux2dev_fixture)
