// mma.cuh -- the tensor core as a project primitive: the warp-collective
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, D[16x8] = A[16x16] @ B[16x8] + C, and the loads that put a
// tile into its fragments. On the GPU it is the PTX instruction; under the emulator the warp rendezvous and the
// CPU model of the tensor core of CUPYGLM_TC_ARCH computes D (cuda_src/sim/cuemu_mma.h, the same model as
// cupyglm/backend/tensor_core.py), so sim = numpy bit for bit. The bits differ from an IEEE fp32 sum: the
// products are aligned, cut and truncated as the architecture's tensor core does.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16; g = lane / 4, t = lane % 4; the lower 16 bits of a
// register hold the lower index):
//   a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]   (d likewise)
// Every lane of the warp must call each function here together (full mask, converged).
#pragma once
#include "common.cuh"

// Two bf16 of memory as one fragment register (lo at the lower 16 bits).
static __device__ __forceinline__ unsigned mma_pack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return (unsigned)__bfloat16_as_ushort(lo) | ((unsigned)__bfloat16_as_ushort(hi) << 16);
}

// d = A @ B + c for this warp's fragments (d may alias c).
static __device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2],
                                                         const float c[4]) {
#ifdef __CUEMU__
  cuemu::MmaLane f;
  for (int i = 0; i < 4; ++i) { f.a[i] = a[i]; f.c[i] = c[i]; }
  f.b[0] = b[0];
  f.b[1] = b[1];
  cuemu::mma_sync(&f, __FILE__, __LINE__);
  for (int i = 0; i < 4; ++i) d[i] = f.d[i];
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#endif
}

// This lane's A fragment of the 16x16 tile at p (row-major, row stride lda elements).
static __device__ __forceinline__ void mma_load_a(unsigned a[4], const __nv_bfloat16* p, long long lda) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int r = 0; r < 4; ++r) {
    const __nv_bfloat16* q = p + (long long)(g + 8 * (r & 1)) * lda + 2 * t + 8 * (r >> 1);
    a[r] = mma_pack(q[0], q[1]);
  }
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lanes 8j..8j+7 name the 8 rows (16 bytes each, in shared memory) of
// matrix j; every lane gets r[j] = matrix j's (lane / 4, 2 (lane % 4) .. +1). With lane l naming row l % 16, column
// 8 (l / 16) of a row-major 16x16 tile, r is that tile's A fragment.
static __device__ __forceinline__ void mma_ldmatrix_x4(unsigned r[4], const __nv_bfloat16* row) {
#ifdef __CUEMU__
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat16* q = __shfl_sync(FULL_MASK, row, 8 * j + (lane >> 2));
    r[j] = mma_pack(q[2 * (lane & 3)], q[2 * (lane & 3) + 1]);
  }
#else
  const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: as mma_ldmatrix_x4 with each 8x8 matrix transposed, r[j] = matrix
// j's (2 (lane % 4) .. +1, lane / 4). Matrices (rows k0..k0+7 | k0+8..k0+15) x (columns n0 | n0+8) of a row-major
// B[k][n] give r[0], r[1] = the B fragment of columns n0 and r[2], r[3] = that of columns n0 + 8.
static __device__ __forceinline__ void mma_ldmatrix_x4_trans(unsigned r[4], const __nv_bfloat16* row) {
#ifdef __CUEMU__
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat16* q0 = __shfl_sync(FULL_MASK, row, 8 * j + 2 * (lane & 3));
    const __nv_bfloat16* q1 = __shfl_sync(FULL_MASK, row, 8 * j + 2 * (lane & 3) + 1);
    r[j] = mma_pack(q0[lane >> 2], q1[lane >> 2]);
  }
#else
  const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// This lane's B fragment of the 16x8 tile at p (B[k][n] row-major, row stride ldb elements).
static __device__ __forceinline__ void mma_load_b(unsigned b[2], const __nv_bfloat16* p, long long ldb) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int r = 0; r < 2; ++r) {
    const __nv_bfloat16* q = p + (long long)(2 * t + 8 * r) * ldb + g;
    b[r] = mma_pack(q[0], q[ldb]);
  }
}

// This lane's C (or D) elements of the 16x8 fp32 tile at p (row-major, row stride ldc elements).
static __device__ __forceinline__ void mma_load_c(float c[4], const float* p, long long ldc) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) c[i] = p[(long long)(g + 8 * (i >> 1)) * ldc + 2 * t + (i & 1)];
}

static __device__ __forceinline__ void mma_store_d(float* p, long long ldd, const float d[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) p[(long long)(g + 8 * (i >> 1)) * ldd + 2 * t + (i & 1)] = d[i];
}
