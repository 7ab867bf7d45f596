// gemv_q.cu -- the decode/verify GEMV for quantised weights on the tensor core (gemv_q_block.cuh): every form of
// gemv.cu and gemv_swiglu.cu for FP8 block-scaled and NVFP4 weights read as stored, made exact bf16 in registers.
// A row's bits are the reference's decode rows (cupyglm/backend/tc_quant.py quant_rows, then the same roundings
// and swiglu.cuh epilogue); prompt rows go to gemm_tc_q.cu (the same order).
//
// Layouts (cupyglm/backend/qweight.py): FP8 values [E, N, K] e4m3, scale [E, ceil(N / bn), ceil(K / bk)] fp32;
// NVFP4 values [E, N, K / 2] (element 2i in the low nibble), scale [E, N, K / 16] e4m3, scale2 [E] fp32; E = 1
// for a plain projection.
//
// Launch: block (16, GEMV_OUTS); dense grid (ceil(N / GEMV_OUTS), ceil(rows / GEMV_ROWS)) for the call's leading
// `rows` decode/verify rows (the dense SwiGLU's: ceil(N / GEMV_Q_PAIR_OUTS) column blocks); grouped grid
// (ceil(N / GEMV_OUTS), M), one block per run of equal expert ids as in gemv.cu (an id outside [0, E) reads
// nothing, gets NaN and is counted into the guard slot `slot` of `flags`).  Several parts in one launch:
// gemv_q_multi.cu.
#include "common.cuh"
#include "gemv_q_block.cuh"
#include "swiglu.cuh"

template <int F, typename Out>
static __device__ __forceinline__ void gemv_q_body(const __nv_bfloat16* __restrict__ x, const GemvQw& wq,
                                                   Out* __restrict__ y, int M, int N, int K, int rows) {
  __shared__ __align__(16) GemvTcShared<1> sh;
  const int n0 = blockIdx.x * GEMV_OUTS, m0 = blockIdx.y * GEMV_ROWS;
  const GemvQw w[1] = {wq};
  GemvQSrc<1> src;
  gemv_q_src<1, F>(src, w, 0, n0, min(GEMV_OUTS, N - n0), N, K, x);
  gemv_q_group<F>(sh, src, x, y, N, K, m0, min(GEMV_ROWS, rows - m0), true);
  (void)M;
}

// The run of rows of equal expert id starting at blockIdx.y (false: this block starts none and leaves).
static __device__ __forceinline__ bool gemv_q_run(const int* group, int M, int E, unsigned int* flags, int slot,
                                                  int& g, int& end) {
  const int m = blockIdx.y;
  g = group[m];
  if (m > 0 && group[m - 1] == g) return false;    // not the start of a run: the whole block leaves together
  end = m + 1;
  while (end < M && group[end] == g) ++end;
  if (!(g >= 0 && g < E)) gemv_flag_run(flags, slot, m, end);
  return true;
}

template <int F, typename Out>
static __device__ __forceinline__ void gemv_q_grouped_body(const __nv_bfloat16* __restrict__ x, const GemvQw& wq,
                                                           const int* __restrict__ group, Out* __restrict__ y,
                                                           int M, int N, int K, int E, unsigned int* flags,
                                                           int slot) {
  __shared__ __align__(16) GemvTcShared<1> sh;
  int g, end;
  if (!gemv_q_run(group, M, E, flags, slot, g, end)) return;
  const bool valid = g >= 0 && g < E;
  const int n0 = blockIdx.x * GEMV_OUTS;
  const GemvQw w[1] = {wq};
  GemvQSrc<1> src;
  gemv_q_src<1, F>(src, w, valid ? g : 0, n0, valid ? min(GEMV_OUTS, N - n0) : 0, N, K, x);
  for (int m0 = blockIdx.y; m0 < end; m0 += GEMV_ROWS)
    gemv_q_group<F>(sh, src, x, y, N, K, m0, min(GEMV_ROWS, end - m0), valid);
}

template <int F>
static __device__ __forceinline__ float gemv_q_swiglu_out(const GemvQSrc<2>& src, const float v[2], int has_limit,
                                                          float limit) {
  return swiglu_f32(bf16_round(gemv_q_out<2, F>(src, v, 0)), bf16_round(gemv_q_out<2, F>(src, v, 1)), has_limit,
                    limit);
}

