# libFuzzer fuzz targets (CELLM_FUZZ=ON): clang only, always under ASan + UBSan.
# Every object cellm compiles gets libFuzzer's coverage instrumentation
# (-fsanitize=fuzzer-no-link); the targets themselves link libFuzzer's main.
#
# cellm_add_fuzz_target(<name> SOURCES <files...> LIBS <libs...> [DICT <file>]) adds the
# executable fuzz_<name> and the ctest test fuzz_<name> (label `fuzz`), which runs
# it for CELLM_FUZZ_SECONDS over tests/fuzz/corpus/<name>/ (the seeds, read only)
# and a working corpus in the build folder, and fails on any crash, sanitizer
# report, leak or input slower than CELLM_FUZZ_TIMEOUT seconds. Crash inputs are
# written to <build>/tests/fuzz/artifacts/. DICT names a libFuzzer dictionary
# (tokens the mutations insert).
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "CELLM_FUZZ=ON needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: "
                      "configure with -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
endif()
if(CELLM_SANITIZE STREQUAL "")
  set(CELLM_SANITIZE "address" CACHE STRING "Sanitizers" FORCE)
elseif(NOT CELLM_SANITIZE STREQUAL "address")
  message(FATAL_ERROR "CELLM_FUZZ=ON runs under ASan + UBSan: CELLM_SANITIZE must be 'address'")
endif()
set(CELLM_FUZZ_SECONDS 30 CACHE STRING "Seconds each `ctest -L fuzz` test fuzzes")
# Above the chat template's 10 s render bound (an input that reaches it is a
# bounded render, not a hang).
set(CELLM_FUZZ_TIMEOUT 25 CACHE STRING "Seconds one fuzz input may take before it fails the run")
add_compile_options(-fsanitize=fuzzer-no-link)

function(cellm_add_fuzz_target name)
  cmake_parse_arguments(ARG "" "DICT" "SOURCES;LIBS" ${ARGN})
  set(target fuzz_${name})
  add_executable(${target} ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE ${ARG_LIBS} cellm_warnings)
  target_link_options(${target} PRIVATE -fsanitize=fuzzer)
  add_dependencies(fuzz_targets ${target})
  set(seeds ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/${name})
  set(work ${CMAKE_BINARY_DIR}/tests/fuzz/corpus/${name})
  set(artifacts ${CMAKE_BINARY_DIR}/tests/fuzz/artifacts)
  file(MAKE_DIRECTORY ${work} ${artifacts})
  set(dict_option "")
  if(ARG_DICT)
    set(dict_option -dict=${ARG_DICT})
  endif()
  # New inputs go to the first folder (the working corpus), never to the seeds.
  add_test(NAME ${target}
    COMMAND ${target} -max_total_time=${CELLM_FUZZ_SECONDS} -timeout=${CELLM_FUZZ_TIMEOUT}
            -rss_limit_mb=2560 -max_len=65536 -print_final_stats=1 ${dict_option}
            -artifact_prefix=${artifacts}/${name}- ${work} ${seeds})
  set_tests_properties(${target} PROPERTIES
    LABELS fuzz
    TIMEOUT 600
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endfunction()
