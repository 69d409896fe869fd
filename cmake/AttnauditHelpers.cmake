# attnaudit_cc_library(NAME name SRCS ... HDRS ... DEPS ...)
# Defines attnaudit_<name> with the alias attnaudit::<name>. Headers are
# included as "core/<component>/<file>.h" from the repository root.
function(attnaudit_cc_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;HDRS;DEPS" ${ARGN})
  set(target attnaudit_${A_NAME})
  if(A_SRCS)
    add_library(${target} STATIC ${A_SRCS} ${A_HDRS})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
    target_link_libraries(${target} PUBLIC ${A_DEPS})
    # The numerical core is hot: GCC 12 vectorises runtime-length loops
    # only at -O3.
    string(FIND "${CMAKE_CURRENT_SOURCE_DIR}" "${PROJECT_SOURCE_DIR}/core/" in_core)
    if(in_core EQUAL 0)
      target_compile_options(${target} PRIVATE
        $<$<CONFIG:RelWithDebInfo,Release>:-O3>)
    endif()
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${target} INTERFACE ${A_DEPS})
  endif()
  add_library(attnaudit::${A_NAME} ALIAS ${target})
endfunction()

# attnaudit_cc_test(NAME name SRCS ... DEPS ... [LABELS ...] [POSTGRES])
# POSTGRES: the test runs under pg_virtualenv, in a throwaway PostgreSQL
# cluster on a free loopback port (PG* variables name it).
function(attnaudit_cc_test)
  cmake_parse_arguments(A "POSTGRES" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(${A_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  if(A_POSTGRES)
    add_test(NAME ${A_NAME} COMMAND ${ATTNAUDIT_PG_VIRTUALENV} -v 15
             $<TARGET_FILE:${A_NAME}>)
    # pg_virtualenv's cluster has one name and port: one such test at a time.
    set_tests_properties(${A_NAME} PROPERTIES RESOURCE_LOCK pg_virtualenv)
  else()
    add_test(NAME ${A_NAME} COMMAND ${A_NAME})
  endif()
  if(A_LABELS)
    set_tests_properties(${A_NAME} PROPERTIES LABELS "${A_LABELS}")
  endif()
endfunction()


# attnaudit_simd_sources(TARGET target SRCS ...)
# Sources written over Highway with runtime dispatch (they include
# "hwy/foreach_target.h"). They are compiled for a fixed baseline, whatever
# ATTNAUDIT_NATIVE_ARCH says, so the same binary carries the SSE4, AVX2 and
# AVX-512 versions and picks one per CPU at run time: a portable build is
# as fast as a native one, and tests can run every target on one machine.
# A project may set ATTNAUDIT_SIMD_EXTRA_OPTIONS (a list) for these sources
# alone; they come after the target's options (the fuzz build's use).
function(attnaudit_simd_sources)
  cmake_parse_arguments(A "" "TARGET" "SRCS" ${ARGN})
  set(options -march=x86-64-v2 -mpclmul -maes ${ATTNAUDIT_SIMD_EXTRA_OPTIONS})
  set_source_files_properties(${A_SRCS} TARGET_DIRECTORY ${A_TARGET}
    PROPERTIES COMPILE_OPTIONS "${options}")
  target_compile_definitions(${A_TARGET} PRIVATE
    "HWY_DISABLED_TARGETS=(HWY_SSSE3|HWY_AVX3_DL|HWY_EMU128|HWY_SCALAR)")
  target_link_libraries(${A_TARGET} PUBLIC attnaudit::hwy_headers)
endfunction()
