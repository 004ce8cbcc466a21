# Benchmark program smoke tests (label "bench"; nothing here is timed or compares timings) and the
# shard-on-load memory test (label "memory").
if(NOT DEFINED DITSTUDIO_MPIRUN)
  find_program(MPIEXEC_PROGRAM NAMES mpirun mpiexec REQUIRED)
  set(DITSTUDIO_MPIRUN ${MPIEXEC_PROGRAM} --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
endif()
if(NOT TARGET GTest::gtest)
  find_package(GTest REQUIRED)
endif()

# --- shard-on-load memory: tp = world size, peak RSS during the load near the shard ---
add_executable(test_load_memory ${CMAKE_CURRENT_LIST_DIR}/test_load_memory.cpp)
target_link_libraries(test_load_memory PRIVATE dit_backend GTest::gtest)
target_compile_definitions(test_load_memory PRIVATE DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
  DITSTUDIO_MAKE_MODEL="$<TARGET_FILE:ditstudio-make-model>")
target_precompile_headers(test_load_memory REUSE_FROM dit_backend)
add_dependencies(test_load_memory ditstudio-make-model)
foreach(_np 2 4)
  add_test(NAME load_memory_np${_np} COMMAND ${DITSTUDIO_MPIRUN} -np ${_np} $<TARGET_FILE:test_load_memory>)
  set_tests_properties(load_memory_np${_np} PROPERTIES LABELS "parallel;mpi;memory" TIMEOUT 300
    PROCESSORS ${_np} ENVIRONMENT "OMP_NUM_THREADS=1")
endforeach()

# --- ditstudio-bench smoke: 1 step on the fixture, the JSON must parse and hold its keys ---
# The checker runs the command given as a |-separated list (ditstudio-bench writes its JSON to
# JSON_FILE through --json-out), parses it and checks the keys, that every rank's weight_bytes
# equal expected_weight_bytes, with NP=n that there are n per-rank entries, and with
# EXPECT_BYTES=1 that every rank's measured bytes per step equal the closed-form expectation.
set(_bench_check ${CMAKE_CURRENT_BINARY_DIR}/bench_check_json.cmake)
file(WRITE ${_bench_check} [=[
string(REPLACE "|" ";" _cmd "${CMD}")
file(REMOVE "${JSON_FILE}")
execute_process(COMMAND ${_cmd} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ditstudio-bench exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT EXISTS "${JSON_FILE}")
  message(FATAL_ERROR "no JSON written to ${JSON_FILE}\nstdout:\n${out}\nstderr:\n${err}")
endif()
file(READ "${JSON_FILE}" json)
macro(get var)
  string(JSON ${var} ERROR_VARIABLE _e GET "${json}" ${ARGN})
  if(_e)
    message(FATAL_ERROR "JSON lacks ${ARGN}: ${_e}\n${json}")
  endif()
endmacro()
foreach(_k source dtype image_tokens text_tokens load_s flops_per_forward strategy)
  get(_v ${_k})
endforeach()
get(_params config parameters)
if(_params LESS_EQUAL 0)
  message(FATAL_ERROR "config.parameters is ${_params}")
endif()
get(_phase phase)
if(_phase STREQUAL "all")
  get(_med step_ms median)
  get(_all step_ms all)
  get(_tf achieved_tflops_total)
  get(_tfr achieved_tflops_per_rank)
  # The attention kernel(s) that ran: one or more of math, flash_cpu, flash_cuda, ...
  string(JSON _nk ERROR_VARIABLE _e LENGTH "${json}" attention_kernels)
  if(_e OR _nk LESS 1)
    message(FATAL_ERROR "attention_kernels missing or empty (${_e})\n${json}")
  endif()
  get(_k0 attention_kernels 0)
  if(NOT _k0 MATCHES "^(math|math_cpu|flash_cpu|flash_cuda|efficient_cuda|cudnn_cuda|fused_other)$")
    message(FATAL_ERROR "unknown attention kernel '${_k0}'")
  endif()
  get(_tv torch_version)
endif()
# With PROFILE=1 (--profile): the per-operator table holds the forward's matrix products, and
# the operators' self times add up to no more than the profiled forward.
if(PROFILE)
  get(_pms op_profile step_ms)
  get(_pself op_profile ops_self_ms)
  string(JSON _pn ERROR_VARIABLE _e LENGTH "${json}" op_profile ops)
  if(_e OR _pn LESS 5)
    message(FATAL_ERROR "op_profile.ops: ${_pn} entries (${_e})\n${json}")
  endif()
  set(_seen_mm 0)
  math(EXPR _plast "${_pn} - 1")
  foreach(_i RANGE ${_plast})
    get(_op op_profile ops ${_i} op)
    get(_calls op_profile ops ${_i} calls)
    if(_op MATCHES "^aten::(addmm|mm|linear)$" AND _calls GREATER 0)
      set(_seen_mm 1)
    endif()
  endforeach()
  if(NOT _seen_mm)
    message(FATAL_ERROR "op_profile lacks aten::addmm / mm / linear\n${json}")
  endif()
  # CMake's math is integer: compare in microseconds.
  string(REGEX REPLACE "\\..*" "" _pms_i "${_pms}")
  string(REGEX REPLACE "\\..*" "" _pself_i "${_pself}")
  if(_pself_i GREATER _pms_i)
    message(FATAL_ERROR "op_profile: operators' self time ${_pself} ms > forward ${_pms} ms")
  endif()
  # The step's categories (bench_profile.h) sum to the profiled step (within rounding: 2% + 10 us);
  # the forward has GEMM and attention time, and with more than one rank collective time.
  macro(to_us var num)  # milliseconds as JSON writes them -> integer microseconds
    if("${num}" MATCHES "[eE]-" OR "${num}" MATCHES "^-")  # below 1 us, or a rounding below 0
      set(${var} 0)
    else()
      string(REGEX MATCH "^[0-9]+" _ip "${num}")
      string(REGEX MATCH "\\.[0-9]+" _fp "${num}")
      string(SUBSTRING "${_fp}000" 1 3 _fp)
      math(EXPR ${var} "${_ip} * 1000 + ${_fp}")
    endif()
  endmacro()
  to_us(_step_us "${_pms}")
  set(_sum_us 0)
  foreach(_c gemm attention norm_modulation rope copy_layout elementwise collective other)
    get(_cms op_profile categories_ms ${_c})
    to_us(_c_us "${_cms}")
    math(EXPR _sum_us "${_sum_us} + ${_c_us}")
    set(_cat_${_c} ${_c_us})
  endforeach()
  math(EXPR _diff "${_sum_us} - ${_step_us}")
  if(_diff LESS 0)
    math(EXPR _diff "-${_diff}")
  endif()
  math(EXPR _tol "${_step_us} / 50 + 10")
  if(_diff GREATER _tol)
    message(FATAL_ERROR "op_profile: categories sum to ${_sum_us} us, the step is ${_step_us} us\n${json}")
  endif()
  if(_cat_gemm LESS_EQUAL 0 OR _cat_attention LESS_EQUAL 0)
    message(FATAL_ERROR "op_profile: no gemm (${_cat_gemm} us) or attention (${_cat_attention} us) time\n${json}")
  endif()
  if(DEFINED NP AND NP GREATER 1 AND _cat_collective LESS_EQUAL 0)
    message(FATAL_ERROR "op_profile: ${NP} ranks but no collective time\n${json}")
  endif()
  get(_map op_profile category_map)
  message(STATUS "op_profile categories (us): gemm ${_cat_gemm} attention ${_cat_attention} norm ${_cat_norm_modulation} rope ${_cat_rope} copy ${_cat_copy_layout} elementwise ${_cat_elementwise} collective ${_cat_collective} other ${_cat_other}, sum ${_sum_us} of ${_step_us}")
endif()
string(JSON _n ERROR_VARIABLE _e LENGTH "${json}" ranks)
if(_e OR (DEFINED NP AND NOT _n EQUAL NP))
  message(FATAL_ERROR "ranks: ${_n} entries (${_e}), expected ${NP}\n${json}")
endif()
math(EXPR _last "${_n} - 1")
foreach(_r RANGE ${_last})
  get(_w ranks ${_r} weight_bytes)
  get(_we ranks ${_r} expected_weight_bytes)
  get(_rss ranks ${_r} rss_peak_load_bytes)
  if(NOT _w EQUAL _we)
    message(FATAL_ERROR "rank ${_r}: weight_bytes ${_w} != expected_weight_bytes ${_we}")
  endif()
  if(_phase STREQUAL "all")
    get(_b ranks ${_r} bytes_sent_per_step)
    get(_be ranks ${_r} expected_bytes_per_step)
    if(EXPECT_BYTES AND NOT _b EQUAL _be)
      message(FATAL_ERROR "rank ${_r}: bytes_sent_per_step ${_b} != expected_bytes_per_step ${_be}\n${json}")
    endif()
  endif()
endforeach()
message(STATUS "bench JSON ok (${_n} ranks)")
]=])

set(_bench_common $<TARGET_FILE:ditstudio-bench> --model ${DITSTUDIO_FIXTURE} --width 32 --height 32
  --text-len 8 --steps 1 --warmup 0 --dtype float32)
list(JOIN _bench_common "|" _bench_common)
string(REPLACE ";" "|" _bench_mpirun "${DITSTUDIO_MPIRUN}")
add_test(NAME bench_smoke_np1 COMMAND ${CMAKE_COMMAND} -DNP=1 -DPROFILE=1 -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_np1.json
  "-DCMD=${_bench_common}|--profile|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_np1.json" -P ${_bench_check})
add_test(NAME bench_smoke_tp2 COMMAND ${CMAKE_COMMAND} -DNP=2 -DEXPECT_BYTES=1 -DPROFILE=1
  -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_tp2.json
  "-DCMD=${_bench_mpirun}|-np|2|${_bench_common}|--tp-degree|2|--profile|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_tp2.json" -P ${_bench_check})
add_test(NAME bench_smoke_ring2 COMMAND ${CMAKE_COMMAND} -DNP=2 -DEXPECT_BYTES=1 -DPROFILE=1
  -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_ring2.json
  "-DCMD=${_bench_mpirun}|-np|2|${_bench_common}|--ring-degree|2|--profile|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_ring2.json" -P ${_bench_check})
add_test(NAME bench_smoke_load_np2 COMMAND ${CMAKE_COMMAND} -DNP=2
  -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_load_np2.json
  "-DCMD=${_bench_mpirun}|-np|2|${_bench_common}|--tp-degree|2|--phase|load|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_load_np2.json" -P ${_bench_check})
# The benchmark is generic over the families: FLUX.2 [klein]'s folder, its own inputs, and its
# traffic model (FamilyRuntime::traffic) equal to the measured bytes under tp 2 and ulysses 2.
set(_bench_flux2 $<TARGET_FILE:ditstudio-bench> --model ${DITSTUDIO_TEST_DATA}/tiny-flux2-A --width 32
  --height 32 --text-len 8 --steps 1 --warmup 0 --dtype float32)
list(JOIN _bench_flux2 "|" _bench_flux2)
add_test(NAME bench_smoke_flux2_np1 COMMAND ${CMAKE_COMMAND} -DNP=1 -DPROFILE=1
  -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_flux2_np1.json
  "-DCMD=${_bench_flux2}|--profile|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_flux2_np1.json" -P ${_bench_check})
foreach(_st tp ulysses)
  add_test(NAME bench_smoke_flux2_${_st}2 COMMAND ${CMAKE_COMMAND} -DNP=2 -DEXPECT_BYTES=1
    -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_flux2_${_st}2.json
    "-DCMD=${_bench_mpirun}|-np|2|${_bench_flux2}|--${_st}-degree|2|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_flux2_${_st}2.json" -P ${_bench_check})
endforeach()
# Qwen-Image likewise (16 image and 8 text tokens: both split over 2).
set(_bench_qwen $<TARGET_FILE:ditstudio-bench> --model ${DITSTUDIO_TEST_DATA}/tiny-qwenimage-A
  --width 32 --height 32 --text-len 8 --steps 1 --warmup 0 --dtype float32)
list(JOIN _bench_qwen "|" _bench_qwen)
add_test(NAME bench_smoke_qwenimage_np1 COMMAND ${CMAKE_COMMAND} -DNP=1 -DPROFILE=1
  -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_qwenimage_np1.json
  "-DCMD=${_bench_qwen}|--profile|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_qwenimage_np1.json" -P ${_bench_check})
foreach(_st tp ulysses)
  add_test(NAME bench_smoke_qwenimage_${_st}2 COMMAND ${CMAKE_COMMAND} -DNP=2 -DEXPECT_BYTES=1
    -DJSON_FILE=${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_qwenimage_${_st}2.json
    "-DCMD=${_bench_mpirun}|-np|2|${_bench_qwen}|--${_st}-degree|2|--json-out|${CMAKE_CURRENT_BINARY_DIR}/bench_smoke_qwenimage_${_st}2.json" -P ${_bench_check})
endforeach()
set_tests_properties(bench_smoke_qwenimage_np1 bench_smoke_qwenimage_tp2
  bench_smoke_qwenimage_ulysses2 PROPERTIES LABELS "bench;qwenimage" TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=1")
set_tests_properties(bench_smoke_qwenimage_tp2 bench_smoke_qwenimage_ulysses2 PROPERTIES
  PROCESSORS 2)
unset(_bench_qwen)
set_tests_properties(bench_smoke_np1 bench_smoke_tp2 bench_smoke_ring2 bench_smoke_load_np2
  bench_smoke_flux2_np1 bench_smoke_flux2_tp2 bench_smoke_flux2_ulysses2 PROPERTIES
  LABELS "bench" TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1")
set_tests_properties(bench_smoke_tp2 bench_smoke_ring2 bench_smoke_load_np2 bench_smoke_flux2_tp2
  bench_smoke_flux2_ulysses2 PROPERTIES PROCESSORS 2)
unset(_bench_flux2)
unset(_bench_common)
unset(_bench_mpirun)
unset(_bench_check)

# Issue 14: the CLI bench with a cache runs the uncached request too and reports steps computed,
# the speed-up and the PSNR against the uncached image (First Block Cache golden case).
add_test(NAME bench_cache COMMAND ditstudio-cli bench --model ${DITSTUDIO_FIXTURE}
         --prompt "a photo of a cat" --seed 42 --steps 10 --width 32 --height 32
         --max-sequence-length 48 --cache first-block:0.37)
set_tests_properties(bench_cache PROPERTIES LABELS "bench;pipelines" TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=1"
  PASS_REGULAR_EXPRESSION "5 of 10 steps computed \\[0,5,7,8,9\\], denoise [0-9.]+ ms vs [0-9.]+ ms uncached \\([0-9.]+x\\), PSNR 62\\.1")

# --- ditstudio-kv-bench smoke (issue 46): the tiny FLUX.2 [klein] fixture, references 0, 1 and 3,
# one step each, one rank and ulysses 2; the table's last row must carry a ratio.
foreach(_kv np1 uly2)
  set(_kv_cmd $<TARGET_FILE:ditstudio-kv-bench> --model ${DITSTUDIO_TEST_DATA}/tiny-flux2-A/transformer
    --image-tokens 16 --text-tokens 8 --steps 1 --warmup 0)
  if(_kv STREQUAL "uly2")
    set(_kv_cmd ${DITSTUDIO_MPIRUN} -np 2 ${_kv_cmd} --ulysses-degree 2)
  endif()
  add_test(NAME bench_smoke_kv_${_kv} COMMAND ${_kv_cmd})
  set_tests_properties(bench_smoke_kv_${_kv} PROPERTIES LABELS "bench" TIMEOUT 120 PROCESSORS 2
    PASS_REGULAR_EXPRESSION "\"references\":3,\"reference_tokens\":48,.*\"cached_vs_none\"")
endforeach()
unset(_kv_cmd)
