// attention_rows.cuh -- the store row of list entry j of row t, shared by attention.cu and attention_split.cu.
// pt > 0: the lists hold token positions and table [T, width] each row's page table (the forward call's row map,
// uploaded once per call), so row = table[t, p / pt] * pt + p % pt, the int32 arithmetic of kv/store.py's rows
// (model/seg_device.py); pt == 0: the lists hold store rows already (slot ids of host rows).  Only entries below
// the row's count are ever mapped (never -1).
#pragma once

static __device__ __forceinline__ int att_store_row(const int* __restrict__ rows, const int* __restrict__ table,
                                                    int t, int W, int j, int width, int pt) {
  const int v = rows[(long long)t * W + j];
  if (pt <= 0) return v;
  return table[(long long)t * width + v / pt] * pt + v % pt;
}
