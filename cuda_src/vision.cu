// vision.cu -- the vision tower's own kernels (cupyglm/backend/numpy_vision.py is the reference): a linear's bias
// added to its fp32 GEMM output, exact GELU (erf_f32.cuh), and non-causal attention over one image's patches
// (q/k RMSNorm and the 2-D rotary first, then softmax(q.k * scale) . v with exp_f32).  Every sum is in lane-16
// order (term i in lane i % 16, each lane from +0.0 in increasing i, the lanes folded 8, 4, 2, 1); bf16 rounding
// exactly where the reference rounds; no FMA contraction, so the bits equal NumPy's.
#include "common.cuh"
#include "erf_f32.cuh"
#include "exp_f32.cuh"
#include "norm_row.cuh"

// y[i] + b[i % N] in fp32: a linear's bias after its GEMM.  y: [rows, N] f32, b: [N] bf16.
static __device__ __forceinline__ float biased(const float* __restrict__ y, const __nv_bfloat16* __restrict__ b,
                                               long long i, int N) {
#ifdef CONTROL_BIAS_SHIFT
  return y[i] + ld_bf16(b, (i + 1) % N);
#else
  return y[i] + ld_bf16(b, i % N);
#endif
}

// out = y + b (f32); n = rows * N.
extern "C" __global__ void bias_add_f32(const float* __restrict__ y, const __nv_bfloat16* __restrict__ b,
                                        float* __restrict__ out, long long n, int N) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = biased(y, b, i, N);
}

// out = bf16(y + b); n = rows * N.
extern "C" __global__ void bias_add_bf16(const float* __restrict__ y, const __nv_bfloat16* __restrict__ b,
                                         __nv_bfloat16* __restrict__ out, long long n, int N) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = to_bf16(biased(y, b, i, N));
}

// out = bf16(gelu_f32(x)), elementwise.  x, out: [n] bf16.
extern "C" __global__ void gelu_rows(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out,
                                     long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
#ifdef CONTROL_TANH_GELU
  const float v = ld_bf16(x, i);
  out[i] = to_bf16(v * 0.5f * (1.0f + erf_f32(v * 0.7f)));
#else
  out[i] = to_bf16(gelu_f32(ld_bf16(x, i)));
#endif
}

struct StridedRowBf16 {       // one head's vector of qkv, read as float
  const __nv_bfloat16* xr;
  __device__ float operator()(int i) const { return ld_bf16(xr, i); }
};

// One block per (patch row, head, q or k): normed = rmsnorm(head vector, q_w or k_w, eps) (norm_row.cuh), then
// out = bf16(normed * cos + rotate_half(normed) * sin), rotate_half(x) = [-x[D/2:], x[:D/2]].
// qkv: [n, 3, H, D] bf16; cos, sin: [n, D] f32; normed, out: [2, H, n, D] bf16 (q then k).
extern "C" __global__ void vision_qk_rows(const __nv_bfloat16* __restrict__ qkv, const __nv_bfloat16* __restrict__ qw,
                                          const __nv_bfloat16* __restrict__ kw, const float* __restrict__ cosv,
                                          const float* __restrict__ sinv, __nv_bfloat16* __restrict__ normed,
                                          __nv_bfloat16* __restrict__ out, int n, int H, int D, float eps) {
  const int row = blockIdx.x, h = blockIdx.y, which = blockIdx.z;
  const StridedRowBf16 rd{qkv + (((long long)row * 3 + which) * H + h) * D};
  const long long o = (((long long)which * H + h) * n + row) * D;
  rmsnorm_row(rd, which ? kw : qw, normed + o, D, eps);
  __syncthreads();                                                // the block's normed row is written
  const int half = D / 2;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float x = ld_bf16(normed + o, i);
#ifdef CONTROL_NO_TURN
    const float t = 0.0f;
#else
    const float t = i < half ? -ld_bf16(normed + o, i + half) : ld_bf16(normed + o, i - half);
#endif
    const float a = x * cosv[(long long)row * D + i];
    const float b = t * sinv[(long long)row * D + i];
    out[o + i] = to_bf16(a + b);
  }
}

// Lane-16 dot of two bf16 vectors of length D by one thread (the reference's gemm_batched order).
static __device__ __forceinline__ float dot_lane16(const __nv_bfloat16* a, const __nv_bfloat16* b, int D) {
  float lanes[16];
  for (int l = 0; l < 16; ++l) {
    float acc = 0.0f;
    for (int k = l; k < D; k += 16) {
      const float p = ld_bf16(a, k) * ld_bf16(b, k);
      acc = acc + p;
    }
    lanes[l] = acc;
  }
  return lane16_fold_array(lanes);
}

// One block per (query row, head), dynamic shared memory n floats.  s_j = dot(q, k_j) * scale over all n patches
// (no mask); e_j = exp_f32(s_j - max s); p_j = bf16(e_j / sum e) (sum in lane-16 order over j);
// out[row, h, d] = bf16(sum_j p_j * v[j, h, d]) in lane-16 order over j.
// qk: [2, H, n, D] bf16 (vision_qk_rows' out); qkv: [n, 3, H, D] bf16 (v read from it); out: [n, H, D] bf16.
extern "C" __global__ void vision_attention_rows(const __nv_bfloat16* __restrict__ qk,
                                                 const __nv_bfloat16* __restrict__ qkv,
                                                 __nv_bfloat16* __restrict__ out, int n, int H, int D, float scale) {
  extern __shared__ float va_sh[];                                // [n] scores, then e, then p
  __shared__ float lanes[16];
  __shared__ float stat;
  const int row = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const __nv_bfloat16* q = qk + ((long long)h * n + row) * D;
  const __nv_bfloat16* keys = qk + ((long long)(H + h) * n) * D;
#ifdef CONTROL_CAUSAL
  const int seen = row + 1;
#else
  const int seen = n;
#endif
  for (int j = tid; j < n; j += blockDim.x) va_sh[j] = j < seen ? dot_lane16(q, keys + (long long)j * D, D) * scale
                                                                : -INFINITY;
  __syncthreads();
  if (tid == 0) {
    float m = va_sh[0];
    for (int j = 1; j < n; ++j) m = va_sh[j] > m ? va_sh[j] : m;
    stat = m;
  }
  __syncthreads();
  const float m = stat;
  for (int j = tid; j < n; j += blockDim.x) va_sh[j] = exp_f32(va_sh[j] - m);
  __syncthreads();
  if (tid < 16) {
    float acc = 0.0f;
    for (int j = tid; j < n; j += 16) acc = acc + va_sh[j];
    lanes[tid] = acc;
  }
  __syncthreads();
  if (tid == 0) stat = lane16_fold_array(lanes);
  __syncthreads();
  const float total = stat;
  for (int j = tid; j < n; j += blockDim.x) va_sh[j] = bf16_round(va_sh[j] / total);
  __syncthreads();
  const long long vstride = 3LL * H * D;
  const __nv_bfloat16* v = qkv + (2LL * H + h) * D;
  for (int d = tid; d < D; d += blockDim.x) {
    float part[16];
    for (int l = 0; l < 16; ++l) {
      float acc = 0.0f;
      for (int j = l; j < n; j += 16) {
        const float p = va_sh[j] * ld_bf16(v, j * vstride + d);
        acc = acc + p;
      }
      part[l] = acc;
    }
    out[((long long)row * H + h) * D + d] = to_bf16(lane16_fold_array(part));
  }
}
