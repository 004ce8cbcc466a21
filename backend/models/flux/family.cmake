# FLUX.1 models: the family's sources (collected by backend/CMakeLists.txt).
list(APPEND DIT_FAMILY_CORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/flux_family.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flux_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flux_bfl_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flux_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flux_lora.cpp
)
list(APPEND DIT_FAMILY_TORCH_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/flux_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flux_blocks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transformer_flux.cpp
)
