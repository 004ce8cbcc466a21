# Qwen-Image models: the family's sources (collected by backend/CMakeLists.txt).
list(APPEND DIT_FAMILY_CORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/qwenimage_family.cpp
  ${CMAKE_CURRENT_LIST_DIR}/qwenimage_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/qwenimage_plan.cpp
)
list(APPEND DIT_FAMILY_TORCH_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/qwenimage_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transformer_qwenimage.cpp
)
