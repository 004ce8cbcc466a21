# The GUI's "Serve API" switch (ui/api_serve.h, issue 32): the window serves the OpenAI Images API
# with dit_server's code over a group of its own (a real worker on the embedded model).
if(NOT DITSTUDIO_BUILD_GUI OR NOT TARGET dit_ui OR NOT TARGET ditstudio-worker OR NOT TARGET dit_server)
  return()
endif()
pkg_check_modules(CPPHTTPLIB_TEST REQUIRED IMPORTED_TARGET cpp-httplib)
ditstudio_ui_test(test_ui_serve LIBS PkgConfig::CPPHTTPLIB_TEST LABELS ui integration server
                  TIMEOUT 600
                  ENV "DITSTUDIO_TEST_WORKER=$<TARGET_FILE:ditstudio-worker>"
                      "DITSTUDIO_TEST_MODEL=${DITSTUDIO_BUILD_MODEL_DIR}/tiny-flux")
set_tests_properties(test_ui_serve PROPERTIES PROCESSORS 2 RESOURCE_LOCK mpi)
