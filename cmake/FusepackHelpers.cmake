# Helpers shared by every folder: warnings, "a library", "a tool", "a test" (abseil absl_cc_test style), so each
# CMakeLists.txt reads as a table of contents.

set(FUSEPACK_CTEST_LABELS reference packing properties kernels gpu trainer golden distributed)
# Where the tests' temporary files go (their TMPDIR).
set(FUSEPACK_TEST_TMPDIR ${PROJECT_BINARY_DIR}/test-tmp)
file(MAKE_DIRECTORY ${FUSEPACK_TEST_TMPDIR})

function(fusepack_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-sign-compare>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall -lineinfo>)
endfunction()

# fusepack_library(<target> SOURCES <files...> [PUBLIC <targets...>] [PRIVATE <targets...>])
# A static library of fusepack: headers included from the project root ("packing/batch.h"), fusepack's warnings.
function(fusepack_library name)
  cmake_parse_arguments(L "" "" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
  if(NOT L_SOURCES)
    message(FATAL_ERROR "fusepack_library(${name}) needs SOURCES")
  endif()
  add_library(${name} STATIC ${L_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  if(L_PUBLIC)
    target_link_libraries(${name} PUBLIC ${L_PUBLIC})
  endif()
  if(L_PRIVATE)
    target_link_libraries(${name} PRIVATE ${L_PRIVATE})
  endif()
  fusepack_warnings(${name})
endfunction()

# fusepack_tool(<target> SOURCES <files...> LIBS <targets...>)
# A command-line tool of fusepack, built into <build>/bin with the others.
function(fusepack_tool name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  if(NOT T_SOURCES)
    message(FATAL_ERROR "fusepack_tool(${name}) needs SOURCES")
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
  fusepack_warnings(${name})
endfunction()

# fusepack_test(NAME <target> SOURCES <files...> [LIBS <targets...>] LABELS <labels...> [TIMEOUT <s>]
#               [GPU_FILTER <gtest pattern>])
# Builds a GoogleTest binary linked with tests/support (and through it verify/) and registers each of its tests with
# CTest under the given labels. Tests matching GPU_FILTER (a --gtest_filter pattern such as "*Fused*") additionally get
# the `gpu` label. A test that calls GTEST_SKIP() (for example: no CUDA device) is reported by CTest as skipped.
function(fusepack_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT;GPU_FILTER" "SOURCES;LIBS;LABELS" ${ARGN})
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
  if(T_GPU_FILTER)
    _fusepack_discover(${T_NAME} "-${T_GPU_FILTER}" "${T_LABELS}" ${T_TIMEOUT})
    _fusepack_discover(${T_NAME} "${T_GPU_FILTER}" "${T_LABELS};gpu" ${T_TIMEOUT})
  else()
    _fusepack_discover(${T_NAME} "" "${T_LABELS}" ${T_TIMEOUT})
  endif()
endfunction()

# Labels are set by a small script that CTest includes after the discovered tests (a list of several labels does not
# survive gtest_discover_tests' PROPERTIES quoting). The skip pattern matches GoogleTest's "[  SKIPPED ]" without
# brackets: CMake 3.x splits lists differently around an unbalanced '[', CMake 4.x writes properties inside [[...]].
function(_fusepack_discover target filter labels timeout)
  get_property(index TARGET ${target} PROPERTY FUSEPACK_DISCOVER_INDEX)
  if(NOT index)
    set(index 0)
  endif()
  math(EXPR index "${index} + 1")
  set_property(TARGET ${target} PROPERTY FUSEPACK_DISCOVER_INDEX ${index})
  set(list_var ${target}_${index}_TESTS)
  set(filter_args)
  if(filter)
    set(filter_args TEST_FILTER "${filter}")
  endif()
  # TMPDIR: the files a test writes (std::filesystem::temp_directory_path, mkstemp, the tools it runs) go under the
  # build folder, not the machine's /tmp, and leave with the build.
  gtest_discover_tests(${target}
    DISCOVERY_MODE PRE_TEST NO_PRETTY_VALUES TEST_LIST ${list_var} ${filter_args}
    PROPERTIES TIMEOUT ${timeout} SKIP_REGULAR_EXPRESSION "  SKIPPED " ENVIRONMENT "TMPDIR=${FUSEPACK_TEST_TMPDIR}")
  set(labels_script ${CMAKE_CURRENT_BINARY_DIR}/${target}_${index}_labels.cmake)
  file(WRITE ${labels_script}
    "if(${list_var})\n  set_tests_properties(\${${list_var}} PROPERTIES LABELS \"${labels}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_script})
endfunction()
