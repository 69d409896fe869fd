# attnaudit_describe_backends(OUT_VAR)
# Sets OUT_VAR to one line naming the backends this configuration builds and
# why, e.g.
#   backends: CPU on (always; -march=native); CUDA off (AUTO: nvcc not found)
# Reads ATTNAUDIT_ENABLE_CUDA, ATTNAUDIT_CUDA (the decision),
# CMAKE_CUDA_ARCHITECTURES, ATTNAUDIT_NCCL and ATTNAUDIT_NATIVE_ARCH; runs
# `nvcc --version` for the version.
function(attnaudit_describe_backends out_var)
  if(ATTNAUDIT_NATIVE_ARCH)
    set(arch "-march=native")
  else()
    set(arch "portable -march=x86-64-v2")
  endif()
  set(line "backends: CPU on (always; ${arch}, SIMD width picked at run time)")

  set(nvcc "nvcc")
  set(nvcc_path "${CMAKE_CUDA_COMPILER}")
  if(NOT nvcc_path AND CUDAToolkit_NVCC_EXECUTABLE)
    set(nvcc_path "${CUDAToolkit_NVCC_EXECUTABLE}")
  endif()
  if(nvcc_path)
    execute_process(COMMAND ${nvcc_path} --version
                    OUTPUT_VARIABLE nvcc_out ERROR_QUIET
                    RESULT_VARIABLE nvcc_rc TIMEOUT 30)
    if(nvcc_rc EQUAL 0 AND nvcc_out MATCHES "release ([0-9]+\\.[0-9]+)")
      set(nvcc "nvcc ${CMAKE_MATCH_1}")
    endif()
  endif()
  if(ATTNAUDIT_ENABLE_CUDA STREQUAL "AUTO")
    set(why "AUTO")
  else()
    set(why "ATTNAUDIT_ENABLE_CUDA=${ATTNAUDIT_ENABLE_CUDA}")
  endif()

  if(ATTNAUDIT_CUDA)
    if(ATTNAUDIT_NCCL)
      set(nccl "NCCL found: the ring spans GPUs")
    else()
      set(nccl "NCCL not found: one GPU per ring")
    endif()
    string(APPEND line ", CUDA on (${why}: ${nvcc} found; kernels for "
           "CUDA architectures ${CMAKE_CUDA_ARCHITECTURES}; ${nccl}; the "
           "server still audits on the CPU unless started with "
           "--devices=all or a GPU list)")
  elseif(ATTNAUDIT_ENABLE_CUDA STREQUAL "AUTO")
    string(APPEND line ", CUDA off (AUTO: nvcc not found)")
  else()
    string(APPEND line ", CUDA off (${why})")
  endif()
  set(${out_var} "${line}" PARENT_SCOPE)
endfunction()
