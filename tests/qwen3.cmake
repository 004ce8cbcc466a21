# FLUX.2 [klein] text side (issue 17): Qwen2Tokenizer, Qwen3 text encoder and prompt embeddings
# against the tiny-flux2-A goldens, and the encoder under tensor parallel (2 and 4 ranks).
set(_qwen_fixture "${DITSTUDIO_TEST_DATA}/tiny-flux2-A")
add_executable(test_qwen3 ${CMAKE_CURRENT_LIST_DIR}/test_qwen3.cpp)
target_link_libraries(test_qwen3 PRIVATE dit_backend GTest::gtest GTest::gtest_main)
target_compile_definitions(test_qwen3 PRIVATE DITSTUDIO_FIXTURE="${_qwen_fixture}")
gtest_add_tests(TARGET test_qwen3 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_qwen3.cpp
                TEST_LIST _qwen_tests TEST_PREFIX "qwen3.")
set_tests_properties(${_qwen_tests} PROPERTIES LABELS "unit;backend;golden;flux2" TIMEOUT 300)

add_executable(test_qwen3_tp ${CMAKE_CURRENT_LIST_DIR}/test_qwen3_tp.cpp)
target_link_libraries(test_qwen3_tp PRIVATE dit_backend GTest::gtest MPI::MPI_C)
target_compile_definitions(test_qwen3_tp PRIVATE DITSTUDIO_FIXTURE="${_qwen_fixture}")
foreach(_np 2 4)
  add_test(NAME qwen3_tp_np${_np}
           COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_qwen3_tp>)
  set_tests_properties(qwen3_tp_np${_np} PROPERTIES
    LABELS "parallel;mpi;flux2" PROCESSORS ${_np} TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endforeach()
unset(_qwen_tests)
unset(_qwen_fixture)
