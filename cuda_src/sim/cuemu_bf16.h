// cuemu_bf16.h -- part of cuemu.h (the CPU emulator); included only by cuemu.h, in its order.
// bfloat16 and bfloat162, bit-exact with cuda_bf16.h.
#ifndef CUEMU_BF16_H_INCLUDED
#define CUEMU_BF16_H_INCLUDED

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

#endif  // CUEMU_BF16_H_INCLUDED
