// cuemu_types.h -- part of cuemu.h (the CPU emulator); included only by cuemu.h, in its order.
// CUDA keywords, vector types, dim3 and the built-in index variables.
#ifndef CUEMU_TYPES_H_INCLUDED
#define CUEMU_TYPES_H_INCLUDED

// ---------------------------------------------------------------------------
// CUDA keywords
// ---------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __constant__
#define __managed__
#define __shared__ static __attribute__((section("cuemu_shared")))
#define __grid_constant__
// __restrict__ is a native g++ keyword.

#ifndef CUDART_VERSION
#define CUDART_VERSION 12090
#endif

// ---------------------------------------------------------------------------
// Vector types, dim3
// ---------------------------------------------------------------------------
#define CUEMU_VEC2(T, N, A) struct __attribute__((aligned(A))) N { T x, y; }; \
  static inline N make_##N(T x, T y) { N r; r.x = x; r.y = y; return r; }
#define CUEMU_VEC3(T, N) struct N { T x, y, z; }; \
  static inline N make_##N(T x, T y, T z) { N r; r.x = x; r.y = y; r.z = z; return r; }
#define CUEMU_VEC4(T, N, A) struct __attribute__((aligned(A))) N { T x, y, z, w; }; \
  static inline N make_##N(T x, T y, T z, T w) { N r; r.x = x; r.y = y; r.z = z; r.w = w; return r; }

CUEMU_VEC2(float, float2, 8)
CUEMU_VEC3(float, float3)
CUEMU_VEC4(float, float4, 16)
CUEMU_VEC2(int, int2, 8)
CUEMU_VEC3(int, int3)
CUEMU_VEC4(int, int4, 16)
CUEMU_VEC2(unsigned int, uint2, 8)
CUEMU_VEC3(unsigned int, uint3)
CUEMU_VEC4(unsigned int, uint4, 16)
CUEMU_VEC2(signed char, char2, 2)
CUEMU_VEC4(signed char, char4, 4)
CUEMU_VEC2(unsigned char, uchar2, 2)
CUEMU_VEC4(unsigned char, uchar4, 4)
CUEMU_VEC2(short, short2, 4)
CUEMU_VEC4(short, short4, 8)
CUEMU_VEC2(unsigned short, ushort2, 4)
CUEMU_VEC4(unsigned short, ushort4, 8)
CUEMU_VEC2(double, double2, 16)
CUEMU_VEC2(long long, longlong2, 16)
CUEMU_VEC2(unsigned long long, ulonglong2, 16)
#undef CUEMU_VEC2
#undef CUEMU_VEC3
#undef CUEMU_VEC4

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// Set by the scheduler before a fiber is switched in.
inline uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;
static constexpr int warpSize = 32;

#endif  // CUEMU_TYPES_H_INCLUDED
