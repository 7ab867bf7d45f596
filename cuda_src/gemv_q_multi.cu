// gemv_q_multi.cu -- several quantised decode/verify GEMVs in one launch (DESIGN §3b), each block exactly its own
// launch's (gemv_q.cu's bodies, gemv_part.cuh's for bf16 parts): gemv_multi_swiglu_{fp8,nvfp4} the MoE's bf16
// router beside its quantised shared expert's gate/up; gemv_multi_{fp8,nvfp4} up to 3 quantised parts of one
// format, then up to 3 bf16 parts (a DSA layer's q_a, kv_a and wk with the indexer's gate and head weights).
//
// Launch: block (16, GEMV_OUTS); grid (the parts' column blocks in order, ceil(rows / GEMV_ROWS)).
#include "common.cuh"
#include "gemv_q_block.cuh"
#include "gemv_part.cuh"
// gemv_multi.cu's gemv_multi_swiglu_lane16 with a quantised SwiGLU: the MoE's bf16 router (gemv_part.cuh, kind_a)
// and its quantised shared expert's gate/up (gemv_q_swiglu_body) of the same rows x in one launch, each block
// exactly its own launch's.  Grid (ceil(n_a / GEMV_OUTS) + ceil(n_s / GEMV_Q_PAIR_OUTS), ceil(rows / GEMV_ROWS)).
template <int F>
static __device__ __forceinline__ void gemv_q_multi_swiglu_body(const __nv_bfloat16* __restrict__ x,
                                                                const __nv_bfloat16* __restrict__ wa, void* ya,
                                                                int n_a, int kind_a, const GemvQw& wg,
                                                                const GemvQw& wu, __nv_bfloat16* __restrict__ ys,
                                                                int n_s, int K, int rows, int has_limit, float limit) {
  __shared__ __align__(16) GemvTcShared<1> sh;
  const int nba = (n_a + GEMV_OUTS - 1) / GEMV_OUTS;
  if ((int)blockIdx.x < nba) {               // uniform over the block
    const GemvPart p = {x, wa, ya, n_a, K, kind_a};
    gemv_multi_one(sh, p, blockIdx.x, blockIdx.y, rows);
    return;
  }
  gemv_q_swiglu_body<F>(sh, blockIdx.x - nba, x, wg, wu, ys, n_s, K, rows, has_limit, limit);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_multi_swiglu_fp8_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const __nv_bfloat16* __restrict__ wa,   // [n_a, K] bf16 (the router)
    void* __restrict__ ya,                  // [M, n_a] fp32 (kind_a 0) or bf16 (1, 2): rows [0, rows)
    int n_a, int kind_a,
    const unsigned char* __restrict__ wgv,  // gate [n_s, K] e4m3 codes
    const float* __restrict__ wgs,          // gate [ceil(n_s / bn), ceil(K / bk)] fp32 weight_scale_inv
    const unsigned char* __restrict__ wuv,  // up [n_s, K] e4m3 codes
    const float* __restrict__ wus,          // up [ceil(n_s / bn), ceil(K / bk)] fp32 weight_scale_inv
    __nv_bfloat16* __restrict__ ys,         // [M, n_s] bf16: rows [0, rows)
    int n_s, int M, int K, int bn, int bk, int rows, int has_limit, float limit) {
  gemv_q_multi_swiglu_body<GEMV_FP8>(x, wa, ya, n_a, kind_a, gemv_qw_fp8(wgv, wgs, bn, bk),
                                     gemv_qw_fp8(wuv, wus, bn, bk), ys, n_s, K, rows, has_limit, limit);
  (void)M;
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_multi_swiglu_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const __nv_bfloat16* __restrict__ wa,   // [n_a, K] bf16 (the router)
    void* __restrict__ ya,                  // [M, n_a] fp32 (kind_a 0) or bf16 (1, 2): rows [0, rows)
    int n_a, int kind_a,
    const unsigned char* __restrict__ wgv,  // gate [n_s, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ wgs,  // gate [n_s, K / 16] e4m3 weight_scale
    const float* __restrict__ wgs2,         // gate [1] fp32 weight_scale_2
    const unsigned char* __restrict__ wuv,  // up [n_s, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ wus,  // up [n_s, K / 16] e4m3 weight_scale
    const float* __restrict__ wus2,         // up [1] fp32 weight_scale_2
    __nv_bfloat16* __restrict__ ys,         // [M, n_s] bf16: rows [0, rows)
    int n_s, int M, int K, int rows, int has_limit, float limit) {
  gemv_q_multi_swiglu_body<GEMV_NVFP4>(x, wa, ya, n_a, kind_a, gemv_qw_nvfp4(wgv, wgs, wgs2),
                                       gemv_qw_nvfp4(wuv, wus, wus2), ys, n_s, K, rows, has_limit, limit);
  (void)M;
}

#define GEMV_Q_MULTI_PARTS 3                 // quantised parts, and bf16 parts, of gemv_multi_{fmt} (ops_gemv_q)

// Column block b of quantised part p (y_p = epilogue_p of x_p's rows against w): gemv_q_body's bits.
template <int F>
static __device__ __forceinline__ void gemv_q_part(GemvTcShared<1>& sh, const GemvQw& wq, const GemvPart& p, int b,
                                                   int rows) {
  const int n0 = b * GEMV_OUTS, m0 = blockIdx.y * GEMV_ROWS;
  const GemvQw w[1] = {wq};
  GemvQSrc<1> src;
  gemv_q_src<1, F>(src, w, 0, n0, min(GEMV_OUTS, p.n - n0), p.n, p.k, p.x);
  gemv_q_group<F>(sh, src, p.x, p, p.n, p.k, m0, min(GEMV_ROWS, rows - m0), true);
}

