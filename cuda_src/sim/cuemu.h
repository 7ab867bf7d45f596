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
//   * The tensor core's mma.m16n8k16 (cuda_src/mma.cuh) rendezvous the whole
//     warp, gathers the lanes' fragments in the PTX layouts and computes D with
//     the CPU model of the tensor core of CUPYGLM_TC_ARCH (cuemu_mma.h).
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

// The parts, in dependency order (each relies on the ones before it).
#include "cuemu_types.h"
#include "cuemu_intrinsics.h"
#include "cuemu_bf16.h"
#include "cuemu_mma.h"
#include "cuemu_atomics.h"
#include "cuemu_fiber.h"
#include "cuemu_crash.h"
#include "cuemu_warp.h"
#include "cuemu_scheduler.h"
#include "cuemu_launch.h"
#include "cuemu_sync.h"

#endif  // CUEMU_H_INCLUDED
