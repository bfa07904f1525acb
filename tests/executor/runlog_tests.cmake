# Tests of the run log and the learning-rate schedules (label executor). Included from
# tests/executor/CMakeLists.txt; paths are relative to this file.
slidedp_test(test_run_log
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/run_log_test.cc
  DEPS slidedp_runlog SQLite::SQLite3 LABELS executor TIMEOUT 30)
slidedp_test(test_lr_schedule
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/lr_schedule_test.cc
  DEPS slidedp_runlog LABELS executor TIMEOUT 30)
