// cuemu.h -- run unmodified CUDA C kernels on the CPU (the `sim` backend).
//
// The Python build step (cupyglm/kernels/sim_build.py) compiles a `.cu` file
// as C++17 with
//
//     g++ -std=c++17 -O2 -fno-fast-math -ffp-contract=off -fPIC -shared
//         -D__CUEMU__ -include cuda_src/sim/cuemu.h ...
//
// and appends one C-ABI trampoline per `extern "C" __global__` kernel.
//
// Execution model
//   * One OS thread runs everything.  Each CUDA thread of a block is a
//     cooperative fiber with its own stack (default 64 KiB, env CUEMU_STACK_KB,
//     a PROT_NONE guard page below each stack).  Stacks are allocated once and
//     reused for every block and launch.
//   * The scheduler runs the runnable fibers of a block in the selected order
//     (forward / reverse / shuffled) until each blocks at a barrier, at a warp
//     operation, or exits.  __syncthreads() releases when every thread of the
//     block waits at the same call site (file:line); anything else (threads
//     exited, different call sites, a warp op that can never complete) is a
//     deadlock and is reported, never hangs.
//   * Warp operations (__shfl*_sync, __ballot_sync, __any_sync, __all_sync,
//     __syncwarp) rendezvous the lanes named by the mask (restricted to lanes
//     that exist in a partial last warp) and follow PTX `shfl.sync` semantics
//     exactly, including `width` segments.
//   * Blocks run one after another, in forward / reverse / shuffled order.
//   * `__shared__` is `static` storage placed in the `cuemu_shared` section;
//     the whole section is filled with 0xFF before every block.  Dynamic shared
//     memory (`extern __shared__ T name[];`, rewritten by the build step into
//     `T* const name = (T*)::cuemu::dynamic_smem();`) lives at a fixed address
//     reserved at load time; the first `shared_mem` bytes are made accessible
//     and filled with 0xFF before every block, the pages after them are
//     PROT_NONE.
//   * Atomics are plain read-modify-write: a fiber never yields inside one.
//   * Float arithmetic is plain IEEE binary32 without FMA contraction, i.e.
//     what NVRTC produces with --fmad=false.  Transcendentals (expf, __expf,
//     tanhf, ...) use glibc and are NOT bit-identical to the GPU.  rsqrtf(x) is
//     1.0f / sqrtf(x) here; the GPU's rsqrtf is approximate -- kernels whose
//     bits must match the CPU reference must write 1.0f / sqrtf(x) themselves.
#ifndef CUEMU_H_INCLUDED
#define CUEMU_H_INCLUDED

#ifndef __CUEMU__
#define __CUEMU__ 1
#endif

#include <math.h>
#include <cmath>
#include <cstdint>
#include <cstddef>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <climits>
#include <cfloat>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__) || defined(CUEMU_USE_UCONTEXT)
#include <ucontext.h>
#define CUEMU_UCONTEXT 1
#endif

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

// ---------------------------------------------------------------------------
// Bit casts and integer intrinsics
// ---------------------------------------------------------------------------
namespace cuemu {
template <class To, class From>
static inline To bitcast(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "bitcast size mismatch");
  To t;
  std::memcpy(&t, &f, sizeof(To));
  return t;
}
}  // namespace cuemu

static inline int __float_as_int(float x) { return cuemu::bitcast<int>(x); }
static inline unsigned int __float_as_uint(float x) { return cuemu::bitcast<unsigned int>(x); }
static inline float __int_as_float(int x) { return cuemu::bitcast<float>(x); }
static inline float __uint_as_float(unsigned int x) { return cuemu::bitcast<float>(x); }
static inline long long __double_as_longlong(double x) { return cuemu::bitcast<long long>(x); }
static inline double __longlong_as_double(long long x) { return cuemu::bitcast<double>(x); }

static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned int __brev(unsigned int x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
  x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
  return (x >> 16) | (x << 16);
}
static inline unsigned long long __brevll(unsigned long long x) {
  return ((unsigned long long)__brev((unsigned)x) << 32) | __brev((unsigned)(x >> 32));
}
static inline unsigned int __umulhi(unsigned int a, unsigned int b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

// ---------------------------------------------------------------------------
// Math
// ---------------------------------------------------------------------------
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline unsigned int min(int a, unsigned int b) { return min((unsigned)a, b); }
static inline unsigned int max(int a, unsigned int b) { return max((unsigned)a, b); }
static inline unsigned int min(unsigned int a, int b) { return min(a, (unsigned)b); }
static inline unsigned int max(unsigned int a, int b) { return max(a, (unsigned)b); }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
static inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// glibc declares these names itself (same functions); map them to the libm calls.
#define __expf expf
#define __exp10f exp10f
#define __logf logf
#define __log2f log2f
#define __log10f log10f
#define __sinf sinf
#define __cosf cosf
#define __tanf tanf
#define __powf powf
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }  // NaN -> 0
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float2int_ru(float x) { return (int)ceilf(x); }
static inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
static inline unsigned __float2uint_rz(float x) { return (unsigned)x; }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __uint2float_rn(unsigned x) { return (float)x; }
static inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
static inline long long __float2ll_rz(float x) { return (long long)x; }

// ---------------------------------------------------------------------------
// bfloat16, bit-exact with cuda_bf16.h
// ---------------------------------------------------------------------------
struct __nv_bfloat16_raw { unsigned short x; };
struct __nv_bfloat16;
static inline __nv_bfloat16 __float2bfloat16(float f);
static inline float __bfloat162float(__nv_bfloat16 h);

struct __attribute__((aligned(2))) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  inline __nv_bfloat16(float f);
  inline __nv_bfloat16(double f);
  inline __nv_bfloat16(int v);
  inline __nv_bfloat16(unsigned int v);
  inline __nv_bfloat16(long long v);
  inline __nv_bfloat16(unsigned long long v);
  inline __nv_bfloat16(short v);
  inline __nv_bfloat16(unsigned short v);
  inline operator float() const;
  operator __nv_bfloat16_raw() const { __nv_bfloat16_raw r; r.x = __x; return r; }
  __nv_bfloat16& operator=(const __nv_bfloat16_raw& r) { __x = r.x; return *this; }
  inline __nv_bfloat16& operator=(float f);
  inline __nv_bfloat16& operator=(double f);
};
typedef __nv_bfloat16 nv_bfloat16;

struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
typedef __nv_bfloat162 nv_bfloat162;

namespace cuemu {
static inline unsigned short f32_to_bf16_rn(float f) {
  unsigned int u = bitcast<unsigned int>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN -> canonical quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                       // round to nearest, ties to even
  return (unsigned short)(u >> 16);
}
static inline unsigned short f32_to_bf16_rz(float f) {
  unsigned int u = bitcast<unsigned int>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (unsigned short)(u >> 16);
}
static inline __nv_bfloat16 bf16_from_bits(unsigned short b) {
  __nv_bfloat16_raw r;
  r.x = b;
  return __nv_bfloat16(r);
}
// double -> bf16 with a single rounding (as cuda_bf16.hpp __double2bfloat16).
static inline unsigned short f64_to_bf16_rn(double d) {
  if (std::isnan(d)) return 0x7fffu;
  float f = (float)d;  // may round; fix up the sticky bit so the second rounding is exact
  double back = (double)f;
  unsigned int u = bitcast<unsigned int>(f);
  if (back != d && std::isfinite(f) && (u & 0xffffu) == 0x8000u) {
    // f landed exactly on a bf16 tie although d is not a tie: nudge towards d.
    if ((back < d) == (f > 0)) u += 1; else u -= 1;
    f = bitcast<float>(u);
  }
  return f32_to_bf16_rn(f);
}
}  // namespace cuemu

static inline __nv_bfloat16 __float2bfloat16(float f) { return cuemu::bf16_from_bits(cuemu::f32_to_bf16_rn(f)); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return cuemu::bf16_from_bits(cuemu::f32_to_bf16_rn(f)); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) { return cuemu::bf16_from_bits(cuemu::f32_to_bf16_rz(f)); }
static inline __nv_bfloat16 __double2bfloat16(double d) { return cuemu::bf16_from_bits(cuemu::f64_to_bf16_rn(d)); }
static inline float __bfloat162float(__nv_bfloat16 h) { return cuemu::bitcast<float>((unsigned int)h.__x << 16); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline short __bfloat16_as_short(__nv_bfloat16 h) { return (short)h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return cuemu::bf16_from_bits(b); }
static inline __nv_bfloat16 __short_as_bfloat16(short b) { return cuemu::bf16_from_bits((unsigned short)b); }
static inline __nv_bfloat16 __int2bfloat16_rn(int v) { return __double2bfloat16((double)v); }
static inline __nv_bfloat16 __uint2bfloat16_rn(unsigned v) { return __double2bfloat16((double)v); }
static inline __nv_bfloat16 __ll2bfloat16_rn(long long v) { return __double2bfloat16((double)v); }
static inline __nv_bfloat16 __ull2bfloat16_rn(unsigned long long v) { return __double2bfloat16((double)v); }
static inline int __bfloat162int_rz(__nv_bfloat16 h) { return (int)__bfloat162float(h); }
static inline int __bfloat162int_rn(__nv_bfloat16 h) { return (int)nearbyintf(__bfloat162float(h)); }

inline __nv_bfloat16::__nv_bfloat16(float f) : __x(cuemu::f32_to_bf16_rn(f)) {}
inline __nv_bfloat16::__nv_bfloat16(double f) : __x(cuemu::f64_to_bf16_rn(f)) {}
inline __nv_bfloat16::__nv_bfloat16(int v) : __x(cuemu::f64_to_bf16_rn((double)v)) {}
inline __nv_bfloat16::__nv_bfloat16(unsigned int v) : __x(cuemu::f64_to_bf16_rn((double)v)) {}
inline __nv_bfloat16::__nv_bfloat16(long long v) : __x(cuemu::f64_to_bf16_rn((double)v)) {}
inline __nv_bfloat16::__nv_bfloat16(unsigned long long v) : __x(cuemu::f64_to_bf16_rn((double)v)) {}
inline __nv_bfloat16::__nv_bfloat16(short v) : __x(cuemu::f32_to_bf16_rn((float)v)) {}
inline __nv_bfloat16::__nv_bfloat16(unsigned short v) : __x(cuemu::f32_to_bf16_rn((float)v)) {}
inline __nv_bfloat16::operator float() const { return __bfloat162float(*this); }
inline __nv_bfloat16& __nv_bfloat16::operator=(float f) { __x = cuemu::f32_to_bf16_rn(f); return *this; }
inline __nv_bfloat16& __nv_bfloat16::operator=(double f) { __x = cuemu::f64_to_bf16_rn(f); return *this; }

// Arithmetic: computed in float, rounded once to bf16 (float has >= 2p+2 bits,
// so this equals the correctly rounded bf16 result for + - * /).
static inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(__bfloat162float(a) + __bfloat162float(b)); }
static inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(__bfloat162float(a) - __bfloat162float(b)); }
static inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(__bfloat162float(a) * __bfloat162float(b)); }
static inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(__bfloat162float(a) / __bfloat162float(b)); }
// fma: a*b is exact in double; one rounding to double then one to bf16.  This
// can differ from a single rounding only when c is < 2^-37 relative; documented.
static inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  return __double2bfloat16((double)__bfloat162float(a) * (double)__bfloat162float(b) + (double)__bfloat162float(c));
}
static inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return cuemu::bf16_from_bits((unsigned short)(a.__x ^ 0x8000u)); }
static inline __nv_bfloat16 __habs(__nv_bfloat16 a) { return cuemu::bf16_from_bits((unsigned short)(a.__x & 0x7fffu)); }
static inline bool __hisnan(__nv_bfloat16 a) { return (a.__x & 0x7fffu) > 0x7f80u; }
static inline int __hisinf(__nv_bfloat16 a) { return a.__x == 0x7f80u ? 1 : (a.__x == 0xff80u ? -1 : 0); }
static inline __nv_bfloat16 __hmax(__nv_bfloat16 a, __nv_bfloat16 b) {
  if (__hisnan(a) && __hisnan(b)) return cuemu::bf16_from_bits(0x7fffu);
  return __float2bfloat16(fmaxf(__bfloat162float(a), __bfloat162float(b)));
}
static inline __nv_bfloat16 __hmin(__nv_bfloat16 a, __nv_bfloat16 b) {
  if (__hisnan(a) && __hisnan(b)) return cuemu::bf16_from_bits(0x7fffu);
  return __float2bfloat16(fminf(__bfloat162float(a), __bfloat162float(b)));
}
static inline bool __heq(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) == __bfloat162float(b); }
static inline bool __hne(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) != __bfloat162float(b); }
static inline bool __hlt(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) < __bfloat162float(b); }
static inline bool __hle(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) <= __bfloat162float(b); }
static inline bool __hgt(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) > __bfloat162float(b); }
static inline bool __hge(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) >= __bfloat162float(b); }

