# Issue 47: the advisor dialog's "Plan for me" (the placement planner in the window). After
# ui.cmake (alphabetical), which defines ditstudio_ui_test.
if(NOT DITSTUDIO_BUILD_GUI OR NOT TARGET dit_ui)
  return()
endif()
ditstudio_ui_test(test_ui_planner)
# Presets that record a plan: "Plan for me" + Apply saves one; loading it where the GPUs have less
# memory (or are fewer) says what no longer fits.
ditstudio_ui_test(test_ui_preset_plan LABELS "ui;planner")
