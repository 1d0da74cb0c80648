# Helpers shared by every folder: warnings, "a library", "a test" (abseil absl_cc_test style).

set(FUSEPACK_CTEST_LABELS reference packing properties kernels gpu trainer golden distributed)

function(fusepack_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-sign-compare>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall -lineinfo>)
endfunction()

# fusepack_test(NAME <target> SOURCES <files...> [LIBS <targets...>] LABELS <labels...> [TIMEOUT <s>])
# Builds a GoogleTest binary linked with tests/support and registers each of its tests with CTest under the
# given labels. A test that calls GTEST_SKIP() (for example: no CUDA device) is reported by CTest as skipped.
function(fusepack_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_NAME OR NOT T_SOURCES OR NOT T_LABELS)
    message(FATAL_ERROR "fusepack_test needs NAME, SOURCES and LABELS")
  endif()
  foreach(label IN LISTS T_LABELS)
    if(NOT label IN_LIST FUSEPACK_CTEST_LABELS)
      message(FATAL_ERROR "fusepack_test(${T_NAME}): unknown label '${label}' (known: ${FUSEPACK_CTEST_LABELS})")
    endif()
  endforeach()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE fusepack_test_support ${T_LIBS})
  fusepack_warnings(${T_NAME})
  # GoogleTest's registration macros declare members nvcc reports as unreferenced (#177) in every .cu test.
  target_compile_options(${T_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-diag-suppress=177>)
  # The skip pattern matches GoogleTest's "[  SKIPPED ]" without brackets: CMake 3.x splits lists differently
  # around unbalanced '[' and CMake 4.x writes these properties inside [[...]] bracket arguments.
  string(REPLACE ";" "\\;" labels "${T_LABELS}")
  gtest_discover_tests(${T_NAME}
    DISCOVERY_MODE PRE_TEST NO_PRETTY_VALUES
    PROPERTIES LABELS "${labels}" TIMEOUT ${T_TIMEOUT} SKIP_REGULAR_EXPRESSION "  SKIPPED ")
endfunction()
