// mma_probe.cu -- the tensor-core primitive (mma.cuh) on its own: D = A @ B + C as a chain of mma.m16n8k16 over
// ascending k blocks of 16, each step's D the next step's C (cupyglm/backend/tensor_core.py: mma_chain), A's
// fragments loaded from global memory or through shared memory by ldmatrix. One warp per 16x8 tile of D (grid = (N / 8, M / 16), block = 32). Storage: A [M, K] and B [K, N] bf16 row-major, C and
// D [M, N] fp32. M % 16 == 0, N % 8 == 0, K % 16 == 0 (the launcher checks).
//
// Planted controls: CONTROL_TRANSPOSED_FRAGMENT (A's fragment loaded from the transposed tile), CONTROL_CHAIN_
// REVERSED (the k blocks in descending order), CONTROL_IEEE_SUM (an fp32 IEEE sum in k order in place of the mma).
#include "common.cuh"
#include "mma.cuh"

#ifdef CONTROL_IEEE_SUM
// Each lane's four D elements as c + a0*b0 + a1*b1 + ... in fp32, read from memory.
static __device__ void ieee_tile(float d[4], const __nv_bfloat16* a, const __nv_bfloat16* b, int n, int k, int row0,
                                 int col0, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) {
    const int r = row0 + g + 8 * (i >> 1), c = col0 + 2 * t + (i & 1);
    for (int kk = k0; kk < k0 + 16; ++kk) d[i] += ld_bf16(a, (long long)r * k + kk) * ld_bf16(b, (long long)kk * n + c);
  }
}
#endif

extern "C" __global__ void mma_probe_chain(const __nv_bfloat16* __restrict__ a,   // [M, K] bf16
                                           const __nv_bfloat16* __restrict__ b,   // [K, N] bf16
                                           const float* __restrict__ c,           // [M, N] fp32
                                           float* __restrict__ d,                 // [M, N] fp32
                                           int n, int k,
                                           int via_ldmatrix) {   // 1: A staged in shared memory, mma_ldmatrix_x4
  __shared__ __align__(16) __nv_bfloat16 tile[16][16];
  const int row0 = blockIdx.y * 16, col0 = blockIdx.x * 8, lane = threadIdx.x & 31;
  float acc[4];
  mma_load_c(acc, c + (long long)row0 * n + col0, n);
  for (int step = 0; step < k / 16; ++step) {
#ifdef CONTROL_CHAIN_REVERSED
    const int k0 = (k / 16 - 1 - step) * 16;
#else
    const int k0 = step * 16;
#endif
#ifdef CONTROL_IEEE_SUM
    ieee_tile(acc, a, b, n, k, row0, col0, k0);
#else
    unsigned fa[4], fb[2];
#ifdef CONTROL_TRANSPOSED_FRAGMENT
    // the tile read as its transpose: element (r, c) taken from (c, r) of a square 16x16 window of A
    const int g = lane >> 2, t = lane & 3;
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
      fa[r] = mma_pack(a[(long long)(row0 + col) * k + k0 + row], a[(long long)(row0 + col + 1) * k + k0 + row]);
    }
#else
    if (via_ldmatrix) {
      for (int i = lane; i < 256; i += 32) tile[i >> 4][i & 15] = a[(long long)(row0 + (i >> 4)) * k + k0 + (i & 15)];
      __syncwarp();
      mma_ldmatrix_x4(fa, &tile[lane & 15][8 * (lane >> 4)]);
      __syncwarp();                                             // the tile is rewritten by the next step
    } else {
      mma_load_a(fa, a + (long long)row0 * k + k0, k);
    }
#endif
    mma_load_b(fb, b + (long long)k0 * n + col0, n);
    mma_m16n8k16_bf16(acc, fa, fb, acc);
#endif
  }
  mma_store_d(d + (long long)row0 * n + col0, n, acc);
}