// Grid column blockIdx.x: the quantised parts' column blocks first, then the bf16 parts' (parts with n = 0: none).
template <int F>
static __device__ __forceinline__ void gemv_q_multi_body(const GemvQw (&wq)[GEMV_Q_MULTI_PARTS],
                                                         const GemvPart (&qp)[GEMV_Q_MULTI_PARTS],
                                                         const GemvPart (&bp)[GEMV_Q_MULTI_PARTS], int rows) {
  __shared__ __align__(16) GemvTcShared<1> sh;
  int b = blockIdx.x;
  const int q = gemv_part_of(qp, GEMV_Q_MULTI_PARTS, &b);
  if (q < GEMV_Q_MULTI_PARTS) {
    gemv_q_part<F>(sh, wq[q], qp[q], b, rows);
    return;
  }
  const int p = gemv_part_of(bp, GEMV_Q_MULTI_PARTS, &b);
  if (p < GEMV_Q_MULTI_PARTS) gemv_multi_one(sh, bp[p], b, blockIdx.y, rows);
}

#define GQ_MULTI_BF16_ARGS                                                                                        \
    const __nv_bfloat16* __restrict__ x0, const __nv_bfloat16* __restrict__ w0, void* __restrict__ y0, int n0,     \
    int k0, int kind0,                                                                                            \
    const __nv_bfloat16* __restrict__ x1, const __nv_bfloat16* __restrict__ w1, void* __restrict__ y1, int n1,     \
    int k1, int kind1,                                                                                            \
    const __nv_bfloat16* __restrict__ x2, const __nv_bfloat16* __restrict__ w2, void* __restrict__ y2, int n2,     \
    int k2, int kind2, int M, int rows

// Quantised part p: xq_p [M, kq_p] bf16 against [nq_p, kq_p] e4m3 codes vq_p, scales sq_p [ceil(nq_p / bn),
// ceil(kq_p / bk)] fp32, into yq_p [M, nq_p] (kindq_p); bf16 parts as gemv_multi_lane16's.
extern "C" __global__ void __launch_bounds__(256, 2) gemv_multi_fp8_lane16(
    const __nv_bfloat16* __restrict__ xq0, const unsigned char* __restrict__ vq0, const float* __restrict__ sq0,
    void* __restrict__ yq0, int nq0, int kq0, int kindq0,
    const __nv_bfloat16* __restrict__ xq1, const unsigned char* __restrict__ vq1, const float* __restrict__ sq1,
    void* __restrict__ yq1, int nq1, int kq1, int kindq1,
    const __nv_bfloat16* __restrict__ xq2, const unsigned char* __restrict__ vq2, const float* __restrict__ sq2,
    void* __restrict__ yq2, int nq2, int kq2, int kindq2, int bn, int bk, GQ_MULTI_BF16_ARGS) {
  const GemvQw wq[3] = {gemv_qw_fp8(vq0, sq0, bn, bk), gemv_qw_fp8(vq1, sq1, bn, bk), gemv_qw_fp8(vq2, sq2, bn, bk)};
  const GemvPart qp[3] = {{xq0, nullptr, yq0, nq0, kq0, kindq0}, {xq1, nullptr, yq1, nq1, kq1, kindq1},
                          {xq2, nullptr, yq2, nq2, kq2, kindq2}};
  const GemvPart bp[3] = {{x0, w0, y0, n0, k0, kind0}, {x1, w1, y1, n1, k1, kind1}, {x2, w2, y2, n2, k2, kind2}};
  gemv_q_multi_body<GEMV_FP8>(wq, qp, bp, rows);
  (void)M;
}

// Quantised part p: xq_p [M, kq_p] bf16 against [nq_p, kq_p / 2] packed e2m1 vq_p (element 2i low nibble), scales
// sq_p [nq_p, kq_p / 16] e4m3 and s2q_p [1] fp32, into yq_p [M, nq_p] (kindq_p); bf16 parts as gemv_multi_lane16's.
extern "C" __global__ void __launch_bounds__(256, 2) gemv_multi_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ xq0, const unsigned char* __restrict__ vq0, const unsigned char* __restrict__ sq0,
    const float* __restrict__ s2q0, void* __restrict__ yq0, int nq0, int kq0, int kindq0,
    const __nv_bfloat16* __restrict__ xq1, const unsigned char* __restrict__ vq1, const unsigned char* __restrict__ sq1,
    const float* __restrict__ s2q1, void* __restrict__ yq1, int nq1, int kq1, int kindq1,
    const __nv_bfloat16* __restrict__ xq2, const unsigned char* __restrict__ vq2, const unsigned char* __restrict__ sq2,
    const float* __restrict__ s2q2, void* __restrict__ yq2, int nq2, int kq2, int kindq2, GQ_MULTI_BF16_ARGS) {
  const GemvQw wq[3] = {gemv_qw_nvfp4(vq0, sq0, s2q0), gemv_qw_nvfp4(vq1, sq1, s2q1), gemv_qw_nvfp4(vq2, sq2, s2q2)};
  const GemvPart qp[3] = {{xq0, nullptr, yq0, nq0, kq0, kindq0}, {xq1, nullptr, yq1, nq1, kq1, kindq1},
                          {xq2, nullptr, yq2, nq2, kq2, kindq2}};
  const GemvPart bp[3] = {{x0, w0, y0, n0, k0, kind0}, {x1, w1, y1, n1, k1, kind1}, {x2, w2, y2, n2, k2, kind2}};
  gemv_q_multi_body<GEMV_NVFP4>(wq, qp, bp, rows);
  (void)M;
}
