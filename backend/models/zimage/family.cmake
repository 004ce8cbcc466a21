# Z-Image models: the family's sources (collected by backend/CMakeLists.txt).
list(APPEND DIT_FAMILY_CORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/zimage_family.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zimage_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zimage_plan.cpp
)
list(APPEND DIT_FAMILY_TORCH_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/zimage_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transformer_zimage.cpp
)
