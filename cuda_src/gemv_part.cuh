// gemv_part.cuh -- one part of a multi-part decode/verify GEMV (gemv_multi.cu, gemv_norm.cu): column block b and
// row group g of y[m, n] = epilogue(sum_k x[m, k] * w[n, k]), the gemv_tc.cuh body (the tensor core's decode
// order, one rounding), x read through any row reader (gemv_tile.cuh's GemvXMem, or a prologue's).
//
// Epilogue (kind): 0 fp32 as summed; 1 bf16 rounded once; 2 bf16(sigmoid(fp32 sum)), the sum and sigmoid_bf16 of
// moe.cu fused (exp_f32.cuh's sigmoid_f32, the same bits as the two launches).
#pragma once
#include "common.cuh"
#include "exp_f32.cuh"
#include "gemv_tc.cuh"

struct GemvPart {
  const __nv_bfloat16* x;   // [M, k] bf16 (unused when a prologue reader computes the rows)
  const __nv_bfloat16* w;   // [n, k] bf16
  void* y;                  // [M, n] fp32 (kind 0) or bf16 (kind 1, 2)
  int n, k, kind;
};

// Element i of part p's y: the epilogue of its fp32 sum v.
static __device__ __forceinline__ void gemv_part_store(const GemvPart& p, long long i, float v) {
  if (p.kind == 0)
    static_cast<float*>(p.y)[i] = v;
  else
    static_cast<__nv_bfloat16*>(p.y)[i] = to_bf16(p.kind == 2 ? sigmoid_f32(v) : v);
}

// Column block b and row group g of part p, x read from memory (p.x).
static __device__ __forceinline__ void gemv_multi_one(GemvTcShared<1>& sh, const GemvPart& p, int b, int g, int rows) {
  const int n0 = b * GEMV_OUTS, m0 = g * GEMV_ROWS;
  GemvSrc<1> src;
  src.w[0] = p.w + (long long)n0 * p.k;
  src.x = p.x + (long long)m0 * p.k;
  src.ncols = min(GEMV_OUTS, p.n - n0);
  src.nrows = min(GEMV_ROWS, rows - m0);
  src.K = p.k;
  src.vec = gemv_aligned(p.x, p.w, p.k);
  float v[1];
  gemv_tc_rows(sh, src, v);
  const int lane = threadIdx.x, o = threadIdx.y, n = n0 + o;
  if (n < p.n && lane < src.nrows) gemv_part_store(p, (long long)(m0 + lane) * p.n + n, v[0]);
}

// As gemv_multi_one, the block's rows read by xr (row c of the block at xr.load8(c, ...)) instead of p.x, e.g. a
// prologue's reader; wvec: the weights' 16-byte loads are aligned.
template <typename XR>
static __device__ __forceinline__ void gemv_part_block(GemvTcShared<1>& sh, const GemvPart& p, int b, int g, int rows,
                                                       const XR& xr, bool wvec) {
  const int n0 = b * GEMV_OUTS, m0 = g * GEMV_ROWS;
  GemvSrc<1> src;
  src.w[0] = p.w + (long long)n0 * p.k;
  src.x = nullptr;
  src.ncols = min(GEMV_OUTS, p.n - n0);
  src.nrows = min(GEMV_ROWS, rows - m0);
  src.K = p.k;
  src.vec = wvec;
  float v[1];
  gemv_tc_rows(sh, src, xr, v);
  const int lane = threadIdx.x, o = threadIdx.y, n = n0 + o;
  if (n < p.n && lane < src.nrows) gemv_part_store(p, (long long)(m0 + lane) * p.n + n, v[0]);
}

// The part whose column blocks cover grid column *b (parts in order; *b becomes the block within it), or nparts.
static __device__ __forceinline__ int gemv_part_of(const GemvPart* parts, int nparts, int* b) {
  int p = 0;
  for (; p < nparts; ++p) {                  // uniform over the block: every thread takes the same part
    const int nb = (parts[p].n + GEMV_OUTS - 1) / GEMV_OUTS;
    if (*b < nb) break;
    *b -= nb;
  }
  return p;
}
