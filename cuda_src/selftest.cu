// selftest.cu -- kernels that exercise the CPU emulator (tests/kernels/test_emulator.py)
// and give the NVRTC compile gate a real file.  Written in the emulatable style
// described in cuda_src/README.md.
#include "common.cuh"

// Tree reduction in static shared memory: out[b] = sum of x[b*blockDim.x : (b+1)*blockDim.x].
// blockDim.x must be a power of two <= 1024.
extern "C" __global__ void block_reduce_sum(const float* __restrict__ x,  // [n] f32
                                            float* __restrict__ out,      // [gridDim.x] f32
                                            int n) {
  __shared__ float s[1024];
  const int tid = threadIdx.x;
  const long long i = (long long)blockIdx.x * blockDim.x + tid;
  s[tid] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (tid < stride) s[tid] += s[tid + stride];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = s[0];
}

// Two barriers per thread; used by bench/emulator_cost.py.
extern "C" __global__ void two_barrier_scale(const float* __restrict__ x,  // [gridDim.x*blockDim.x] f32
                                             float* __restrict__ y,        // [gridDim.x*blockDim.x] f32
                                             float alpha) {
  __shared__ float s[1024];
  const int tid = threadIdx.x;
  const long long i = (long long)blockIdx.x * blockDim.x + tid;
  s[tid] = x[i];
  __syncthreads();
  const float v = s[blockDim.x - 1 - tid] * alpha;
  __syncthreads();
  s[tid] = v;
  y[i] = v + s[tid];
}

// Per-warp sums with the fixed butterfly (warp_sum) and with __shfl_down_sync.
extern "C" __global__ void warp_reduce(const float* __restrict__ x,     // [nthreads] f32
                                       float* __restrict__ out_xor,     // [nthreads] f32, every lane
                                       float* __restrict__ out_down) {  // [nthreads/32] f32, lane 0
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const float v = x[i];
  out_xor[i] = warp_sum(v);
  float d = v;
  for (int off = 16; off > 0; off >>= 1) d += __shfl_down_sync(FULL_MASK, d, off);
  if ((threadIdx.x & 31) == 0) out_down[i / 32] = d;
}

// Every shuffle flavour with a runtime width and lane parameter.
extern "C" __global__ void shfl_modes(const int* __restrict__ in,  // [nthreads] i32
                                      int* __restrict__ out,       // [4, nthreads] i32: idx, up, down, xor
                                      int width, int param) {
  const int n = gridDim.x * blockDim.x;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int v = in[i];
  out[0 * n + i] = __shfl_sync(FULL_MASK, v, param, width);
  out[1 * n + i] = __shfl_up_sync(FULL_MASK, v, (unsigned)param, width);
  out[2 * n + i] = __shfl_down_sync(FULL_MASK, v, (unsigned)param, width);
  out[3 * n + i] = __shfl_xor_sync(FULL_MASK, v, param, width);
}

// Shuffle of 64-bit and bf16 values (default width).
extern "C" __global__ void shfl_types(const double* __restrict__ d,           // [32] f64
                                      const __nv_bfloat16* __restrict__ h,    // [32] bf16
                                      double* __restrict__ d_out,             // [32] f64
                                      __nv_bfloat16* __restrict__ h_out) {    // [32] bf16
  const int l = threadIdx.x;
  d_out[l] = __shfl_sync(FULL_MASK, d[l], 31 - l);
  h_out[l] = __shfl_xor_sync(FULL_MASK, h[l], 1);
}

// Votes: pred[i] != 0 per thread; ballot per warp, any/all per thread.
extern "C" __global__ void votes(const int* __restrict__ pred,     // [nthreads] i32
                                 unsigned* __restrict__ ballot,    // [nthreads] u32
                                 int* __restrict__ any_all,        // [2, nthreads] i32
                                 int* __restrict__ counts) {       // [3 * gridDim.x] i32: count/and/or
  const int n = gridDim.x * blockDim.x;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int p = pred[i];
  ballot[i] = __ballot_sync(FULL_MASK, p);
  any_all[i] = __any_sync(FULL_MASK, p);
  any_all[n + i] = __all_sync(FULL_MASK, p);
  __syncwarp();
  const int c = __syncthreads_count(p);
  const int a = __syncthreads_and(p);
  const int o = __syncthreads_or(p);
  if (threadIdx.x == 0) {
    counts[3 * blockIdx.x + 0] = c;
    counts[3 * blockIdx.x + 1] = a;
    counts[3 * blockIdx.x + 2] = o;
  }
}

// Sub-warp shuffles under a partial mask: the low 16 lanes reduce among themselves.
extern "C" __global__ void half_warp_sum(const float* __restrict__ x,  // [32] f32
                                         float* __restrict__ out) {    // [32] f32
  const int l = threadIdx.x;
  float v = x[l];
  if (l < 16) {
    for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(0x0000ffffu, v, off, 16);
  }
  out[l] = v;
}

