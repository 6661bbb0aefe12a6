# Runs Clang's thread-safety analysis over sources annotated with util/thread_annotations.h.
# Invoked by CTest in script mode (see src/util/CMakeLists.txt):
#   cmake -DCLANG=<clang++> -DSOURCE_DIR=<repo> -DFILES="a.cc;b.cc"
#         [-DEXPECT_VIOLATION=ON -DEXPECTED_ERRORS=<n>] -P thread_safety_check.cmake
# Each file is parsed with -fsyntax-only -Wthread-safety -Werror=thread-safety. Normally every
# file must pass. With EXPECT_VIOLATION=ON every file must instead be refused with exactly
# EXPECTED_ERRORS (default 1) thread-safety errors (the canary that proves the check can fail).
foreach(var CLANG SOURCE_DIR FILES)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "thread_safety_check.cmake: -D${var}=... is required")
  endif()
endforeach()

set(failures 0)
foreach(file IN LISTS FILES)
  execute_process(
    COMMAND ${CLANG} -std=c++20 -fsyntax-only -Wno-unknown-warning-option -Wthread-safety
            -Werror=thread-safety -I${SOURCE_DIR}/src ${SOURCE_DIR}/${file}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  if(EXPECT_VIOLATION)
    if(NOT DEFINED EXPECTED_ERRORS)
      set(EXPECTED_ERRORS 1)
    endif()
    string(REGEX MATCHALL "error: [^\n]*requires holding mutex" found "${out}")
    list(LENGTH found num_found)
    if(rc EQUAL 0 OR NOT num_found EQUAL EXPECTED_ERRORS)
      message(SEND_ERROR "${file}: expected ${EXPECTED_ERRORS} thread-safety errors, got "
                         "${num_found} (exit ${rc}):\n${out}")
      math(EXPR failures "${failures} + 1")
    else()
      message(STATUS "${file}: violation detected, as expected")
    endif()
  elseif(NOT rc EQUAL 0)
    message(SEND_ERROR "${file}: thread-safety analysis failed (exit ${rc}):\n${out}")
    math(EXPR failures "${failures} + 1")
  else()
    message(STATUS "${file}: ok")
  endif()
endforeach()
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} file(s) failed the thread-safety check")
endif()
