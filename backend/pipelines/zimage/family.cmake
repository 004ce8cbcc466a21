# Z-Image pipelines: the family's sources (collected by backend/CMakeLists.txt).
list(APPEND DIT_FAMILY_CORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/zimage_pipeline_config.cpp
)
list(APPEND DIT_FAMILY_TORCH_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_zimage.cpp
)
