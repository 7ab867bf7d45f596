// cuemu_atomics.h -- part of cuemu.h (the CPU emulator); included only by cuemu.h, in its order.
// Atomics, fences and cache-hinted loads: plain read-modify-write, a fiber never yields inside one.
#ifndef CUEMU_ATOMICS_H_INCLUDED
#define CUEMU_ATOMICS_H_INCLUDED

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

#endif  // CUEMU_ATOMICS_H_INCLUDED
