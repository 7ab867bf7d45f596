// checks.cu -- the launchers' preconditions checked on the device (cupyglm/kernels/guards.py), so a device
// array is checked without a host sync: each check counts its violations into one slot of a small flags
// buffer, which the host reads once after the step and reports as a named error (guards.DeviceCheckError).
//
// flags: [slots, 2] u32, zeroed by the host.  Slot s: [s, 0] += violations, [s, 1] = max(~i)
// over violating elements i, i.e. ~first violating index (0 while none).  Both are order-independent, so
// every thread order gives the same flags (the contract checks it).  The kernels the checks guard stay
// memory-safe on bad input (they skip, or write NaN / -1); the check only makes the mistake an error.
// Kernels that check their own ids (kv.cu, pick.cu, the grouped gemv) use check_flag.cuh and need none of these.
#include "common.cuh"
#include "check_flag.cuh"

// ids[i] in [0, limit) for every i < n; one thread per id.
extern "C" __global__ void check_ids_range(const int* __restrict__ ids,      // [n] i32
                                           unsigned int* __restrict__ flags,  // [slots, 2] u32
                                           int n, int limit, int slot) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int v = ids[i];
#ifdef CHECKS_PLANT_RANGE
  if (v < 0 || v > limit) check_flag(flags, slot, i);           // planted: the limit itself passes
#else
  if (v < 0 || v >= limit) check_flag(flags, slot, i);
#endif
}

// ids[i] differs from every ids[j], j < i (write ids: the order of two writes to one row would decide it).
// O(n^2) over the rows one step writes; one thread per id.
extern "C" __global__ void check_ids_distinct(const int* __restrict__ ids,      // [n] i32
                                              unsigned int* __restrict__ flags,  // [slots, 2] u32
                                              int n, int slot) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int v = ids[i];
#ifdef CHECKS_PLANT_DISTINCT
  for (int j = 0; j + 1 < i; ++j) {                                // planted: the neighbour is not compared
#else
  for (int j = 0; j < i; ++j) {
#endif
    if (ids[j] == v) {
      check_flag(flags, slot, i);
      return;
    }
  }
}
