// ATTNAUDIT_HOST_DEVICE marks a function that is compiled for the host and,
// when the translation unit is compiled by nvcc, also for the GPU. Outside
// nvcc it expands to nothing, so core/ stays plain C++17 with no CUDA
// include: a core header written with it is the ONE source of arithmetic
// that the CPU path and the CUDA kernels (kernels/) share
// (docs/NUMERICS.md, "One source, every target").
//
// ATTNAUDIT_DEVICE_CODE is defined while nvcc compiles the device side of
// a translation unit (__CUDA_ARCH__): the few primitives whose spelling
// differs (a correctly rounded product that nvcc must not contract into an
// FMA, the device math library) branch on it; everything else is shared
// text.
#ifndef ATTNAUDIT_CORE_ARITHMETIC_HOST_DEVICE_H_
#define ATTNAUDIT_CORE_ARITHMETIC_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define ATTNAUDIT_HOST_DEVICE __host__ __device__
#else
#define ATTNAUDIT_HOST_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#define ATTNAUDIT_DEVICE_CODE 1
#endif

#endif  // ATTNAUDIT_CORE_ARITHMETIC_HOST_DEVICE_H_