// Slot allocator: every thread i < n claims a slot with atomicAdd and writes its id there.
extern "C" __global__ void atomic_slots(int* __restrict__ counter,  // [1] i32
                                        int* __restrict__ slots,    // [n] i32
                                        int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const int s = atomicAdd(counter, 1);
    slots[s] = i;
  }
}

// The other atomics; results are order-independent.
extern "C" __global__ void atomic_misc(int* __restrict__ ints,                  // [4] i32: max, min, cas-winner, exch-count
                                       unsigned* __restrict__ uor,              // [1] u32
                                       float* __restrict__ fsum,                // [1] f32
                                       unsigned long long* __restrict__ usum,   // [1] u64
                                       int* __restrict__ exch_seen) {           // [nthreads] i32
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  atomicMax(&ints[0], i * 7 % 1000);
  atomicMin(&ints[1], 1000 - i);
  atomicCAS(&ints[2], -1, i);  // exactly one thread wins
  exch_seen[i] = atomicExch(&ints[3], i);
  atomicOr(uor, 1u << (i % 32));
  atomicAdd(fsum, 1.0f);
  atomicAdd(usum, (unsigned long long)i);
  atomicSub(&ints[3], 0);
}

// float -> bf16 (RN), bf16 -> float, and bf16 arithmetic.
extern "C" __global__ void bf16_convert(const float* __restrict__ in,              // [n] f32
                                        unsigned short* __restrict__ rn_bits,      // [n] u16
                                        float* __restrict__ back,                  // [n] f32
                                        int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const __nv_bfloat16 h = __float2bfloat16(in[i]);
  rn_bits[i] = __bfloat16_as_ushort(h);
  back[i] = __bfloat162float(h);
}

extern "C" __global__ void bf16_arith(const __nv_bfloat16* __restrict__ a,  // [n] bf16
                                      const __nv_bfloat16* __restrict__ b,  // [n] bf16
                                      __nv_bfloat16* __restrict__ out,      // [4, n] bf16: a+b, a-b, a*b, a/b
                                      int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const __nv_bfloat16 x = a[i], y = b[i];
  out[0 * n + i] = x + y;
  out[1 * n + i] = x - y;
  out[2 * n + i] = x * y;
  out[3 * n + i] = x / y;
}

// Dynamic shared memory: reverse each block's slice through the buffer.
extern "C" __global__ void dyn_smem_reverse(const float* __restrict__ x,  // [gridDim.x*blockDim.x] f32
                                            float* __restrict__ y,        // [gridDim.x*blockDim.x] f32
                                            unsigned* __restrict__ poison) {  // [gridDim.x*blockDim.x] u32
  extern __shared__ float buf[];
  const int tid = threadIdx.x;
  const int i = blockIdx.x * blockDim.x + tid;
  poison[i] = __float_as_uint(buf[blockDim.x + tid]);  // never written: must read 0xFFFFFFFF
  buf[tid] = x[i];
  __syncthreads();
  y[i] = buf[blockDim.x - 1 - tid];
}

// Reads static shared memory that nobody wrote.
extern "C" __global__ void read_uninit_shared(unsigned* __restrict__ out,     // [blockDim.x] u32
                                              unsigned char* __restrict__ bytes) {  // [blockDim.x] u8
  __shared__ unsigned s[256];
  __shared__ unsigned char c[256];
  out[threadIdx.x] = s[threadIdx.x];
  bytes[threadIdx.x] = c[threadIdx.x];
  __syncthreads();
  s[threadIdx.x] = 0;  // must be poisoned again before the next block
  c[threadIdx.x] = 0;
}

// Writes its coordinates at the linear global thread index (3-D grid and block).
extern "C" __global__ void index_3d(int* __restrict__ out) {  // [total_threads, 8] i32
  const int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int nt = blockDim.x * blockDim.y * blockDim.z;
  int* o = out + 8 * (bx * nt + tx);
  o[0] = blockIdx.x; o[1] = blockIdx.y; o[2] = blockIdx.z;
  o[3] = threadIdx.x; o[4] = threadIdx.y; o[5] = threadIdx.z;
  o[6] = gridDim.x * 10000 + gridDim.y * 100 + gridDim.z;
  o[7] = blockDim.x * 10000 + blockDim.y * 100 + blockDim.z;
}

// Scalar parameter kinds: writes them back so the test checks the ABI.
extern "C" __global__ void scalar_kinds(long long* __restrict__ out,  // [6] i64
                                        float* __restrict__ fout,     // [2] f32
                                        int a, unsigned b, long long c, size_t d, float e, double f) {
  out[0] = a; out[1] = b; out[2] = c; out[3] = (long long)d;
  fout[0] = e; fout[1] = (float)f;
}
