# ditstudio-server (app/server/, issue 32), driven over HTTP by node scripts in tests/server/: the
# unmodified official `openai` npm client (pinned in tests/server/client/, installed into the
# build tree by the server_client_setup fixture: npm's registry or its cache), the pool, faults
# and security defaults. Each test starts its own server(s) on free loopback ports.
if(TARGET dit_server)
  add_executable(test_server_unit ${CMAKE_CURRENT_LIST_DIR}/test_server_unit.cpp)
  target_link_libraries(test_server_unit PRIVATE dit_server dit_backend_core GTest::gtest
    GTest::gtest_main)
  target_compile_definitions(test_server_unit PRIVATE DITSTUDIO_TEST_DATA="${DITSTUDIO_TEST_DATA}")
  gtest_add_tests(TARGET test_server_unit TEST_LIST _server_unit_tests)
  set_tests_properties(${_server_unit_tests} PROPERTIES LABELS "unit;server" TIMEOUT 60)
  # What the server checks before any work starts (request_guard, uploads): unit and fuzz.
  add_executable(test_server_guard ${CMAKE_CURRENT_LIST_DIR}/test_server_guard.cpp)
  target_link_libraries(test_server_guard PRIVATE dit_server GTest::gtest GTest::gtest_main)
  gtest_add_tests(TARGET test_server_guard TEST_LIST _server_guard_tests)
  set_tests_properties(${_server_guard_tests} PROPERTIES LABELS "unit;server;security" TIMEOUT 60)
  add_executable(test_server_fuzz ${CMAKE_CURRENT_LIST_DIR}/test_server_fuzz.cpp)
  target_link_libraries(test_server_fuzz PRIVATE dit_server GTest::gtest GTest::gtest_main)
  gtest_add_tests(TARGET test_server_fuzz TEST_LIST _server_fuzz_tests)
  set_tests_properties(${_server_fuzz_tests} PROPERTIES LABELS "fuzz;security;server" TIMEOUT 180)
endif()
find_program(DITSTUDIO_NODE node)
find_program(DITSTUDIO_NPM npm)
if(DITSTUDIO_NODE AND DITSTUDIO_NPM AND TARGET ditstudio-server)
  set(_srv_client ${CMAKE_CURRENT_BINARY_DIR}/server-client)
  set(_srv_env DITSTUDIO_BIN=${PROJECT_BINARY_DIR}/bin OPENAI_CLIENT_DIR=${_srv_client}
               DITSTUDIO_MODEL_DIR=${DITSTUDIO_BUILD_MODEL_DIR}/tiny-flux)
  add_test(NAME server_client_setup
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/server/setup-client.sh ${_srv_client})
  set_tests_properties(server_client_setup PROPERTIES FIXTURES_SETUP server_client
                       LABELS "server;integration" TIMEOUT 300)
  foreach(_t openai pool faults hostile)
    add_test(NAME server_${_t} COMMAND ${DITSTUDIO_NODE} ${CMAKE_CURRENT_LIST_DIR}/server/${_t}.test.mjs)
    set_tests_properties(server_${_t} PROPERTIES ENVIRONMENT "${_srv_env}"
                         FIXTURES_REQUIRED server_client LABELS "server;integration" TIMEOUT 600
                         RESOURCE_LOCK mpi)
  endforeach()
  set_tests_properties(server_faults PROPERTIES LABELS "server;integration;fault")
  # Each family's declared request through the server (Z-Image options, Qwen-Image true CFG via
  # the openai client and A1111 = the CLI; 400s naming the field; FLUX.2 [klein]'s floored size).
  add_test(NAME server_families
           COMMAND ${DITSTUDIO_NODE} ${CMAKE_CURRENT_LIST_DIR}/server/families.test.mjs)
  set_tests_properties(server_families PROPERTIES
                       ENVIRONMENT "${_srv_env};DITSTUDIO_TEST_DATA=${DITSTUDIO_TEST_DATA}"
                       FIXTURES_REQUIRED server_client LABELS "server;integration;errors"
                       TIMEOUT 600 RESOURCE_LOCK mpi)
  # Issue 46: reference-image editing over HTTP (openai images.edit with two images, A1111
  # img2img's init_images, FLUX.1 Kontext) = ditstudio-cli --image; refusals naming the field.
  add_test(NAME server_edit COMMAND ${DITSTUDIO_NODE} ${CMAKE_CURRENT_LIST_DIR}/server/edit.test.mjs)
  set_tests_properties(server_edit PROPERTIES
                       ENVIRONMENT "${_srv_env};DITSTUDIO_TEST_DATA=${DITSTUDIO_TEST_DATA}"
                       FIXTURES_REQUIRED server_client LABELS "server;integration;edit"
                       TIMEOUT 600 RESOURCE_LOCK mpi)
  set_tests_properties(server_hostile PROPERTIES LABELS "server;integration;fault;security")
  # The page in Debian's headless Chromium (package `chromium`), over the DevTools pipe.
  find_program(DITSTUDIO_CHROMIUM NAMES chromium chromium-browser)
  if(DITSTUDIO_CHROMIUM)
    add_test(NAME server_page COMMAND ${DITSTUDIO_NODE} ${CMAKE_CURRENT_LIST_DIR}/server/page.test.mjs)
    set_tests_properties(server_page PROPERTIES
                         ENVIRONMENT "${_srv_env};CHROMIUM=${DITSTUDIO_CHROMIUM};SCREENSHOT=${CMAKE_CURRENT_BINARY_DIR}/server-page.png"
                         LABELS "server;integration" TIMEOUT 300 RESOURCE_LOCK mpi)
  else()
    message(STATUS "DiT Studio: chromium not found: server_page is not registered")
  endif()
else()
  message(STATUS "DiT Studio: node/npm not found: the server tests are not registered "
                 "(packaging/install-deps.sh installs them)")
endif()
