# Install test: the installed tree (what the .deb and .tar.gz contain) works on its own.
add_test(NAME install_tree COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/install_check.sh ${PROJECT_BINARY_DIR})
set_tests_properties(install_tree PROPERTIES LABELS "install" TIMEOUT 300)