static inline __nv_bfloat16 operator+(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hadd(a, b); }
static inline __nv_bfloat16 operator-(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hsub(a, b); }
static inline __nv_bfloat16 operator*(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hmul(a, b); }
static inline __nv_bfloat16 operator/(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hdiv(a, b); }
static inline __nv_bfloat16& operator+=(__nv_bfloat16& a, const __nv_bfloat16& b) { a = __hadd(a, b); return a; }
static inline __nv_bfloat16& operator-=(__nv_bfloat16& a, const __nv_bfloat16& b) { a = __hsub(a, b); return a; }
static inline __nv_bfloat16& operator*=(__nv_bfloat16& a, const __nv_bfloat16& b) { a = __hmul(a, b); return a; }
static inline __nv_bfloat16& operator/=(__nv_bfloat16& a, const __nv_bfloat16& b) { a = __hdiv(a, b); return a; }
static inline __nv_bfloat16 operator+(const __nv_bfloat16& a) { return a; }
static inline __nv_bfloat16 operator-(const __nv_bfloat16& a) { return __hneg(a); }
static inline bool operator==(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __heq(a, b); }
static inline bool operator!=(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hne(a, b); }
static inline bool operator<(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hlt(a, b); }
static inline bool operator<=(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hle(a, b); }
static inline bool operator>(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hgt(a, b); }
static inline bool operator>=(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hge(a, b); }

static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { __nv_bfloat162 r; r.x = a; r.y = b; return r; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __halves2bfloat162(__float2bfloat16(a), __float2bfloat16(b)); }
static inline __nv_bfloat162 __float2bfloat162_rn(float a) { return __floats2bfloat162_rn(a, a); }
static inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __halves2bfloat162(a, a); }
static inline float2 __bfloat1622float2(__nv_bfloat162 v) { return make_float2(__bfloat162float(v.x), __bfloat162float(v.y)); }
static inline float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
static inline float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }
static inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 v) { return v.x; }
static inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 v) { return v.y; }
static inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) { return __halves2bfloat162(__hadd(a.x, b.x), __hadd(a.y, b.y)); }
static inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) { return __halves2bfloat162(__hmul(a.x, b.x), __hmul(a.y, b.y)); }
static inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) { return __halves2bfloat162(__hsub(a.x, b.x), __hsub(a.y, b.y)); }

#define CUDART_INF_BF16 __ushort_as_bfloat16((unsigned short)0x7F80U)
#define CUDART_NAN_BF16 __ushort_as_bfloat16((unsigned short)0x7FFFU)
#define CUDART_MAX_NORMAL_BF16 __ushort_as_bfloat16((unsigned short)0x7F7FU)
#define CUDART_ZERO_BF16 __ushort_as_bfloat16((unsigned short)0x0000U)
#define CUDART_ONE_BF16 __ushort_as_bfloat16((unsigned short)0x3F80U)

// ---------------------------------------------------------------------------
// Atomics: plain read-modify-write (one OS thread; fibers never yield inside).
// ---------------------------------------------------------------------------
#define CUEMU_ATOMIC_INT(T)                                                       \
  static inline T atomicAdd(T* p, T v) { T o = *p; *p = (T)(o + v); return o; }  \
  static inline T atomicSub(T* p, T v) { T o = *p; *p = (T)(o - v); return o; }  \
  static inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }          \
  static inline T atomicMax(T* p, T v) { T o = *p; if (v > o) *p = v; return o; } \
  static inline T atomicMin(T* p, T v) { T o = *p; if (v < o) *p = v; return o; } \
  static inline T atomicAnd(T* p, T v) { T o = *p; *p = (T)(o & v); return o; }  \
  static inline T atomicOr(T* p, T v) { T o = *p; *p = (T)(o | v); return o; }   \
  static inline T atomicXor(T* p, T v) { T o = *p; *p = (T)(o ^ v); return o; }  \
  static inline T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
CUEMU_ATOMIC_INT(int)
CUEMU_ATOMIC_INT(unsigned int)
CUEMU_ATOMIC_INT(unsigned long long)
CUEMU_ATOMIC_INT(long long)
#undef CUEMU_ATOMIC_INT
static inline float atomicAdd(float* p, float v) { float o = *p; *p = o + v; return o; }
static inline double atomicAdd(double* p, double v) { double o = *p; *p = o + v; return o; }
static inline float atomicExch(float* p, float v) { float o = *p; *p = v; return o; }
static inline unsigned int atomicInc(unsigned int* p, unsigned int v) { unsigned o = *p; *p = (o >= v) ? 0u : o + 1u; return o; }
static inline unsigned int atomicDec(unsigned int* p, unsigned int v) { unsigned o = *p; *p = (o == 0u || o > v) ? v : o - 1u; return o; }
#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd

static inline void __threadfence() {}
static inline void __threadfence_block() {}
static inline void __threadfence_system() {}
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __ldcs(const T* p) { return *p; }
template <class T> static inline void __stcs(T* p, T v) { *p = v; }
#define __trap() __builtin_trap()
#define __brkpt() __builtin_trap()

