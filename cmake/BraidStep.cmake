# One step of a kernel build, with its end reported: cmake -DSTEP=<what> -P BraidStep.cmake <command...>
# runs the command and prints "<what>: done in N s" (or fails with its exit status), so that a build whose
# steps run side by side says which one ended.
set(cmd)
set(first -1)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(first GREATER 0 AND i GREATER_EQUAL first)
    list(APPEND cmd "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "-P")
    math(EXPR first "${i} + 2") # after the script's name
  endif()
endforeach()
string(TIMESTAMP start "%s")
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc)
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${STEP}: failed (${rc}) after ${seconds} s")
endif()
message("${STEP}: done in ${seconds} s")
