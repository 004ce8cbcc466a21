# FLUX.2 [klein] models: the family's sources (collected by backend/CMakeLists.txt).
list(APPEND DIT_FAMILY_CORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/flux2_family.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flux2_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flux2_plan.cpp
)
list(APPEND DIT_FAMILY_TORCH_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/flux2_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flux2_blocks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transformer_flux2.cpp
)
