// SoftMetal's runtime header, the stand-in for <metal_stdlib>: the part of the Metal
// Shading Language library that compute kernels use, as C++17 for clang++, plus the fiber
// runtime that runs a threadgroup's GPU threads ("lanes") on one OS thread.
//
// It is written in parts by concern (the files of this folder, this one first), embedded
// in the SoftMetal module and joined in the order of KernelCompiler.runtimeParts, each
// after a `#line 1 "softmetal_runtime/<part>"`, so that clang's messages and the memory
// check's line tables name the part and its line. The joined text is written beside the
// compiled libraries as softmetal_runtime-<hash>.h, included first by every translated
// MSL source, and is part of the compile-cache key. Each part opens and closes the
// namespaces it uses.
//
// Layout of execution: a dispatch runs threadgroups; one threadgroup runs as N fibers on
// the calling OS thread, scheduled round-robin: a lane runs until it blocks (a barrier, a
// simd operation) or returns, then the next runnable lane in the run order continues.
// With SM_FLAG_RUN_AHEAD a simdgroup runs until all its lanes wait at a threadgroup
// barrier (or returned) before the next simdgroup (in forward or reverse order) starts.
// Collective operations complete eagerly in the lane that arrives last. Each lane's state
// (struct Lane) lives at the top of its stack block; stack blocks are aligned to their
// power-of-two size, so the running lane is found from the stack pointer (no TLS).
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <type_traits>

// The MSL version asked for (MTLCompileOptions.languageVersion), defined before this header
// by the compile: the runtime's version-gated parts (atomics.h) follow it as Apple's headers do.
#ifndef __SM_METAL_VERSION
#define __SM_METAL_VERSION 310
#endif
#define __METAL_VERSION__ __SM_METAL_VERSION
// MSL's address spaces as the translator writes them (`thread` is the default one). The
// build erases them: every pointer reaches all memory here, and clang++ could not copy an
// object out of another address space with C++'s implicit copy constructors. The
// address-space check (Compiler/AddressSpaceCheck.swift) compiles the same text with
// __SM_ADDRESS_SPACES, where they are clang address spaces, so that converting between
// them fails as with Apple's compiler. (On x86-64, address spaces 1-3 lower to ordinary
// loads and stores, and sanitizer coverage traces them; 256-258 are segment registers and
// 270-272 32-bit pointers.)
#ifdef __SM_ADDRESS_SPACES
#define __sm_device __attribute__((address_space(1)))
#define __sm_constant __attribute__((address_space(2)))
#define __sm_threadgroup __attribute__((address_space(3)))
#else
#define __sm_device
#define __sm_constant
#define __sm_threadgroup
#endif
#define __SOFTMETAL__ 1
#define METAL_FUNC inline __attribute__((always_inline))
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define HUGE_VALF (__builtin_inff())
#define MAXFLOAT 3.402823466e+38f
#define FLT_MAX 3.402823466e+38f
#define FLT_MIN 1.175494351e-38f
#define FLT_EPSILON 1.192092896e-07f
#define HALF_MAX ((half)65504.0f)
#define MAXHALF ((half)65504.0f)
#define HALF_MIN ((half)6.10351562e-5f)
#define HALF_EPSILON ((half)9.765625e-4f)
#define BFLOAT_MAX 3.38953139e+38f
#define CHAR_BIT 8
#define SCHAR_MAX 127
#define SCHAR_MIN (-128)
#define UCHAR_MAX 255
#define SHRT_MAX 32767
#define SHRT_MIN (-32768)
#define USHRT_MAX 65535
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define UINT_MAX 4294967295u
#define LONG_MAX 9223372036854775807L
#define LONG_MIN (-9223372036854775807L - 1)
#define ULONG_MAX 18446744073709551615UL
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.78539816339744830962f
#define M_1_PI_F 0.31830988618379067154f
#define M_2_PI_F 0.63661977236758134308f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.70710678118654752440f
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.43429448190325182765f
#define M_LN2_F 0.69314718055994530942f
#define M_LN10_F 2.30258509299404568402f
