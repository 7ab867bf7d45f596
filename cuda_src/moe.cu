// moe.cu -- MoE routing (sigmoid scores + correction bias, top-k with ties to the lower id, weights
// renormalised in pick order), SwiGLU with a limit, the weighted combine in slot order, and the plain
// elementwise sigmoid.  Reference: NumpyOps.moe_route / swiglu / moe_combine / sigmoid in
// cupyglm/backend/numpy_ops.py.  Storage: SwiGLU's inputs and output are bf16; the correction bias (stored F32), router
// logits, scores, weights and the combine are fp32 (the reference keeps them fp32).
#include "common.cuh"
#include "exp_f32.cuh"
#include "moe_combine.cuh"
#include "moe_route.cuh"
#include "swiglu.cuh"

// One warp per token row (blockDim.x = 32 * rows per block).  Dynamic shared memory: 2 * E floats per warp.
extern "C" __global__ void moe_route(const float* __restrict__ logits,  // [T, E] f32
                                     const float* __restrict__ bias,          // [E] fp32 (stored F32)
                                     int* __restrict__ ids,             // [T, k] i32 experts in pick order
                                     float* __restrict__ weights,       // [T, k] f32
                                     int T, int E, int k, float scale) {
  extern __shared__ float moe_sh[];
  const int warp = threadIdx.x >> 5;
  const int t = blockIdx.x * (blockDim.x >> 5) + warp;
  if (t >= T) return;  // warp-uniform
  moe_route_token(logits, bias, ids, weights, t, E, k, scale, moe_sh + (long long)warp * 2 * E, threadIdx.x & 31);
}

// out = bf16(bf16(silu(min(gate, L))) * clip(up, -L, L)); no clamp when has_limit == 0.  Elementwise.
extern "C" __global__ void swiglu(const __nv_bfloat16* __restrict__ gate,  // [n] bf16
                                  const __nv_bfloat16* __restrict__ up,    // [n] bf16
                                  __nv_bfloat16* __restrict__ out,         // [n] bf16
                                  long long n, int has_limit, float limit) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = to_bf16(swiglu_f32(ld_bf16(gate, i), ld_bf16(up, i), has_limit, limit));
}

// The weighted combine (moe_combine.cuh), row(t, j) = t * k + j, or pos[t * k + j] when the experts' outputs
// are still in expert-sorted order (no scatter, no atomics).  grid (T, ceil(D / blockDim.x)): tokens on grid.x.
static __device__ __forceinline__ void moe_combine_body(const float* __restrict__ y,      // [T * k, D] f32
                                                        const int* __restrict__ pos,      // [T * k] i32, or nullptr
                                                        const float* __restrict__ w,      // [T, k] f32
                                                        const float* __restrict__ shared, // [T, D] f32
                                                        float* __restrict__ out,          // [T, D] f32
                                                        int T, int k, int D) {
  const int t = blockIdx.x;
  const int d = blockIdx.y * blockDim.x + threadIdx.x;
  if (d >= D) return;
  out[(long long)t * D + d] = moe_combine_at(y, pos, w, shared, T, k, D, t, d);
}

extern "C" __global__ void moe_combine(const float* __restrict__ y,        // [T, k, D] f32
                                       const float* __restrict__ w,        // [T, k] f32
                                       const float* __restrict__ shared,   // [T, D] f32
                                       float* __restrict__ out,            // [T, D] f32
                                       int T, int k, int D) {
  moe_combine_body(y, nullptr, w, shared, out, T, k, D);
}

extern "C" __global__ void moe_combine_sorted(const float* __restrict__ ys,      // [T * k, D] f32 sorted pairs
                                              const int* __restrict__ pos,      // [T * k] i32 sorted slot of pair
                                              const float* __restrict__ w,      // [T, k] f32
                                              const float* __restrict__ shared, // [T, D] f32
                                              float* __restrict__ out,          // [T, D] f32
                                              int T, int k, int D) {
  moe_combine_body(ys, pos, w, shared, out, T, k, D);
}

// out = 1 / (1 + exp(-x)), elementwise fp32.
extern "C" __global__ void sigmoid(const float* __restrict__ x,  // [n] f32
                                   float* __restrict__ out,      // [n] f32
                                   long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = sigmoid_f32(x[i]);
}

// out = bf16(1 / (1 + exp(-x))), elementwise: the sigmoid rounded in its epilogue (beta = bf16(sigmoid(b))).
extern "C" __global__ void sigmoid_bf16(const float* __restrict__ x,       // [n] f32
                                        __nv_bfloat16* __restrict__ out,   // [n] bf16
                                        long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = to_bf16(sigmoid_f32(x[i]));
}
