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
  dit_gtest_filter_test(demo_data test_demo_model "DemoData.*" "unit;demo" 120)
  dit_gtest_filter_test(demo_train_smoke test_demo_model
    DemoTrainer.LossFallsSavedFolderGivesTheTrainersPredictionAndResumeIsExact "backend;demo" 300)
  dit_gtest_filter_test(demo_train_dp2 test_demo_model
    DemoTrainer.DataParallelTwoRanksFollowsTheOneProcessRun "parallel;mpi;demo" 300)
  dit_gtest_filter_test(demo_embedded_accuracy test_demo_model
    EmbeddedModel.HeldOutAccuracyFloor "backend;demo" 600)
  foreach(_c tp2 ulysses2 ring2)
    dit_gtest_filter_test(demo_embedded_${_c} test_demo_model
      Cpu/EmbeddedModelStrategies.MatchOneRank/${_c} "parallel;mpi;strategy;demo" 240)
  endforeach()
endif()
