# ditstudio-server (app/server/, issue 32), driven over HTTP by node scripts in tests/server/: the
# unmodified official `openai` npm client (pinned in tests/server/client/, installed into the
# build tree by the server_client_setup fixture: npm's registry or its cache), the pool, faults
# and security defaults. Each test starts its own server(s) on free loopback ports.
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
  foreach(_t openai pool faults)
    add_test(NAME server_${_t} COMMAND ${DITSTUDIO_NODE} ${CMAKE_CURRENT_LIST_DIR}/server/${_t}.test.mjs)
    set_tests_properties(server_${_t} PROPERTIES ENVIRONMENT "${_srv_env}"
                         FIXTURES_REQUIRED server_client LABELS "server;integration" TIMEOUT 600
                         RESOURCE_LOCK mpi)
  endforeach()
  set_tests_properties(server_faults PROPERTIES LABELS "server;integration;fault")
else()
  message(STATUS "DiT Studio: node/npm not found: the server tests are not registered "
                 "(packaging/install-deps.sh installs them)")
endif()
