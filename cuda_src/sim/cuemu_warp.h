// cuemu_warp.h -- part of cuemu.h (the CPU emulator); included only by cuemu.h, in its order.
// Warp operations: the rendezvous of the lanes named by the mask, with PTX shfl.sync semantics.
#ifndef CUEMU_WARP_H_INCLUDED
#define CUEMU_WARP_H_INCLUDED

namespace cuemu {

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
  } else if (op == W_MMA) {
    if (M != 0xffffffffu) {
      set_error("warp %u: mma.sync needs all 32 lanes of the warp, the mask is 0x%08x (%s:%d)", warp, M, f->wfile,
                f->wline);
      return false;
    }
    MmaLane* lanes[32];
    for (unsigned l = 0; l < 32; ++l) lanes[l] = reinterpret_cast<MmaLane*>(w[l].wval);
    mma_m16n8k16_run(lanes);
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

}  // namespace cuemu

#endif  // CUEMU_WARP_H_INCLUDED
