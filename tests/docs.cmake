# Documentation (tests/docs_links.sh): every link and image in README.md, ARCHITECTURE.md and
# docs/*.md resolves (repository files, and #anchors against the target's headings; web links are
# listed, never fetched), and README.md stays at most 12 KB.
add_test(NAME docs_links COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/docs_links.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(docs_links PROPERTIES LABELS "docs" TIMEOUT 60)