template <int F>
static __device__ __forceinline__ void gemv_q_grouped_swiglu_body(
    const __nv_bfloat16* __restrict__ x, const GemvQw& wg, const GemvQw& wu, const int* __restrict__ group,
    __nv_bfloat16* __restrict__ y, int M, int N, int K, int E, int has_limit, float limit, unsigned int* flags,
    int slot) {
  __shared__ __align__(16) GemvTcShared<2> sh;
  int g, end;
  if (!gemv_q_run(group, M, E, flags, slot, g, end)) return;
  const bool valid = g >= 0 && g < E;
  const int n0 = blockIdx.x * GEMV_OUTS;
  const GemvQw w[2] = {wg, wu};
  GemvQSrc<2> src;
  gemv_q_src<2, F>(src, w, valid ? g : 0, n0, valid ? min(GEMV_OUTS, N - n0) : 0, N, K, x);
  const int lane = threadIdx.x, o = threadIdx.y, n = n0 + o;
  for (int m0 = blockIdx.y; m0 < end; m0 += GEMV_ROWS) {
    const int nrows = min(GEMV_ROWS, end - m0);
    src.x = x + (long long)m0 * K;
    src.nrows = valid ? nrows : 0;
    float v[2];
    gemv_q_rows<2, F>(sh, src, v);
    if (n < N && lane < nrows)
      y[(long long)(m0 + lane) * N + n] = to_bf16(valid ? gemv_q_swiglu_out<F>(src, v, has_limit, limit) : NAN);
  }
}

