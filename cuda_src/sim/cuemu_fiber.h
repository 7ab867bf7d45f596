// cuemu_fiber.h -- part of cuemu.h (the CPU emulator); included only by cuemu.h, in its order.
// Fibers: the runtime state, shared memory (static section and dynamic reservation), context switch and stacks.
#ifndef CUEMU_FIBER_H_INCLUDED
#define CUEMU_FIBER_H_INCLUDED

// ---------------------------------------------------------------------------
// Fiber scheduler
// ---------------------------------------------------------------------------
namespace cuemu {

enum FiberState { F_RUNNABLE = 0, F_BARRIER = 1, F_WARP = 2, F_DONE = 3 };
enum WarpOp { W_SYNC = 0, W_SHFL_IDX, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR, W_BALLOT, W_ANY, W_ALL, W_MMA };
enum BarKind { B_SYNC = 0, B_COUNT, B_AND, B_OR };
enum Status { ST_OK = 0, ST_DEADLOCK = 1, ST_KERNEL_ERROR = 2, ST_LAUNCH_ERROR = 3 };

static const char* const kWarpOpName[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                           "__shfl_xor_sync", "__ballot_sync", "__any_sync", "__all_sync",
                                           "mma.sync.m16n8k16"};
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

}  // namespace cuemu

#endif  // CUEMU_FIBER_H_INCLUDED
