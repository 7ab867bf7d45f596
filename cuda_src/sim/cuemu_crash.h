// cuemu_crash.h -- part of cuemu.h (the CPU emulator); included only by cuemu.h, in its order.
// Crash reporting: an async-signal-safe handler writes where a kernel faulted into the worker's crash area.
#ifndef CUEMU_CRASH_H_INCLUDED
#define CUEMU_CRASH_H_INCLUDED

namespace cuemu {

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

}  // namespace cuemu

#endif  // CUEMU_CRASH_H_INCLUDED
