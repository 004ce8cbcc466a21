# Context-parallel attention (parallel/attention.*, parallel/context_parallel.*): part of the Torch
# library dit_backend. Included from parallel/CMakeLists.txt.
target_sources(dit_backend PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/context_parallel.cpp
)
