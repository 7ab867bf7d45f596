// cp_async.cuh -- global-to-shared copies in flight (cp.async, sm_80+): 16 or 4 bytes a copy, zeros where the
// source is not valid (source size 0: nothing is read, so src may be any address inside its array). A thread's
// copies land in commit groups; cp_async_wait<N> returns when all but its latest N groups have landed. The
// emulator copies at once, so its commit and wait are empty.
#pragma once
#include "common.cuh"

static __device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#ifdef __CUEMU__
  *reinterpret_cast<uint4*>(dst) = valid ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
#else
  const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(valid ? 16 : 0));
#endif
}

static __device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
#ifdef __CUEMU__
  *reinterpret_cast<unsigned*>(dst) = valid ? *reinterpret_cast<const unsigned*>(src) : 0u;
#else
  const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(a), "l"(src), "r"(valid ? 4 : 0));
#endif
}

static __device__ __forceinline__ void cp_async_commit() {
#ifndef __CUEMU__
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
static __device__ __forceinline__ void cp_async_wait() {
#ifndef __CUEMU__
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
