# Single-file checkpoint formats (issue 12): BFL / LDM / FP8 / ComfyUI scaled FP8 / all-in-one files
# from the shared fixture (../shared/fixtures/tiny-flux-A/formats), against formats_golden.
set(DITSTUDIO_FORMATS_FIXTURE "${PROJECT_SOURCE_DIR}/../shared/fixtures/tiny-flux-A/formats"
    CACHE PATH "tiny-flux-A single-file formats fixture (formats_golden.safetensors and the files)")
if(EXISTS "${DITSTUDIO_FORMATS_FIXTURE}/formats_golden.safetensors")
  add_executable(test_formats test_formats.cpp)
  target_link_libraries(test_formats PRIVATE dit_backend GTest::gtest)
  target_compile_definitions(test_formats PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
    DITSTUDIO_FORMATS_FIXTURE="${DITSTUDIO_FORMATS_FIXTURE}")
  target_precompile_headers(test_formats REUSE_FROM dit_backend)
  add_test(NAME formats COMMAND test_formats)
  set_tests_properties(formats PROPERTIES LABELS "backend;golden;formats" ENVIRONMENT "OMP_NUM_THREADS=2")
  # tp 2 / ulysses 2 from the BFL file, scaled fp8 under tp, shard-on-load peak memory.
  add_executable(test_formats_mpi test_formats_mpi.cpp)
  target_link_libraries(test_formats_mpi PRIVATE dit_backend GTest::gtest MPI::MPI_C)
  target_compile_definitions(test_formats_mpi PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
    DITSTUDIO_FORMATS_FIXTURE="${DITSTUDIO_FORMATS_FIXTURE}")
  target_precompile_headers(test_formats_mpi REUSE_FROM dit_backend)
  add_test(NAME formats_mpi_np2 COMMAND ${DITSTUDIO_MPIRUN} -np 2 $<TARGET_FILE:test_formats_mpi>)
  set_tests_properties(formats_mpi_np2 PROPERTIES LABELS "backend;parallel;mpi;formats;memory"
    PROCESSORS 2 TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
  # The real CLI: all-in-one file == folder run (1 rank and tp 2), components from anywhere.
  add_executable(test_formats_cli test_formats_cli.cpp)
  target_link_libraries(test_formats_cli PRIVATE dit_backend GTest::gtest)
  target_compile_definitions(test_formats_cli PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
    DITSTUDIO_FORMATS_FIXTURE="${DITSTUDIO_FORMATS_FIXTURE}" DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>")
  target_precompile_headers(test_formats_cli REUSE_FROM dit_backend)
  add_dependencies(test_formats_cli ditstudio-cli ditstudio-worker)
  add_test(NAME formats_cli COMMAND test_formats_cli)
  set_tests_properties(formats_cli PROPERTIES LABELS "backend;formats;integration;mpi" PROCESSORS 2
    TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")
  # ditstudio-bench on the scaled fp8 file at tp 2: every rank's weight_bytes must equal the
  # expected bytes computed from the header with 8-bit linear weights (bench_check_json.cmake).
  if(EXISTS ${CMAKE_CURRENT_BINARY_DIR}/bench_check_json.cmake)  # written by bench.cmake
    string(REPLACE ";" "|" _fmt_mpirun "${DITSTUDIO_MPIRUN}")
    add_test(NAME bench_smoke_fp8_tp2 COMMAND ${CMAKE_COMMAND} -DNP=2
      -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_fp8_tp2.json
      "-DCMD=${_fmt_mpirun}|-np|2|$<TARGET_FILE:ditstudio-bench>|--model|${DITSTUDIO_FORMATS_FIXTURE}/transformer-fp8-scaled.safetensors|--config|${DITSTUDIO_FIXTURE}/transformer/config.json|--width|32|--height|32|--text-len|8|--steps|1|--warmup|0|--dtype|float32|--tp-degree|2|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_fp8_tp2.json"
      -P ${CMAKE_CURRENT_BINARY_DIR}/bench_check_json.cmake)
    set_tests_properties(bench_smoke_fp8_tp2 PROPERTIES LABELS "bench;mpi;formats" PROCESSORS 2
      TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")
  endif()
else()
  message(WARNING "DITSTUDIO_FORMATS_FIXTURE=${DITSTUDIO_FORMATS_FIXTURE} has no formats_golden.safetensors: "
                  "the single-file format tests (formats*) are not built")
endif()
