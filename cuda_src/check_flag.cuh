// check_flag.cuh -- one violation of a device-side precondition counted into slot `slot` of the flags buffer
// (cupyglm/kernels/guards.py): [slot, 0] += 1, [slot, 1] = max(~i), i.e. ~first violating index.  Both are
// order-independent, so every thread order gives the same flags.  Used by checks.cu and by kernels that check
// the ids they read themselves (gemv.cu's grouped forms), so no separate check launch is needed.
#pragma once

static __device__ __forceinline__ void check_flag(unsigned int* flags, int slot, int i) {
  unsigned int* f = flags + 2 * slot;
  atomicAdd(&f[0], 1u);
  atomicMax(&f[1], ~(unsigned int)i);
}
