// gemv_tile.cuh -- what every decode GEMV shares (the decode GEMVs sum in gemv_tc.cuh and gemv_q_tc.cuh): the block
// shape (16, GEMV_OUTS) summing up to GEMV_ROWS rows against GEMV_OUTS columns of NW weights (1, or 2 for gate and
// up), GemvSrc, gemv_load8 and the x readers.
//
// The x side comes from a reader (x row c's 8 bf16 values at k, packed as gemv_load8 packs them): GemvXMem loads
// them from memory; a prologue reader (gemv_norm.cu) computes them, e.g. a norm of the row, with the bits the
// separate norm kernel would have stored, so nothing after the reader depends on where the row came from.
#pragma once
#include "common.cuh"
#include "check_flag.cuh"

#define GEMV_OUTS 16                   // output columns per block (threadIdx.y)
#define GEMV_ROWS 16                   // rows per block: a call's decode/verify rows of one block

// What one block reads: column n0's row of each weight w[i] (the next columns follow at stride K; ncols of them
// lie inside N) and row m0 of x (nrows rows at stride K); vec: 16-byte loads are aligned (K % 8 == 0).
template <int NW>
struct GemvSrc {
  const __nv_bfloat16* w[NW];
  const __nv_bfloat16* x;
  int ncols, nrows, K;
  bool vec;
};

// A grouped call's run of rows [m, end) whose expert id is outside [0, E): each row counted once (by the
// blocks of the first column block) into the launcher's guard slot (slot < 0: the ids were checked on the host).
static __device__ __forceinline__ void gemv_flag_run(unsigned int* flags, int slot, int m, int end) {
  if (slot < 0 || blockIdx.x != 0) return;
  for (int i = m + threadIdx.y * 16 + threadIdx.x; i < end; i += 256) check_flag(flags, slot, i);
}

static __device__ __forceinline__ bool gemv_aligned(const void* a, const void* b, int K) {
  return (K % 8) == 0 && ((((unsigned long long)a) | ((unsigned long long)b)) & 15ull) == 0;
}

// 8 bf16 bit patterns h[0..8) as one 16-byte chunk (element i at bits 16 (i % 2) of word i / 2).
static __device__ __forceinline__ uint4 gemv_pack8(const unsigned short* h) {
  return make_uint4(h[0] | ((unsigned)h[1] << 16), h[2] | ((unsigned)h[3] << 16), h[4] | ((unsigned)h[5] << 16),
                    h[6] | ((unsigned)h[7] << 16));
}

// The 8 bf16 bit patterns of a packed chunk, element i at h[i].
static __device__ __forceinline__ void gemv_unpack8(uint4 v, unsigned short* h) {
  const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    h[2 * i] = (unsigned short)(u[i] & 0xffffu);
    h[2 * i + 1] = (unsigned short)(u[i] >> 16);
  }
}

// 8 bf16 values at p[0..8) of which `valid` (0..8) lie inside the row; the rest read as +0.0 (never summed).
// `vec`: p is 16-byte aligned and valid == 8 whenever valid > 0, so one 16-byte load does.
// The weight load: a quantised weight (dequant.cuh) plugs in here, unpacking to the same bf16 values in
// registers; nothing after this load depends on how the weight is stored.
static __device__ __forceinline__ uint4 gemv_load8(const __nv_bfloat16* p, int valid, bool vec) {
  if (valid <= 0) return make_uint4(0u, 0u, 0u, 0u);
  if (vec) return *reinterpret_cast<const uint4*>(p);
  unsigned short h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = i < valid ? __bfloat16_as_ushort(p[i]) : (unsigned short)0;
  return gemv_pack8(h);
}

// The plain x reader: row c (of the block's rows) read from memory at stride K; vec as GemvSrc's.
struct GemvXMem {
  const __nv_bfloat16* x;
  int K;
  bool vec;
  __device__ __forceinline__ uint4 load8(int c, int kk, int valid) const {
    return gemv_load8(x + (long long)c * K + kk, valid, vec);
  }
};

static __device__ __forceinline__ float gemv_bf(unsigned short b) { return __bfloat162float(__ushort_as_bfloat16(b)); }
