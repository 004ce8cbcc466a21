# Qwen-Image pipelines: the family's sources (collected by backend/CMakeLists.txt).
list(APPEND DIT_FAMILY_CORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/qwenimage_pipeline_config.cpp
)
list(APPEND DIT_FAMILY_TORCH_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_qwenimage.cpp
)
