# The run log (SQLite, schema in run_log_schema.sql embedded into the binary) and learning-rate
# schedules: the executor's self-contained parts that the planner and fidelity tools also link.
# Included from executor/CMakeLists.txt; paths are relative to this file so the include site is free.
slidedp_embed_files(${CMAKE_CURRENT_BINARY_DIR}/run_log_schema_embedded.cc
  NAMESPACE slidedp FUNCTION embedded_run_log_schema FILES ${CMAKE_CURRENT_LIST_DIR}/run_log_schema.sql)

slidedp_library(slidedp_runlog
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/run_log.cc
    ${CMAKE_CURRENT_LIST_DIR}/lr_schedule.cc
    ${CMAKE_CURRENT_BINARY_DIR}/run_log_schema_embedded.cc
  DEPS slidedp_model SQLite::SQLite3 nlohmann_json::nlohmann_json)
