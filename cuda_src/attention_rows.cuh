// attention_rows.cuh -- the store row of list entry j of row t, shared by attention.cu and attention_split.cu.
// pt > 0: the lists hold token positions, seg [T] each row's segment and table [S, width] each segment's page
// table (the forward call's row map, uploaded once per call: one table row per segment, not per row), so
// row = table[seg[t], p / pt] * pt + p % pt, the int32 arithmetic of kv/store.py's rows (model/seg_device.py);
// pt == 0: the lists hold store rows already (slot ids of host rows) and neither seg nor table is read.  Only
// entries below the row's count are ever mapped (never -1).  seg[t] in [0, S) is the caller's contract.
#pragma once

static __device__ __forceinline__ int att_store_row(const int* __restrict__ rows, const int* __restrict__ table,
                                                    const int* __restrict__ seg, int T, int t, int W, int j,
                                                    int width, int pt) {
  const int v = rows[(long long)t * W + j];
  if (pt <= 0) return v;
#ifdef ATT_PLANT_NEXT_SEG  // planted: the next segment's table (clamped to the last row's segment)
  const int s = min(seg[t] + 1, seg[T - 1]);
#else
  const int s = seg[t];
#endif
  return table[(long long)s * width + v / pt] * pt + v % pt;
}
