// cuemu_scheduler.h -- part of cuemu.h (the CPU emulator); included only by cuemu.h, in its order.
// Block and grid scheduling: fibers run in the selected order; barriers release or a deadlock is described.
#ifndef CUEMU_SCHEDULER_H_INCLUDED
#define CUEMU_SCHEDULER_H_INCLUDED

namespace cuemu {

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

}  // namespace cuemu

#endif  // CUEMU_SCHEDULER_H_INCLUDED
