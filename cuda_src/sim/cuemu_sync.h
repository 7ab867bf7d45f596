// cuemu_sync.h -- part of cuemu.h (the CPU emulator); included only by cuemu.h, in its order.
// Barrier and warp intrinsics as macros that capture the call site, __activemask, clock64.
#ifndef CUEMU_SYNC_H_INCLUDED
#define CUEMU_SYNC_H_INCLUDED

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
// The warp's mma.m16n8k16 (cuda_src/mma.cuh): every lane hands in its fragments; d holds its part of D after.
static inline void mma_sync(MmaLane* f, const char* file, int line) {
  warp_op(W_MMA, 0xffffffffu, (unsigned long long)reinterpret_cast<uintptr_t>(f), 0, 32, file, line);
}
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

#endif  // CUEMU_SYNC_H_INCLUDED
