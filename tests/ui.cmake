# QtTest suites for ui/ (run offscreen). Labels: "ui"; the ones that drive the real worker also
# "integration". Included by tests/CMakeLists.txt.
if(NOT DITSTUDIO_BUILD_GUI OR NOT TARGET dit_ui)
  return()
endif()

# The scripted mpirun stand-in shared by the controller and window tests.
add_library(test_ui_fake_worker STATIC ${CMAKE_CURRENT_LIST_DIR}/test_ui_fake_worker.cpp)
target_link_libraries(test_ui_fake_worker PUBLIC Qt6::Core Qt6::Gui)
target_compile_definitions(test_ui_fake_worker PRIVATE QT_NO_KEYWORDS)

set(_ui_env
  "QT_QPA_PLATFORM=offscreen"
  "QTEST_DISABLE_STACK_DUMP=1"
  # QtTest's per-function watchdog (default 300 s) above the tests' own waits, so a hang ends as
  # a test failure with its message rather than "Subprocess aborted".
  "QTEST_FUNCTION_TIMEOUT=900000"
  "DITSTUDIO_TEST_FIXTURE=${DITSTUDIO_FIXTURE}"
  "DITSTUDIO_DATA_DIR=${CMAKE_CURRENT_BINARY_DIR}/ui-data"
  "XDG_RUNTIME_DIR=${CMAKE_CURRENT_BINARY_DIR}/ui-runtime")
file(MAKE_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/ui-runtime")
# QStandardPaths wants the runtime directory private (0700).
file(CHMOD "${CMAKE_CURRENT_BINARY_DIR}/ui-runtime" DIRECTORY_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)

function(ditstudio_ui_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "LABELS;ENV;LIBS" ${ARGN})
  add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/${name}.cpp)
  set_target_properties(${name} PROPERTIES AUTOMOC ON)
  target_link_libraries(${name} PRIVATE dit_ui Qt6::Test ${T_LIBS})
  add_test(NAME ${name} COMMAND ${name})
  if(NOT T_LABELS)
    set(T_LABELS "ui")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  set_tests_properties(${name} PROPERTIES
    ENVIRONMENT "${_ui_env};${T_ENV}"
    LABELS "${T_LABELS}"
    TIMEOUT ${T_TIMEOUT})
endfunction()

# Pure logic.
ditstudio_ui_test(test_ui_advisor)
ditstudio_ui_test(test_ui_presets)
ditstudio_ui_test(test_ui_events)
ditstudio_ui_test(test_ui_command)
ditstudio_ui_test(test_ui_mesh)
ditstudio_ui_test(test_ui_model ENV "DITSTUDIO_TEST_FORMATS=${DITSTUDIO_FORMATS_FIXTURE}")
# QProcess plumbing and the window, against the scripted stand-in.
ditstudio_ui_test(test_ui_controller LIBS test_ui_fake_worker TIMEOUT 180)
ditstudio_ui_test(test_ui_widgets LIBS test_ui_fake_worker TIMEOUT 300)
# Issue 11's GUI half: nothing lost (images, seeds, interrupted requests), nothing misreported.
ditstudio_ui_test(test_ui_lossless LIBS test_ui_fake_worker TIMEOUT 300)

# The real worker: 2 CPU ranks under mpirun, the embedded tiny model.
if(TARGET ditstudio-worker)
  ditstudio_ui_test(test_ui_integration
    LABELS ui integration
    TIMEOUT 1500
    ENV "DITSTUDIO_TEST_WORKER=$<TARGET_FILE:ditstudio-worker>"
        "DITSTUDIO_TEST_MODEL=${DITSTUDIO_BUILD_MODEL_DIR}/tiny-flux")
  set_tests_properties(test_ui_integration PROPERTIES PROCESSORS 2 RESOURCE_LOCK mpi)
  # The worker and the embedded model must be built before the test runs.
  add_dependencies(test_ui_integration ditstudio-worker)
  if(TARGET default_model)
    add_dependencies(test_ui_integration default_model)
  endif()
endif()

# Issue 17 in the GUI with the real worker: a FLUX.2 [klein] folder from a clean start.
if(TARGET ditstudio-worker)
  ditstudio_ui_test(test_ui_flux2
    LABELS ui integration flux2
    TIMEOUT 600
    ENV "DITSTUDIO_TEST_WORKER=$<TARGET_FILE:ditstudio-worker>"
        "DITSTUDIO_TEST_FLUX2_MODEL=${DITSTUDIO_TEST_DATA}/tiny-flux2-A")
  set_tests_properties(test_ui_flux2 PROPERTIES PROCESSORS 2 RESOURCE_LOCK mpi)
  add_dependencies(test_ui_flux2 ditstudio-worker)
endif()

# Issue 14 in the GUI with the real worker: init image, mask brush, strength, caching, recall.
if(TARGET ditstudio-worker)
  ditstudio_ui_test(test_ui_i2i
    LABELS ui integration pipelines
    TIMEOUT 900
    ENV "DITSTUDIO_TEST_WORKER=$<TARGET_FILE:ditstudio-worker>"
        "DITSTUDIO_TEST_MODEL=${DITSTUDIO_BUILD_MODEL_DIR}/tiny-flux")
  set_tests_properties(test_ui_i2i PROPERTIES PROCESSORS 2 RESOURCE_LOCK mpi)
  add_dependencies(test_ui_i2i ditstudio-worker)
  if(TARGET default_model)
    add_dependencies(test_ui_i2i default_model)
  endif()
endif()

# LoRA list, generate with a LoRA on the real worker (the tiny-flux-A fixture), PNG and recall.
if(TARGET ditstudio-worker)
  ditstudio_ui_test(test_ui_lora
    LABELS ui integration lora
    TIMEOUT 900
    ENV "DITSTUDIO_TEST_WORKER=$<TARGET_FILE:ditstudio-worker>")
  set_tests_properties(test_ui_lora PROPERTIES PROCESSORS 2 RESOURCE_LOCK mpi)
  add_dependencies(test_ui_lora ditstudio-worker)
endif()
