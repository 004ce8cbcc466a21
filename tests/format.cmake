# Formatting (.clang-format, clang-format 14 = Debian 12's): packaging/format-check.sh as a test, so
# the suite fails when a file is not formatted. Registered only where clang-format 14 exists (other
# versions format some constructs differently); configure says so when it is not.
find_program(DITSTUDIO_CLANG_FORMAT_14 NAMES clang-format-14)
if(DITSTUDIO_CLANG_FORMAT_14)
  add_test(NAME format COMMAND bash ${PROJECT_SOURCE_DIR}/packaging/format-check.sh)
  set_tests_properties(format PROPERTIES LABELS "unit;format" TIMEOUT 300
    ENVIRONMENT "CLANG_FORMAT=${DITSTUDIO_CLANG_FORMAT_14}")
else()
  message(STATUS "DiT Studio: clang-format-14 not found: the format test is not registered "
                 "(packaging/format-check.sh needs it; Debian 12: apt-get install clang-format-14)")
endif()
