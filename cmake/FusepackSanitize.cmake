# Sanitizer and fuzzing builds. Both add their flags to the directory they are called from (the top level, before any
# add_subdirectory), so they reach fusepack's own targets and nothing else: the third-party libraries (LibTorch,
# GoogleTest, RapidCheck) are linked prebuilt, and only header-only ones (Eigen, nlohmann-json, CLI11) are compiled
# inside fusepack's sources, where a bug they expose is one fusepack would hit too.

# fusepack_sanitize(<sanitizers>): e.g. "address;undefined". Every UBSan report aborts (-fno-sanitize-recover), so a
# test cannot pass with one; frame pointers keep the reports' stacks whole at -O2.
function(fusepack_sanitize sanitizers)
  if(NOT sanitizers)
    return()
  endif()
  if(FUSEPACK_HAVE_CUDA)
    message(FATAL_ERROR "FUSEPACK_SANITIZE and FUSEPACK_FUZZ need -DFUSEPACK_WITH_CUDA=OFF: these sanitizers do not "
                        "instrument nvcc's code")
  endif()
  foreach(s IN LISTS sanitizers)
    if(NOT s MATCHES "^(address|undefined|leak)$")
      message(FATAL_ERROR "FUSEPACK_SANITIZE: unknown sanitizer '${s}' (known: address, undefined, leak)")
    endif()
  endforeach()
  list(JOIN sanitizers "," joined)
  set(flags -fsanitize=${joined} -fno-omit-frame-pointer)
  if("undefined" IN_LIST sanitizers)
    list(APPEND flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options(${flags})
  add_link_options(${flags})
  # GCC's ASan instrumentation makes -Wmaybe-uninitialized misfire inside libstdc++'s <regex> (safetensors.cpp); the
  # uninstrumented builds keep the warning.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND "address" IN_LIST sanitizers)
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
  message(STATUS "fusepack: sanitizers ${joined} on fusepack's targets")
endfunction()

# fusepack_fuzz_instrument(): libFuzzer's coverage instrumentation (without its main) plus ASan and UBSan on every
# fusepack target, so the libraries a fuzzer links are explored, not only the fuzzer's own source. Needs clang.
function(fusepack_fuzz_instrument)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FUSEPACK_FUZZ needs clang with libFuzzer (e.g. -DCMAKE_CXX_COMPILER=clang++); "
                        "the C++ compiler is ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER}")
  endif()
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer,address,undefined)
  check_cxx_source_compiles(
    "extern \"C\" int LLVMFuzzerTestOneInput(unsigned char const*, unsigned long) { return 0; }"
    FUSEPACK_HAVE_LIBFUZZER)
  if(NOT FUSEPACK_HAVE_LIBFUZZER)
    message(FATAL_ERROR "FUSEPACK_FUZZ: ${CMAKE_CXX_COMPILER} cannot link -fsanitize=fuzzer,address,undefined "
                        "(Debian: install libclang-rt-dev next to clang)")
  endif()
  fusepack_sanitize("address;undefined")
  add_compile_options(-fsanitize=fuzzer-no-link)
endfunction()

# fusepack_fuzzer(NAME <target> SOURCES <files...> [LIBS <targets...>]): a libFuzzer binary in bin/, one per parser,
# added to the fusepack-fuzzers target that ci/fuzz.sh builds.
function(fusepack_fuzzer)
  cmake_parse_arguments(F "" "NAME" "SOURCES;LIBS" ${ARGN})
  if(NOT F_NAME OR NOT F_SOURCES)
    message(FATAL_ERROR "fusepack_fuzzer needs NAME and SOURCES")
  endif()
  add_executable(${F_NAME} ${F_SOURCES})
  target_link_libraries(${F_NAME} PRIVATE ${F_LIBS})
  target_link_options(${F_NAME} PRIVATE -fsanitize=fuzzer)
  set_target_properties(${F_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
  fusepack_warnings(${F_NAME})
  add_dependencies(fusepack-fuzzers ${F_NAME})
endfunction()
