# Monitoring tests (included by tests/CMakeLists.txt). tests/ras/test_*.c are built and registered by the
# general rule (label "ras"); they share the strict JSON parser and a small RAS client (ras_util.c). Helpers:
# ras_json_check (a status document's facts, for the scripts), ras_rank (one rank of a job that runs until
# told to stop, for the multi-host and NCCL-client scripts) and ras_poll (a client polling at a fixed rate,
# for bench_ras.sh). The libFuzzer targets are built by tests/ras/fuzz.sh with clang, not here.
foreach(t test_ras_unit test_ras_poll test_ras_fault)
  target_sources(${t} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/ras/json.c ${CMAKE_CURRENT_SOURCE_DIR}/ras/ras_util.c)
endforeach()
# The sanitizer builds run these three (ctest -L ras_stress); LeakSanitizer is told that the header of a
# destroyed communicator stays on purpose.
set_tests_properties(ras/test_ras_poll ras/test_ras_unit ras/test_ras_fault PROPERTIES LABELS "ras;ras_stress"
  ENVIRONMENT "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/ras/lsan.supp")
add_executable(ras_json_check ras/ras_json_check.c ras/json.c)
target_compile_definitions(ras_json_check PRIVATE _GNU_SOURCE)
target_compile_options(ras_json_check PRIVATE ${BRAID_WARNINGS})
target_include_directories(ras_json_check PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/ras)
add_executable(ras_rank ras/ras_rank.c)
target_link_libraries(ras_rank PRIVATE braid_testlib nccl)
target_compile_options(ras_rank PRIVATE ${BRAID_WARNINGS})
set_tests_properties(ras/test_ncclras PROPERTIES SKIP_RETURN_CODE 77)
add_executable(ras_poll ras/ras_poll.c ras/ras_util.c)
target_link_libraries(ras_poll PRIVATE braid_static)
target_include_directories(ras_poll PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_compile_definitions(ras_poll PRIVATE _GNU_SOURCE)
target_compile_options(ras_poll PRIVATE ${BRAID_WARNINGS})
