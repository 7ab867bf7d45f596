// gemv_q_norm.cu -- gemv_norm.cu's gemv_multi_rmsnorm_lane16 with quantised parts: rmsnorm(x) computed
// in the prologue (gemv_norm_x.cuh) and streamed through up to 2 quantised parts of one format (gemv_q_block.cuh's
// body) and up to 2 bf16 parts (gemv_part.cuh's), each block exactly the norm launch followed by its own GEMV
// launch: a DSA layer's quantised q_b beside the indexer's wq_b.
//
// Launch: block (16, GEMV_OUTS); grid (the parts' column blocks, quantised first, ceil(rows / GEMV_ROWS)).
// Controls (contract): gemv_q_tc.cuh's and gemv_q_dec.cuh's (scales, nibbles, the tensor core's order), and
// CONTROL_NORM_EPS (gemv_norm_x.cuh).
#include "common.cuh"
#include "gemv_q_block.cuh"
#include "gemv_part.cuh"
#include "gemv_norm_x.cuh"

#define GEMV_Q_NORM_PARTS 2                  // quantised parts, and bf16 parts, of gemv_multi_rmsnorm_{fmt}

// The reader's raw row c; gq_x_whole norms each chunk (gemv_q_tc.cuh's whole runs read through both).
static __device__ __forceinline__ const __nv_bfloat16* gq_xrow(const GemvXRms& xr, int c) {
  return xr.x + (long long)c * xr.K;
}
static __device__ __forceinline__ uint4 gq_x_whole(const GemvXRms& xr, const __nv_bfloat16* p, int c, int kk) {
  (void)p;
  return gtc_x_whole(xr, c, kk);
}

// Grid column blockIdx.x: the quantised parts' column blocks first, then the bf16 parts' (parts with n = 0: none).
template <int F>
static __device__ __forceinline__ void gemv_q_norm_body(const __nv_bfloat16* x, const __nv_bfloat16* norm_w, float eps,
                                                        const GemvQw (&wq)[GEMV_Q_NORM_PARTS],
                                                        const GemvPart (&qp)[GEMV_Q_NORM_PARTS],
                                                        const GemvPart (&bp)[GEMV_Q_NORM_PARTS], int K, int rows) {
  int b = blockIdx.x;
  const int q = gemv_part_of(qp, GEMV_Q_NORM_PARTS, &b);
  const int p = q < GEMV_Q_NORM_PARTS ? 0 : gemv_part_of(bp, GEMV_Q_NORM_PARTS, &b);
  if (p == GEMV_Q_NORM_PARTS) return;        // uniform over the block
  __shared__ float scale[GEMV_ROWS];          // the block's rows' 1 / sqrt(mean(x^2) + eps)
  __shared__ __align__(16) GemvTcShared<1> sh;
  const GemvXRms xr = gnr_rows(scale, x, norm_w, K, rows, eps);
  if (q == GEMV_Q_NORM_PARTS) {
    gemv_part_block(sh, bp[p], b, blockIdx.y, rows, xr, gemv_aligned(bp[p].w, bp[p].w, K));
    return;
  }
  const int n0 = b * GEMV_OUTS, m0 = blockIdx.y * GEMV_ROWS;
  const GemvQw w[1] = {wq[q]};
  GemvQSrc<1> src;
  gemv_q_src<1, F>(src, w, 0, n0, min(GEMV_OUTS, qp[q].n - n0), qp[q].n, K, xr.x);
  gemv_q_group_x<F>(sh, src, xr, qp[q], qp[q].n, m0, min(GEMV_ROWS, rows - m0), true);
}

#define GQ_NORM_BF16_ARGS                                                                                         \
    const __nv_bfloat16* __restrict__ w0, void* __restrict__ y0, int n0, int kind0,                               \
    const __nv_bfloat16* __restrict__ w1, void* __restrict__ y1, int n1, int kind1, int M, int K, int rows

// x [M, K] bf16 the rows before the norm, norm_w [K] bf16.  Quantised part p: [nq_p, K] e4m3 codes vq_p, scales
// sq_p [ceil(nq_p / bn), ceil(K / bk)] fp32, into yq_p [M, nq_p] (kindq_p 0 fp32, 1 bf16, 2 bf16 sigmoid); bf16 part p:
// w_p [n_p, K] into y_p [M, n_p] (kind_p); rows [0, rows) of each output.
extern "C" __global__ void __launch_bounds__(256, 2) gemv_multi_rmsnorm_fp8_lane16(
    const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ norm_w, float eps,
    const unsigned char* __restrict__ vq0, const float* __restrict__ sq0, void* __restrict__ yq0, int nq0, int kindq0,
    const unsigned char* __restrict__ vq1, const float* __restrict__ sq1, void* __restrict__ yq1, int nq1, int kindq1,
    int bn, int bk, GQ_NORM_BF16_ARGS) {
  const GemvQw wq[2] = {gemv_qw_fp8(vq0, sq0, bn, bk), gemv_qw_fp8(vq1, sq1, bn, bk)};
  const GemvPart qp[2] = {{x, nullptr, yq0, nq0, K, kindq0}, {x, nullptr, yq1, nq1, K, kindq1}};
  const GemvPart bp[2] = {{x, w0, y0, n0, K, kind0}, {x, w1, y1, n1, K, kind1}};
  gemv_q_norm_body<GEMV_FP8>(x, norm_w, eps, wq, qp, bp, K, rows);
  (void)M;
}

// As gemv_multi_rmsnorm_fp8_lane16 with NVFP4 parts: [nq_p, K / 2] packed e2m1 vq_p (element 2i low nibble), scales
// sq_p [nq_p, K / 16] e4m3 and s2q_p [1] fp32.
extern "C" __global__ void __launch_bounds__(256, 2) gemv_multi_rmsnorm_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ norm_w, float eps,
    const unsigned char* __restrict__ vq0, const unsigned char* __restrict__ sq0, const float* __restrict__ s2q0,
    void* __restrict__ yq0, int nq0, int kindq0,
    const unsigned char* __restrict__ vq1, const unsigned char* __restrict__ sq1, const float* __restrict__ s2q1,
    void* __restrict__ yq1, int nq1, int kindq1, GQ_NORM_BF16_ARGS) {
  const GemvQw wq[2] = {gemv_qw_nvfp4(vq0, sq0, s2q0), gemv_qw_nvfp4(vq1, sq1, s2q1)};
  const GemvPart qp[2] = {{x, nullptr, yq0, nq0, K, kindq0}, {x, nullptr, yq1, nq1, K, kindq1}};
  const GemvPart bp[2] = {{x, w0, y0, n0, K, kind0}, {x, w1, y1, n1, K, kind1}};
  gemv_q_norm_body<GEMV_NVFP4>(x, norm_w, eps, wq, qp, bp, K, rows);
  (void)M;
}
