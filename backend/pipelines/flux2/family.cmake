# FLUX.2 [klein] pipelines: the family's sources (collected by backend/CMakeLists.txt).
list(APPEND DIT_FAMILY_CORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/flux2_pipeline_config.cpp
)
list(APPEND DIT_FAMILY_TORCH_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_flux2.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_flux2_kv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flux2_prompt_encoder.cpp
)
