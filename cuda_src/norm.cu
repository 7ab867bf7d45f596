// norm.cu -- row norms in lane-16 order (cupyglm/backend/numpy_ops.py: rmsnorm, layernorm).
//
// One block per row (grid = rows), NORM_THREADS threads.  Sums over D: threads 0..15 each sum lane
// `tid` (terms tid, tid+16, ... in increasing order from +0.0) into shared memory; thread 0 folds the 16
// lanes (i += i+8, +4, +2, +1) and computes the row's scalar; then every thread writes its columns.
// 1 / sqrtf (not rsqrtf) as the reference does 1 / sqrt; bf16 rounding exactly where the reference
// rounds.  No FMA contraction (--fmad=false / -ffp-contract=off), so the bits equal NumPy's.  Storage: x, w, b
// and out are bf16; the sums and the row scalar are fp32.
#include "common.cuh"
#include "norm_row.cuh"

struct NormRowBf16 {            // row values read from bf16 memory
  const __nv_bfloat16* xr;
  __device__ float operator()(int i) const { return ld_bf16(xr, i); }
};

// out = bf16(w * bf16(x * (1 / sqrt(sum(x*x) / D + eps)))), per row (norm_row.cuh).
extern "C" __global__ void rmsnorm_rows(const __nv_bfloat16* __restrict__ x,   // [rows, D] bf16
                                        const __nv_bfloat16* __restrict__ w,   // [D] bf16
                                        __nv_bfloat16* __restrict__ out,       // [rows, D] bf16
                                        int D, float eps) {
  const NormRowBf16 rd{x + (long long)blockIdx.x * D};
  rmsnorm_row(rd, w, out + (long long)blockIdx.x * D, D, eps);
}

// out = bf16(((x - mean) * (1 / sqrt(var + eps))) * w + b), population variance, per row (norm_row.cuh).
extern "C" __global__ void layernorm_rows(const __nv_bfloat16* __restrict__ x,   // [rows, D] bf16
                                          const __nv_bfloat16* __restrict__ w,   // [D] bf16
                                          const __nv_bfloat16* __restrict__ b,   // [D] bf16
                                          __nv_bfloat16* __restrict__ out,       // [rows, D] bf16
                                          int D, float eps) {
  const NormRowBf16 rd{x + (long long)blockIdx.x * D};
  layernorm_row(rd, w, b, out + (long long)blockIdx.x * D, D, eps);
}
