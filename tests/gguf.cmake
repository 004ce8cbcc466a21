# GGUF checkpoints (issue 33) on ../shared/fixtures/tiny-flux-gguf-A: reader, bit-exact
# dequantization of every tensor of the 12 files against ggml's, forward and pipeline goldens,
# tensor parallel / ulysses parity and LoRA on quantized weights.
set(DITSTUDIO_GGUF_FIXTURE "${PROJECT_SOURCE_DIR}/../shared/fixtures/tiny-flux-gguf-A"
    CACHE PATH "tiny-flux-gguf-A fixture (gguf/ and a diffusers FluxPipeline folder)")
if(EXISTS "${DITSTUDIO_GGUF_FIXTURE}/gguf/gguf_report.json")
  add_executable(test_gguf test_gguf.cpp)
  target_link_libraries(test_gguf PRIVATE dit_app GTest::gtest GTest::gtest_main)
  target_compile_definitions(test_gguf PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
    DITSTUDIO_GGUF_FIXTURE="${DITSTUDIO_GGUF_FIXTURE}")
  target_precompile_headers(test_gguf REUSE_FROM dit_backend)
  add_test(NAME gguf COMMAND test_gguf)
  set_tests_properties(gguf PROPERTIES LABELS "backend;golden;formats;gguf" TIMEOUT 600
    ENVIRONMENT "OMP_NUM_THREADS=2")
else()
  message(WARNING "DITSTUDIO_GGUF_FIXTURE=${DITSTUDIO_GGUF_FIXTURE} has no gguf/gguf_report.json: "
                  "the GGUF tests (gguf*) are not built")
endif()
if(EXISTS "${DITSTUDIO_GGUF_FIXTURE}/gguf/gguf_report.json")
  # tp 2 / ulysses 2 from Q4_K_S and Q8_0 == one rank, per-rank quantized slices, LoRA on Q8_0.
  add_executable(test_gguf_mpi test_gguf_mpi.cpp)
  target_link_libraries(test_gguf_mpi PRIVATE dit_backend GTest::gtest MPI::MPI_C)
  target_compile_definitions(test_gguf_mpi PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
    DITSTUDIO_GGUF_FIXTURE="${DITSTUDIO_GGUF_FIXTURE}")
  target_precompile_headers(test_gguf_mpi REUSE_FROM dit_backend)
  add_test(NAME gguf_mpi_np2 COMMAND ${DITSTUDIO_MPIRUN} -np 2 $<TARGET_FILE:test_gguf_mpi>)
  set_tests_properties(gguf_mpi_np2 PROPERTIES LABELS "backend;parallel;mpi;formats;gguf;lora"
    PROCESSORS 2 TIMEOUT 600 ENVIRONMENT "OMP_NUM_THREADS=1;DITSTUDIO_COLLECTIVE_TIMEOUT_S=120")
endif()
if(EXISTS "${DITSTUDIO_GGUF_FIXTURE}/gguf/gguf_report.json" AND TARGET ditstudio-gguf-bench)
  # ditstudio-gguf-bench smoke at tp 2 (label bench; timings printed, not compared): every GGUF
  # variant's resident weight bytes within 10% of the file's bytes for the rank's shard.
  add_test(NAME gguf_bench_np2 COMMAND ${DITSTUDIO_MPIRUN} -np 2 $<TARGET_FILE:ditstudio-gguf-bench>
    --folder ${DITSTUDIO_GGUF_FIXTURE}/transformer
    --gguf ${DITSTUDIO_GGUF_FIXTURE}/gguf/transformer-Q8_0.gguf
    --gguf ${DITSTUDIO_GGUF_FIXTURE}/gguf/transformer-Q4_K_S.gguf
    --image-tokens 64 --text-tokens 16 --steps 1 --warmup 0 --check)
  set_tests_properties(gguf_bench_np2 PROPERTIES LABELS "bench;mpi;gguf" PROCESSORS 2 TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1")
endif()
