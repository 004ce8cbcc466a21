# Issue 15: the synthetic shapes data set, ditstudio-train (smoke run, parity of the saved folder
# with the trainer's prediction, exact resume) and the embedded default model under the
# strategies (real CLI, mpirun). Needs Qt Gui (QPainter draws the data set).
if(TARGET ditstudio-train)
  string(REPLACE ";" " " _demo_mpirun "${DITSTUDIO_MPIRUN}")
  add_executable(test_demo_model test_demo_model.cpp ${PROJECT_SOURCE_DIR}/app/demo/shapes_draw.cpp)
  target_link_libraries(test_demo_model PRIVATE dit_backend dit_demo Qt6::Gui GTest::gtest GTest::gtest_main)
  target_compile_definitions(test_demo_model PRIVATE QT_NO_KEYWORDS
    DITSTUDIO_FIXTURE="${DITSTUDIO_FIXTURE}"
    DITSTUDIO_CLI="$<TARGET_FILE:ditstudio-cli>" DITSTUDIO_TRAIN="$<TARGET_FILE:ditstudio-train>"
    DITSTUDIO_MPIRUN="${_demo_mpirun}"
    DITSTUDIO_DEFAULT_MODEL="${DITSTUDIO_BUILD_MODEL_DIR}/tiny-flux")
  add_dependencies(test_demo_model ditstudio-cli ditstudio-worker ditstudio-train default_model)
  add_test(NAME demo_data COMMAND test_demo_model --gtest_filter=DemoData.*)
  add_test(NAME demo_train_smoke COMMAND test_demo_model
           --gtest_filter=DemoTrainer.LossFallsSavedFolderGivesTheTrainersPredictionAndResumeIsExact)
  add_test(NAME demo_train_dp2 COMMAND test_demo_model
           --gtest_filter=DemoTrainer.DataParallelTwoRanksFollowsTheOneProcessRun)
  set_tests_properties(demo_train_dp2 PROPERTIES LABELS "parallel;mpi;demo" TIMEOUT 300
                       FAIL_REGULAR_EXPRESSION "Running 0 tests")
  set_tests_properties(demo_data PROPERTIES LABELS "unit;demo" TIMEOUT 120
                       FAIL_REGULAR_EXPRESSION "Running 0 tests")
  set_tests_properties(demo_train_smoke PROPERTIES LABELS "backend;demo" TIMEOUT 300
                       FAIL_REGULAR_EXPRESSION "Running 0 tests")
  add_test(NAME demo_embedded_accuracy COMMAND test_demo_model
           --gtest_filter=EmbeddedModel.HeldOutAccuracyFloor)
  set_tests_properties(demo_embedded_accuracy PROPERTIES LABELS "backend;demo" TIMEOUT 600
                       FAIL_REGULAR_EXPRESSION "Running 0 tests")
  foreach(_c tp2 ulysses2 ring2)
    add_test(NAME demo_embedded_${_c} COMMAND test_demo_model
             --gtest_filter=Cpu/EmbeddedModelStrategies.MatchOneRank/${_c})
    set_tests_properties(demo_embedded_${_c} PROPERTIES LABELS "parallel;mpi;strategy;demo"
                         TIMEOUT 240 FAIL_REGULAR_EXPRESSION "0 tests, listed below|Running 0 tests")
  endforeach()
endif()