// Every form: 2 blocks an SM (<= 128 registers): a lane's loads and decoded fragments in registers, no spills.
extern "C" __global__ void __launch_bounds__(256, 2) gemv_fp8_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wv,   // [N, K] e4m3 codes
    const float* __restrict__ ws,           // [ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    float* __restrict__ y,                  // [M, N] f32: rows [0, rows) written
    int M, int N, int K, int bn, int bk, int rows) {   // rows <= M: the call's leading decode/verify rows
  gemv_q_body<GEMV_FP8>(x, gemv_qw_fp8(wv, ws, bn, bk), y, M, N, K, rows);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_fp8_lane16_bf16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wv,   // [N, K] e4m3 codes
    const float* __restrict__ ws,           // [ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16 (the fp32 sum rounded once): rows [0, rows) written
    int M, int N, int K, int bn, int bk, int rows) {   // rows <= M: the call's leading decode/verify rows
  gemv_q_body<GEMV_FP8>(x, gemv_qw_fp8(wv, ws, bn, bk), y, M, N, K, rows);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_grouped_fp8_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wv,   // [E, N, K] e4m3 codes
    const float* __restrict__ ws,           // [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const int* __restrict__ group,          // [M] int32: expert id of each row (sorted: each slice read once)
    float* __restrict__ y,                  // [M, N] f32
    int M, int N, int K, int E, int bn, int bk,
    unsigned int* __restrict__ flags,       // [slots, 2] u32 guard flags
    int slot) {                             // the slot of "group holds expert ids outside [0, E)", or -1
  gemv_q_grouped_body<GEMV_FP8>(x, gemv_qw_fp8(wv, ws, bn, bk), group, y, M, N, K, E, flags, slot);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_grouped_fp8_lane16_bf16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wv,   // [E, N, K] e4m3 codes
    const float* __restrict__ ws,           // [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const int* __restrict__ group,          // [M] int32: expert id of each row (sorted: each slice read once)
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16 (the fp32 sum rounded once)
    int M, int N, int K, int E, int bn, int bk,
    unsigned int* __restrict__ flags,       // [slots, 2] u32 guard flags
    int slot) {                             // the slot of "group holds expert ids outside [0, E)", or -1
  gemv_q_grouped_body<GEMV_FP8>(x, gemv_qw_fp8(wv, ws, bn, bk), group, y, M, N, K, E, flags, slot);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_swiglu_fp8_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wgv,  // gate [N, K] e4m3 codes
    const float* __restrict__ wgs,          // gate [ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const unsigned char* __restrict__ wuv,  // up [N, K] e4m3 codes
    const float* __restrict__ wus,          // up [ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16: rows [0, rows) written
    int M, int N, int K, int bn, int bk, int rows, int has_limit, float limit) {
  __shared__ __align__(16) GemvTcShared<1> sh;
  gemv_q_swiglu_body<GEMV_FP8>(sh, blockIdx.x, x, gemv_qw_fp8(wgv, wgs, bn, bk), gemv_qw_fp8(wuv, wus, bn, bk),
                               y, N, K, rows, has_limit, limit);
  (void)M;
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_grouped_swiglu_fp8_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wgv,  // gate [E, N, K] e4m3 codes
    const float* __restrict__ wgs,          // gate [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const unsigned char* __restrict__ wuv,  // up [E, N, K] e4m3 codes
    const float* __restrict__ wus,          // up [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const int* __restrict__ group,          // [M] int32 expert id of each row (sorted: each slice read once)
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16
    int M, int N, int K, int E, int bn, int bk, int has_limit, float limit,
    unsigned int* __restrict__ flags,       // [slots, 2] u32 guard flags
    int slot) {                             // the slot of "group holds expert ids outside [0, E)", or -1
  gemv_q_grouped_swiglu_body<GEMV_FP8>(x, gemv_qw_fp8(wgv, wgs, bn, bk), gemv_qw_fp8(wuv, wus, bn, bk), group, y,
                                       M, N, K, E, has_limit, limit, flags, slot);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wv,   // [N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ ws,   // [N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,          // [1] fp32 weight_scale_2
    float* __restrict__ y,                  // [M, N] f32: rows [0, rows) written
    int M, int N, int K, int rows) {   // rows <= M: the call's leading decode/verify rows
  gemv_q_body<GEMV_NVFP4>(x, gemv_qw_nvfp4(wv, ws, ws2), y, M, N, K, rows);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_nvfp4_lane16_bf16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wv,   // [N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ ws,   // [N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,          // [1] fp32 weight_scale_2
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16 (the fp32 sum rounded once): rows [0, rows) written
    int M, int N, int K, int rows) {   // rows <= M: the call's leading decode/verify rows
  gemv_q_body<GEMV_NVFP4>(x, gemv_qw_nvfp4(wv, ws, ws2), y, M, N, K, rows);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_grouped_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wv,   // [E, N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ ws,   // [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,          // [E] fp32 weight_scale_2
    const int* __restrict__ group,          // [M] int32: expert id of each row (sorted: each slice read once)
    float* __restrict__ y,                  // [M, N] f32
    int M, int N, int K, int E,
    unsigned int* __restrict__ flags,       // [slots, 2] u32 guard flags
    int slot) {                             // the slot of "group holds expert ids outside [0, E)", or -1
  gemv_q_grouped_body<GEMV_NVFP4>(x, gemv_qw_nvfp4(wv, ws, ws2), group, y, M, N, K, E, flags, slot);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_grouped_nvfp4_lane16_bf16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wv,   // [E, N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ ws,   // [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,          // [E] fp32 weight_scale_2
    const int* __restrict__ group,          // [M] int32: expert id of each row (sorted: each slice read once)
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16 (the fp32 sum rounded once)
    int M, int N, int K, int E,
    unsigned int* __restrict__ flags,       // [slots, 2] u32 guard flags
    int slot) {                             // the slot of "group holds expert ids outside [0, E)", or -1
  gemv_q_grouped_body<GEMV_NVFP4>(x, gemv_qw_nvfp4(wv, ws, ws2), group, y, M, N, K, E, flags, slot);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_swiglu_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wgv,  // gate [N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ wgs,  // gate [N, K / 16] e4m3 weight_scale
    const float* __restrict__ wgs2,         // gate [1] fp32 weight_scale_2
    const unsigned char* __restrict__ wuv,  // up [N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ wus,  // up [N, K / 16] e4m3 weight_scale
    const float* __restrict__ wus2,         // up [1] fp32 weight_scale_2
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16: rows [0, rows) written
    int M, int N, int K, int rows, int has_limit, float limit) {
  __shared__ __align__(16) GemvTcShared<1> sh;
  gemv_q_swiglu_body<GEMV_NVFP4>(sh, blockIdx.x, x, gemv_qw_nvfp4(wgv, wgs, wgs2),
                                 gemv_qw_nvfp4(wuv, wus, wus2), y, N, K, rows, has_limit, limit);
  (void)M;
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_grouped_swiglu_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const unsigned char* __restrict__ wgv,  // gate [E, N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ wgs,  // gate [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ wgs2,         // gate [E] fp32 weight_scale_2
    const unsigned char* __restrict__ wuv,  // up [E, N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ wus,  // up [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ wus2,         // up [E] fp32 weight_scale_2
    const int* __restrict__ group,          // [M] int32 expert id of each row (sorted: each slice read once)
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16
    int M, int N, int K, int E, int has_limit, float limit,
    unsigned int* __restrict__ flags,       // [slots, 2] u32 guard flags
    int slot) {                             // the slot of "group holds expert ids outside [0, E)", or -1
  gemv_q_grouped_swiglu_body<GEMV_NVFP4>(x, gemv_qw_nvfp4(wgv, wgs, wgs2), gemv_qw_nvfp4(wuv, wus, wus2), group,
                                         y, M, N, K, E, has_limit, limit, flags, slot);
}