// ---------------------------------------------------------------------------
// Fiber scheduler
// ---------------------------------------------------------------------------
namespace cuemu {

enum FiberState { F_RUNNABLE = 0, F_BARRIER = 1, F_WARP = 2, F_DONE = 3 };
enum WarpOp { W_SYNC = 0, W_SHFL_IDX, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR, W_BALLOT, W_ANY, W_ALL };
enum BarKind { B_SYNC = 0, B_COUNT, B_AND, B_OR };
enum Status { ST_OK = 0, ST_DEADLOCK = 1, ST_KERNEL_ERROR = 2, ST_LAUNCH_ERROR = 3 };

static const char* const kWarpOpName[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                           "__shfl_xor_sync", "__ballot_sync", "__any_sync", "__all_sync"};
static const char* const kBarName[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or"};

struct Fiber {
  void* sp;  // saved stack pointer (asm switch)
#ifdef CUEMU_UCONTEXT
  ucontext_t uc;
#endif
  char* stack_lo;  // lowest usable address (guard page is just below)
  int state;
  unsigned tid, lane;
  uint3 idx;
  // barrier
  int bkind;
  int bpred;
  const char* bfile;
  int bline;
  // warp operation
  int wop;
  unsigned wmask;
  int wwidth;
  unsigned wparam;
  unsigned long long wval;
  unsigned long long wres;
  const char* wfile;
  int wline;
};

struct Runtime {
  std::vector<Fiber> fibers;
  char* stack_region = nullptr;
  size_t stack_region_size = 0;
  size_t stack_size = 0;  // usable bytes per fiber
  size_t page = 4096;
  void* sched_sp = nullptr;
#ifdef CUEMU_UCONTEXT
  ucontext_t sched_uc;
#endif
  Fiber* cur = nullptr;
  void (*thunk)(void*) = nullptr;
  void* thunk_ctx = nullptr;
  int order = 0;
  unsigned long long seed = 0;
  unsigned long long rng = 0;
  int fatal = 0;
  std::string err;
  const char* kernel = "";
  // dynamic shared memory: fixed address reservation
  char* dyn_base = nullptr;
  size_t dyn_reserved = 0;
  size_t dyn_rw = 0;
  // crash reporting
  char* crash_area = nullptr;
  size_t crash_len = 0;
  uintptr_t arena_base = 0;
  size_t arena_size = 0;
  bool in_block = false;
  int altstack_ready = 0;
};

inline Runtime rt;
static constexpr size_t kMaxDynSmem = 256 * 1024;

// The linker defines __start_/__stop_ for the section; the anchor makes sure
// the section exists even when a kernel file declares no __shared__ variable.
static char cuemu_shared_anchor __attribute__((section("cuemu_shared"), used));
extern "C" char __start_cuemu_shared[];
extern "C" char __stop_cuemu_shared[];

static inline char* dynamic_smem_base() {
  if (!rt.dyn_base) {
    long pg = sysconf(_SC_PAGESIZE);
    rt.page = pg > 0 ? (size_t)pg : 4096;
    rt.dyn_reserved = kMaxDynSmem + rt.page;
    void* p = mmap(nullptr, rt.dyn_reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("cuemu: mmap dynamic shared memory"); abort(); }
    rt.dyn_base = (char*)p;
  }
  return rt.dyn_base;
}
// Target of the build step's rewrite of `extern __shared__ T name[];`.
static inline void* dynamic_smem() { return dynamic_smem_base(); }

static inline unsigned long long next_rand() {  // splitmix64
  unsigned long long z = (rt.rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

template <class V>
static inline void apply_order(V& v, int order) {
  size_t n = v.size();
  if (order == 1) {
    for (size_t i = 0; i < n / 2; ++i) std::swap(v[i], v[n - 1 - i]);
  } else if (order == 2) {
    for (size_t i = n; i > 1; --i) std::swap(v[i - 1], v[next_rand() % i]);
  }
}

static inline void set_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void set_error(const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  rt.err = buf;
}

}  // namespace cuemu

// --- context switch --------------------------------------------------------
#ifndef CUEMU_UCONTEXT
extern "C" void cuemu_ctx_switch(void** save_sp, void* load_sp) __attribute__((visibility("hidden")));
extern "C" void cuemu_ctx_entry(void) __attribute__((visibility("hidden")));
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".globl cuemu_ctx_switch\n"
    ".hidden cuemu_ctx_switch\n"
    ".type cuemu_ctx_switch,@function\n"
    "cuemu_ctx_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size cuemu_ctx_switch,.-cuemu_ctx_switch\n"
    ".p2align 4\n"
    ".globl cuemu_ctx_entry\n"
    ".hidden cuemu_ctx_entry\n"
    ".type cuemu_ctx_entry,@function\n"
    "cuemu_ctx_entry:\n"
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    ".size cuemu_ctx_entry,.-cuemu_ctx_entry\n");
#endif

namespace cuemu {

// Fiber side: give control back to the scheduler.
static inline void yield_to_scheduler() {
  Fiber* f = rt.cur;
#ifdef CUEMU_UCONTEXT
  swapcontext(&f->uc, &rt.sched_uc);
#else
  cuemu_ctx_switch(&f->sp, rt.sched_sp);
#endif
}

// Scheduler side: run fiber f until it yields.
static inline void resume(Fiber* f) {
  rt.cur = f;
  threadIdx = f->idx;
#ifdef CUEMU_UCONTEXT
  swapcontext(&rt.sched_uc, &f->uc);
#else
  cuemu_ctx_switch(&rt.sched_sp, f->sp);
#endif
}

[[noreturn]] static inline void kernel_error_in_fiber() {
  rt.fatal = ST_KERNEL_ERROR;
  yield_to_scheduler();
  __builtin_unreachable();
}

static void fiber_main(void* arg) {
  Fiber* f = (Fiber*)arg;
  rt.thunk(rt.thunk_ctx);
  f->state = F_DONE;
  yield_to_scheduler();
  __builtin_unreachable();
}

#ifdef CUEMU_UCONTEXT
static void fiber_main_uc() { fiber_main(rt.cur); }
#endif

static inline void init_fiber(Fiber* f) {
#ifdef CUEMU_UCONTEXT
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = f->stack_lo;
  f->uc.uc_stack.ss_size = rt.stack_size;
  f->uc.uc_link = nullptr;
  makecontext(&f->uc, (void (*)())fiber_main_uc, 0);
#else
  // Stagger the stack tops by a few cache lines per fiber: stacks are page
  // aligned, and identical page offsets would put every fiber's hot frame in
  // the same L1 set.
  uintptr_t stagger = (uintptr_t)((f->tid * 7u) % 61u) * 64u;
  uintptr_t top = ((uintptr_t)f->stack_lo + rt.stack_size - stagger) & ~(uintptr_t)15;
  void** sp = (void**)(top - 72);
  sp[0] = nullptr;                      // r15
  sp[1] = nullptr;                      // r14
  sp[2] = (void*)&fiber_main;           // r13 -> function
  sp[3] = (void*)f;                     // r12 -> argument
  sp[4] = nullptr;                      // rbx
  sp[5] = nullptr;                      // rbp
  sp[6] = (void*)&cuemu_ctx_entry;      // return address
  f->sp = (void*)sp;
#endif
}

static inline bool ensure_stacks(size_t n) {
  if (rt.fibers.size() >= n && rt.stack_region) return true;
  long pg = sysconf(_SC_PAGESIZE);
  rt.page = pg > 0 ? (size_t)pg : 4096;
  if (rt.stack_size == 0) {
    size_t kb = 64;
    if (const char* e = getenv("CUEMU_STACK_KB")) { long v = atol(e); if (v >= 16) kb = (size_t)v; }
    rt.stack_size = (kb * 1024 + rt.page - 1) / rt.page * rt.page;
  }
  size_t want = n < 32 ? 32 : n;
  if (rt.stack_region) munmap(rt.stack_region, rt.stack_region_size);
  size_t per = rt.stack_size + rt.page;  // guard page + stack
  rt.stack_region_size = per * want;
  void* p = mmap(nullptr, rt.stack_region_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) { rt.stack_region = nullptr; set_error("cannot allocate %zu fiber stacks", want); return false; }
  rt.stack_region = (char*)p;
  rt.fibers.assign(want, Fiber());
  for (size_t i = 0; i < want; ++i) {
    char* g = rt.stack_region + i * per;
    mprotect(g, rt.page, PROT_NONE);
    rt.fibers[i].stack_lo = g + rt.page;
  }
  return true;
}

// ---- crash reporting (async-signal-safe) -----------------------------------
struct CrashWriter {
  char* p; char* e;
  void s(const char* t) { while (*t && p < e) *p++ = *t++; }
  void u(unsigned long long v) { char b[24]; int n = 0; do { b[n++] = char('0' + v % 10); v /= 10; } while (v); while (n && p < e) *p++ = b[--n]; }
  void x(unsigned long long v) { s("0x"); char b[20]; int n = 0; do { b[n++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v); while (n && p < e) *p++ = b[--n]; }
};

static void crash_handler(int sig, siginfo_t* si, void*) {
  if (rt.crash_area && rt.crash_len > 1) {
    CrashWriter w{rt.crash_area, rt.crash_area + rt.crash_len - 1};
    uintptr_t a = (uintptr_t)(si ? si->si_addr : nullptr);
    w.s("kernel="); w.s(rt.kernel);
    if (rt.in_block) {
      w.s(";block="); w.u(blockIdx.x); w.s(","); w.u(blockIdx.y); w.s(","); w.u(blockIdx.z);
      if (rt.cur) { w.s(";thread="); w.u(rt.cur->idx.x); w.s(","); w.u(rt.cur->idx.y); w.s(","); w.u(rt.cur->idx.z); }
    }
    if (sig == SIGSEGV || sig == SIGBUS) {
      w.s(";addr="); w.x(a);
      if (rt.arena_base && a >= rt.arena_base && a < rt.arena_base + rt.arena_size) { w.s(";arena_off="); w.u(a - rt.arena_base); }
      if (rt.stack_region && a >= (uintptr_t)rt.stack_region && a < (uintptr_t)rt.stack_region + rt.stack_region_size) {
        size_t per = rt.stack_size + rt.page;
        if (((a - (uintptr_t)rt.stack_region) % per) < rt.page) w.s(";stack_overflow=1");
      }
      if (rt.dyn_base && a >= (uintptr_t)rt.dyn_base && a < (uintptr_t)rt.dyn_base + rt.dyn_reserved) {
        w.s(";dyn_smem_off="); w.u(a - (uintptr_t)rt.dyn_base);
      }
    }
    *w.p = 0;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

static inline void install_crash_handlers() {
  if (rt.altstack_ready) return;
  rt.altstack_ready = 1;
  static char altstack[64 * 1024];
  stack_t ss;
  ss.ss_sp = altstack;
  ss.ss_size = sizeof altstack;
  ss.ss_flags = 0;
  sigaltstack(&ss, nullptr);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = crash_handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP};
  for (int s : sigs) sigaction(s, &sa, nullptr);
}

// ---- warp operations --------------------------------------------------------
static inline unsigned warp_lane_mask(unsigned warp, unsigned nthreads) {
  unsigned first = warp * 32u;
  unsigned n = nthreads - first;
  return n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
}

static inline std::string fiber_where(const Fiber& g) {
  char b[256];
  if (g.state == F_DONE) snprintf(b, sizeof b, "exited");
  else if (g.state == F_BARRIER) snprintf(b, sizeof b, "at %s (%s:%d)", kBarName[g.bkind], g.bfile, g.bline);
  else if (g.state == F_WARP) snprintf(b, sizeof b, "at %s(mask=0x%08x) (%s:%d)", kWarpOpName[g.wop], g.wmask, g.wfile, g.wline);
  else snprintf(b, sizeof b, "runnable");
  return b;
}

// Called by the scheduler after fiber f arrived at a warp operation.
// Returns false on a kernel error (rt.err set).
static inline bool try_complete_warp(Fiber* f, unsigned nthreads) {
  unsigned warp = f->tid / 32u;
  Fiber* w = &rt.fibers[warp * 32u];
  unsigned M = f->wmask;
  for (unsigned m = M; m; m &= m - 1) {
    Fiber& g = w[__builtin_ctz(m)];
    if (g.state != F_WARP) return true;  // not everybody is here yet
  }
  for (unsigned m = M; m; m &= m - 1) {
    Fiber& g = w[__builtin_ctz(m)];
    if (g.wop != f->wop || g.wmask != M || g.wwidth != f->wwidth) {
      set_error("warp %u: lanes disagree on the warp operation: lane %u %s, lane %u %s", warp, f->lane,
                fiber_where(*f).c_str(), g.lane, fiber_where(g).c_str());
      return false;
    }
  }
  (void)nthreads;
  int op = f->wop;
  if (op == W_SHFL_IDX || op == W_SHFL_UP || op == W_SHFL_DOWN || op == W_SHFL_XOR) {
    unsigned segmask = (unsigned)(32 - f->wwidth) & 31u;
    unsigned cval = (op == W_SHFL_UP) ? 0u : 31u;
    for (unsigned m = M; m; m &= m - 1) {
      unsigned lane = (unsigned)__builtin_ctz(m);
      Fiber& g = w[lane];
      unsigned b = g.wparam & 31u;
      int maxLane = (int)((lane & segmask) | (cval & ~segmask));
      int minLane = (int)(lane & segmask);
      int j;
      bool p;
      switch (op) {
        case W_SHFL_UP: j = (int)lane - (int)b; p = j >= maxLane; break;
        case W_SHFL_DOWN: j = (int)lane + (int)b; p = j <= maxLane; break;
        case W_SHFL_XOR: j = (int)(lane ^ b); p = j <= maxLane; break;
        default: j = minLane | (int)(b & ~segmask); p = j <= maxLane; break;
      }
      if (p) {
        if (!((M >> j) & 1u)) {
          set_error("warp %u lane %u: %s (%s:%d) reads lane %d, which is not in the mask 0x%08x (undefined in CUDA)",
                    warp, lane, kWarpOpName[op], g.wfile, g.wline, j, M);
          return false;
        }
        g.wres = w[j].wval;
      } else {
        g.wres = g.wval;
      }
    }
  } else if (op == W_BALLOT || op == W_ANY || op == W_ALL) {
    unsigned ballot = 0;
    for (unsigned m = M; m; m &= m - 1) {
      unsigned lane = (unsigned)__builtin_ctz(m);
      if (w[lane].wval) ballot |= 1u << lane;
    }
    unsigned long long r = op == W_BALLOT ? ballot : (op == W_ANY ? (ballot != 0) : (ballot == M));
    for (unsigned m = M; m; m &= m - 1) w[__builtin_ctz(m)].wres = r;
  }
  for (unsigned m = M; m; m &= m - 1) w[__builtin_ctz(m)].state = F_RUNNABLE;
  return true;
}

// Fiber side of every warp operation.
static inline unsigned long long warp_op(int op, unsigned mask, unsigned long long val, unsigned param, int width,
                                         const char* file, int line) {
  Fiber* f = rt.cur;
  unsigned exist = warp_lane_mask(f->tid / 32u, blockDim.x * blockDim.y * blockDim.z);
  unsigned M = mask & exist;
  if (!((M >> f->lane) & 1u)) {
    set_error("thread (%u,%u,%u) (warp %u lane %u) calls %s with mask 0x%08x that does not include its own lane (%s:%d)",
              f->idx.x, f->idx.y, f->idx.z, f->tid / 32u, f->lane, kWarpOpName[op], mask, file, line);
    kernel_error_in_fiber();
  }
  if (width < 1 || width > 32 || (width & (width - 1))) {
    set_error("%s width %d is not a power of two in [1, 32] (%s:%d)", kWarpOpName[op], width, file, line);
    kernel_error_in_fiber();
  }
  f->wop = op; f->wmask = M; f->wval = val; f->wparam = param; f->wwidth = width; f->wfile = file; f->wline = line;
  f->state = F_WARP;
  yield_to_scheduler();
  return f->wres;
}

static inline int barrier(int kind, int pred, const char* file, int line) {
  Fiber* f = rt.cur;
  f->bkind = kind; f->bpred = pred; f->bfile = file; f->bline = line;
  f->state = F_BARRIER;
  yield_to_scheduler();
  return f->bpred;
}

template <class T>
static inline unsigned long long to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp shuffle of a type larger than 8 bytes");
  unsigned long long b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
static inline T from_bits(unsigned long long b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

// ---- block scheduler ---------------------------------------------------------
static inline int run_block(unsigned nthreads, std::vector<unsigned>& perm) {
  // Poison shared memory.
  if (__stop_cuemu_shared > __start_cuemu_shared)
    memset(__start_cuemu_shared, 0xFF, (size_t)(__stop_cuemu_shared - __start_cuemu_shared));
  if (rt.dyn_rw) memset(rt.dyn_base, 0xFF, rt.dyn_rw);
  const unsigned bx = blockDim.x, by = blockDim.y;
  for (unsigned t = 0; t < nthreads; ++t) {
    Fiber& f = rt.fibers[t];
    f.state = F_RUNNABLE;
    f.tid = t;
    f.lane = t % 32u;
    f.idx.x = t % bx;
    f.idx.y = (t / bx) % by;
    f.idx.z = t / (bx * by);
    init_fiber(&f);
  }
  unsigned ndone = 0;
  rt.in_block = true;
  for (;;) {
    bool progress = false;
    if (rt.order == 2) apply_order(perm, 2);
    for (unsigned k = 0; k < nthreads; ++k) {
      Fiber* f = &rt.fibers[perm[k]];
      if (f->state != F_RUNNABLE) continue;
      progress = true;
      resume(f);
      if (rt.fatal) { rt.in_block = false; return rt.fatal; }
      if (f->state == F_WARP) {
        if (!try_complete_warp(f, nthreads)) { rt.in_block = false; return ST_KERNEL_ERROR; }
      } else if (f->state == F_DONE) {
        ++ndone;
      }
    }
    if (ndone == nthreads) break;
    if (progress) continue;
    // Nobody can run: release a barrier or report a deadlock.
    unsigned nbar = 0, nwarp = 0;
    Fiber* first_bar = nullptr;
    Fiber* other_bar = nullptr;
    Fiber* a_warp = nullptr;
    Fiber* a_done = nullptr;
    for (unsigned t = 0; t < nthreads; ++t) {
      Fiber& g = rt.fibers[t];
      if (g.state == F_BARRIER) {
        ++nbar;
        if (!first_bar) first_bar = &g;
        else if (!other_bar && (g.bline != first_bar->bline || g.bkind != first_bar->bkind ||
                                strcmp(g.bfile, first_bar->bfile) != 0)) other_bar = &g;
      } else if (g.state == F_WARP) {
        ++nwarp;
        if (!a_warp) a_warp = &g;
      } else if (g.state == F_DONE && !a_done) {
        a_done = &g;
      }
    }
    rt.in_block = false;
    if (nbar == nthreads && !other_bar) {
      int kind = first_bar->bkind;
      int r = 0;
      if (kind == B_COUNT) { for (unsigned t = 0; t < nthreads; ++t) r += rt.fibers[t].bpred != 0; }
      else if (kind == B_AND) { r = 1; for (unsigned t = 0; t < nthreads; ++t) r &= rt.fibers[t].bpred != 0; }
      else if (kind == B_OR) { for (unsigned t = 0; t < nthreads; ++t) r |= rt.fibers[t].bpred != 0; }
      for (unsigned t = 0; t < nthreads; ++t) { rt.fibers[t].state = F_RUNNABLE; rt.fibers[t].bpred = r; }
      rt.in_block = true;
      continue;
    }
    // Deadlock: describe it.
    std::string msg;
    char b[512];
    if (a_warp) {
      unsigned warp = a_warp->tid / 32u;
      unsigned M = a_warp->wmask;
      Fiber* missing = nullptr;
      for (unsigned m = M; m; m &= m - 1) {
        Fiber& g = rt.fibers[warp * 32u + __builtin_ctz(m)];
        if (g.state != F_WARP || g.wmask != M) { missing = &g; break; }
      }
      snprintf(b, sizeof b, "warp %u lane %u waits %s", warp, a_warp->lane, fiber_where(*a_warp).c_str());
      msg = b;
      if (missing) {
        snprintf(b, sizeof b, " but lane %u (thread (%u,%u,%u)) is %s", missing->lane, missing->idx.x, missing->idx.y,
                 missing->idx.z, fiber_where(*missing).c_str());
        msg += b;
      }
    } else if (other_bar) {
      snprintf(b, sizeof b, "divergent barriers: thread (%u,%u,%u) waits %s while thread (%u,%u,%u) waits %s",
               first_bar->idx.x, first_bar->idx.y, first_bar->idx.z, fiber_where(*first_bar).c_str(), other_bar->idx.x,
               other_bar->idx.y, other_bar->idx.z, fiber_where(*other_bar).c_str());
      msg = b;
    } else if (first_bar && a_done) {
      snprintf(b, sizeof b, "%u of %u threads exited (e.g. thread (%u,%u,%u)) while %u threads wait %s (e.g. thread (%u,%u,%u))",
               ndone, nthreads, a_done->idx.x, a_done->idx.y, a_done->idx.z, nbar, fiber_where(*first_bar).c_str(),
               first_bar->idx.x, first_bar->idx.y, first_bar->idx.z);
      msg = b;
    } else {
      msg = "no runnable thread (internal scheduler error)";
    }
    (void)nwarp;
    rt.err = msg;
    return ST_DEADLOCK;
  }
  rt.in_block = false;
  return ST_OK;
}

static inline int run_grid(const char* name, const unsigned* g, const unsigned* b, unsigned long long smem,
                           void (*thunk)(void*), void* ctx) {
  install_crash_handlers();
  rt.kernel = name;
  rt.fatal = 0;
  rt.err.clear();
  rt.cur = nullptr;
  if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2]) { set_error("kernel %s: zero grid or block dimension", name); return ST_LAUNCH_ERROR; }
  unsigned long long nthreads = (unsigned long long)b[0] * b[1] * b[2];
  if (nthreads > 1024 || b[2] > 64) {
    set_error("kernel %s: block (%u,%u,%u) exceeds CUDA limits (<= 1024 threads, z <= 64)", name, b[0], b[1], b[2]);
    return ST_LAUNCH_ERROR;
  }
  if (g[1] > 65535 || g[2] > 65535 || g[0] > 0x7fffffffu) {
    set_error("kernel %s: grid (%u,%u,%u) exceeds CUDA limits", name, g[0], g[1], g[2]);
    return ST_LAUNCH_ERROR;
  }
  unsigned long long nblocks = (unsigned long long)g[0] * g[1] * g[2];
  if (nblocks > (1ull << 28)) { set_error("kernel %s: grid of %llu blocks is too large for the emulator", name, nblocks); return ST_LAUNCH_ERROR; }
  if (smem > kMaxDynSmem) { set_error("kernel %s: %llu bytes of dynamic shared memory exceed the emulator's %zu", name, smem, kMaxDynSmem); return ST_LAUNCH_ERROR; }
  if (!ensure_stacks((size_t)nthreads)) return ST_LAUNCH_ERROR;
  // Dynamic shared memory: make exactly the needed pages accessible.
  char* dyn = dynamic_smem_base();
  size_t rw = (size_t)((smem + rt.page - 1) / rt.page * rt.page);
  if (rw != rt.dyn_rw) {
    mprotect(dyn, rt.dyn_reserved, PROT_NONE);
    if (rw) mprotect(dyn, rw, PROT_READ | PROT_WRITE);
    rt.dyn_rw = rw;
  }
  rt.thunk = thunk;
  rt.thunk_ctx = ctx;
  gridDim = dim3(g[0], g[1], g[2]);
  blockDim = dim3(b[0], b[1], b[2]);
  std::vector<unsigned> blocks((size_t)nblocks);
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = (unsigned)i;
  rt.rng = rt.seed * 0x2545F4914F6CDD1Dull + 1;
  apply_order(blocks, rt.order);
  std::vector<unsigned> perm((size_t)nthreads);
  int status = ST_OK;
  for (unsigned bi : blocks) {
    blockIdx.x = bi % g[0];
    blockIdx.y = (bi / g[0]) % g[1];
    blockIdx.z = bi / (g[0] * g[1]);
    for (unsigned t = 0; t < nthreads; ++t) perm[t] = t;
    if (rt.order == 1) apply_order(perm, 1);
    status = run_block((unsigned)nthreads, perm);
    if (status != ST_OK) {
      char pre[160];
      snprintf(pre, sizeof pre, "kernel %s, block (%u,%u,%u): ", name, blockIdx.x, blockIdx.y, blockIdx.z);
      rt.err = pre + rt.err;
      break;
    }
  }
  rt.cur = nullptr;
  fflush(stdout);
  fflush(stderr);
  return status;
}

// ---- trampolines --------------------------------------------------------------
template <class T, class = void> struct TypeName { static constexpr const char* value = nullptr; };
#define CUEMU_TN(T, S) template <> struct TypeName<T> { static constexpr const char* value = S; };
CUEMU_TN(int, "int") CUEMU_TN(unsigned int, "unsigned int") CUEMU_TN(long long, "long long")
CUEMU_TN(unsigned long long, "unsigned long long") CUEMU_TN(long, "long") CUEMU_TN(unsigned long, "unsigned long")
CUEMU_TN(short, "short") CUEMU_TN(unsigned short, "unsigned short") CUEMU_TN(char, "char")
CUEMU_TN(signed char, "signed char") CUEMU_TN(unsigned char, "unsigned char") CUEMU_TN(bool, "bool")
CUEMU_TN(float, "float") CUEMU_TN(double, "double") CUEMU_TN(__nv_bfloat16, "__nv_bfloat16")
CUEMU_TN(__nv_bfloat162, "__nv_bfloat162") CUEMU_TN(float2, "float2") CUEMU_TN(float4, "float4")
CUEMU_TN(int2, "int2") CUEMU_TN(int4, "int4") CUEMU_TN(uint2, "uint2") CUEMU_TN(uint4, "uint4")
CUEMU_TN(char4, "char4") CUEMU_TN(uchar4, "uchar4") CUEMU_TN(void, "void")
#undef CUEMU_TN

template <class T>
static inline std::string param_type_name() {
  if constexpr (std::is_pointer<T>::value) {
    using P = typename std::remove_pointer<T>::type;
    using B = typename std::remove_cv<P>::type;
    std::string s = std::is_const<P>::value ? "const " : "";
    if constexpr (std::is_pointer<B>::value) s += "void*";  // pointer to pointer: opaque
    else s += TypeName<B>::value ? TypeName<B>::value : "struct";
    return s + "*";
  } else {
    static_assert(TypeName<T>::value != nullptr && !std::is_same<T, void>::value,
                  "cuemu: unsupported kernel parameter type (use pointers or int/unsigned/float/long long/size_t/...)");
    return TypeName<T>::value;
  }
}

template <class F> struct Traits;
template <class... A> struct Traits<void (*)(A...)> {
  using Tuple = std::tuple<typename std::decay<A>::type...>;
  static constexpr size_t N = sizeof...(A);
  static std::string sig() {
    std::string s;
    ((s += (s.empty() ? "" : "|") + param_type_name<typename std::decay<A>::type>()), ...);
    return s;
  }
};

template <class Tuple, size_t... I>
static inline void unpack(Tuple& t, void** args, std::index_sequence<I...>) {
  ((std::memcpy((void*)&std::get<I>(t), args[I], sizeof(std::get<I>(t)))), ...);
}

template <auto K>
static void kernel_thunk(void* ctx) {
  using Tup = typename Traits<decltype(K)>::Tuple;
  std::apply(K, *static_cast<Tup*>(ctx));
}

template <auto K>
static inline int launch(const char* name, const unsigned* g, const unsigned* b, unsigned long long smem, void** args) {
  using T = Traits<decltype(K)>;
  typename T::Tuple tup;
  unpack(tup, args, std::make_index_sequence<T::N>());
  return run_grid(name, g, b, smem, &kernel_thunk<K>, &tup);
}

template <auto K>
static inline const char* signature() {
  static const std::string s = Traits<decltype(K)>::sig();
  return s.c_str();
}

}  // namespace cuemu

// ---- barriers and warp intrinsics (macros capture the call site) -------------
#define __syncthreads() ((void)::cuemu::barrier(::cuemu::B_SYNC, 0, __FILE__, __LINE__))
#define __syncthreads_count(p) (::cuemu::barrier(::cuemu::B_COUNT, (p) != 0, __FILE__, __LINE__))
#define __syncthreads_and(p) (::cuemu::barrier(::cuemu::B_AND, (p) != 0, __FILE__, __LINE__))
#define __syncthreads_or(p) (::cuemu::barrier(::cuemu::B_OR, (p) != 0, __FILE__, __LINE__))

namespace cuemu {
template <class T>
static inline T shfl(int op, unsigned mask, T v, int param, int width, const char* file, int line) {
  return from_bits<T>(warp_op(op, mask, to_bits(v), (unsigned)param, width, file, line));
}
}  // namespace cuemu

#define CUEMU_SHFL_W(op, mask, v, p, w, ...) ::cuemu::shfl(op, (mask), (v), (int)(p), (int)(w), __FILE__, __LINE__)
#define __shfl_sync(mask, v, ...) CUEMU_SHFL_W(::cuemu::W_SHFL_IDX, mask, v, __VA_ARGS__, 32, 0)
#define __shfl_up_sync(mask, v, ...) CUEMU_SHFL_W(::cuemu::W_SHFL_UP, mask, v, __VA_ARGS__, 32, 0)
#define __shfl_down_sync(mask, v, ...) CUEMU_SHFL_W(::cuemu::W_SHFL_DOWN, mask, v, __VA_ARGS__, 32, 0)
#define __shfl_xor_sync(mask, v, ...) CUEMU_SHFL_W(::cuemu::W_SHFL_XOR, mask, v, __VA_ARGS__, 32, 0)
#define __syncwarp(...) ((void)::cuemu::warp_op(::cuemu::W_SYNC, ::cuemu::syncwarp_mask(__VA_ARGS__), 0, 0, 32, __FILE__, __LINE__))
#define __ballot_sync(mask, p) ((unsigned)::cuemu::warp_op(::cuemu::W_BALLOT, (mask), (p) != 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(mask, p) ((int)::cuemu::warp_op(::cuemu::W_ANY, (mask), (p) != 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, p) ((int)::cuemu::warp_op(::cuemu::W_ALL, (mask), (p) != 0, 0, 32, __FILE__, __LINE__))

namespace cuemu {
static inline unsigned syncwarp_mask() { return 0xffffffffu; }
static inline unsigned syncwarp_mask(unsigned m) { return m; }
}  // namespace cuemu

// Lanes of the calling warp that have not exited.
static inline unsigned __activemask() {
  cuemu::Fiber* f = cuemu::rt.cur;
  unsigned w = f->tid / 32u, n = blockDim.x * blockDim.y * blockDim.z, r = 0;
  for (unsigned l = 0; l < 32 && w * 32 + l < n; ++l)
    if (cuemu::rt.fibers[w * 32 + l].state != cuemu::F_DONE) r |= 1u << l;
  return r;
}

static inline long long clock64() {
#if defined(__x86_64__)
  return (long long)__builtin_ia32_rdtsc();
#else
  return 0;
#endif
}

// ---- C ABI used by the worker ---------------------------------------------------
extern "C" {
__attribute__((visibility("default"))) void cuemu_set_order(int order, unsigned long long seed) {
  cuemu::rt.order = order;
  cuemu::rt.seed = seed;
}
__attribute__((visibility("default"))) const char* cuemu_last_error(void) { return cuemu::rt.err.c_str(); }
__attribute__((visibility("default"))) void cuemu_set_crash_area(char* area, size_t len, void* arena, size_t arena_size) {
  cuemu::rt.crash_area = area;
  cuemu::rt.crash_len = len;
  cuemu::rt.arena_base = (uintptr_t)arena;
  cuemu::rt.arena_size = arena_size;
  cuemu::install_crash_handlers();
}
__attribute__((visibility("default"))) int cuemu_abi_version(void) { return 1; }
}

#endif  // CUEMU_H_INCLUDED
