// kda_step.cu -- the KDA decode step of decode/verify rows in one launch: kda_step (one segment, out of place) and
// kda_step_slots (several sequences on state slots, in place: CUDA graphs, engine/graph_capture.py).
//
// A block is (head h, 16 value rows vr0 ..): per chunk of up to 16 tokens it first computes the low-rank second
// factors of its rows, a = bf16(fa f_b[h]^T) over all K key columns of the head (the decay of every column) and
// gate_out = bf16(ga g_b^T) of its own 16 value rows (written for kda_out_gemm), with gemv_tc.cuh's body: the
// tensor core's order and one rounding, so the bits are the reference's gemm of these rows (NumpyOps.kda_step).  Then
// per token
// the conv, the q/k norms, the decay of a and the delta rule (kda_rows.cuh), as kda_conv, l2norm x2, kda_gate and
// kda_recurrence.  Reference: NumpyOps.kda_step / kda_step_slots (cupyglm/backend/numpy_kda.py).
// Block (16, 16): group threadIdx.y owns value row vr0 + threadIdx.y, lane threadIdx.x; every block of a head
// re-reads the head's [K, r] slice of f_b (L2-resident: the same slice for all of them); kda_step_slots' blocks
// loop over the call's sequences, so a chunk of 16 rows reads it once whatever the number of sequences.
#include "common.cuh"
#include "exp_f32.cuh"
#include "gemv_tc.cuh"
#include "kda_rows.cuh"

#define KDA_STEP_ROWS 16      // value rows per block (threadIdx.y)

struct KdaStepShared {
  GemvTcShared<1> gemv;                            // the low-rank GEMV's slice results
  unsigned short a[GEMV_ROWS][16 * KDA_MAX_J];     // [token of the chunk, key column] bf16 bit patterns of a
  float head[3][16 * KDA_MAX_J];                   // [q, k, g][key column] f32: one token's normed q, k and decay
};

// The low-rank second factors of one segment's rows.
struct KdaLowRank {
  const __nv_bfloat16* fa;   // [n, r] bf16 the segment's f_a rows
  const __nv_bfloat16* ga;   // [n, r] bf16 the segment's g_a rows
  const __nv_bfloat16* fb;   // [H K, r] bf16 f_b
  const __nv_bfloat16* gb;   // [H K, r] bf16 g_b
  __nv_bfloat16* gate;       // [n, H, K] bf16 out: gate_out of the segment's rows
  int r;
};

// Rows c0 .. c0 + ncols - 1 of w [., r] against tokens t0 .. t0 + nt - 1 of x [., r]: gemv_tc_rows, this
// thread's (token threadIdx.x, column threadIdx.y) fp32 sum returned (every thread takes part: barriers).
static __device__ __forceinline__ float kda_lowrank_tile(GemvTcShared<1>& sh, const __nv_bfloat16* x,
                                                         const __nv_bfloat16* w, long long c0, int ncols, int t0,
                                                         int nt, int r) {
  GemvSrc<1> src;
  src.w[0] = w + c0 * r;
  src.x = x + (long long)t0 * r;
  src.ncols = ncols;
  src.nrows = nt;
  src.K = r;
  src.vec = gemv_aligned(src.x, src.w[0], r);
  float out[1];
  gemv_tc_rows(sh, src, out);
  return out[0];
}

// Tokens t0 .. t0 + nt - 1 (nt <= 16): a of head h into sh.a (all K columns), gate_out of value rows vr0 .. to
// memory; ent (shared, null: every row is some sequence's): a row with ent[row - t0] < 0 gets a +0.0 gate.
// CONTROL_FACTOR_ROW (planted): a's column k takes the sum of f_b's neighbouring row k ^ 1.
static __device__ __forceinline__ void kda_lowrank_chunk(KdaStepShared& sh, const KdaLowRank& lr, int H, int K, int h,
                                                         int vr0, int t0, int nt, const int* ent = nullptr) {
  const int lane = threadIdx.x, o = threadIdx.y;
  for (int c = 0; c < K; c += GEMV_OUTS) {
    const int nc = min(GEMV_OUTS, K - c);
    const float av = kda_lowrank_tile(sh.gemv, lr.fa, lr.fb, (long long)h * K + c, nc, t0, nt, lr.r);
#ifdef CONTROL_FACTOR_ROW
    const int col = (c + o) ^ 1;
#else
    const int col = c + o;
#endif
    if (o < nc && lane < nt) sh.a[lane][col] = __bfloat16_as_ushort(to_bf16(av));
  }
  const int nv = min(KDA_STEP_ROWS, K - vr0);
  const float gs = kda_lowrank_tile(sh.gemv, lr.ga, lr.gb, (long long)h * K + vr0, nv, t0, nt, lr.r);  // publishes sh.a
  if (o < nv && lane < nt) {
    const float gv = ent != nullptr && ent[lane] < 0 ? 0.0f : gs;
    lr.gate[((long long)(t0 + lane) * H + h) * K + vr0 + o] = to_bf16(gv);
  }
}

// One token t of head h, once per block into sh.head (read by every group after a barrier): group 0 the conv of q
// and q = l2norm(q) * q_scale, group 1 the conv of k and k = l2norm(k) (kda_conv_at, l2norm's lane-16 sums: one
// code path, the shuffles convergent), group 2 g = kda_gate(a) (kda_gate's expression per element), the others
// idle.  x, window: as kda_step_group's.
static __device__ __forceinline__ void kda_head_token(KdaStepShared& sh, const __nv_bfloat16* x,
                                                      const __nv_bfloat16* window, const __nv_bfloat16* cw,
                                                      const float* dt_bias, float ea, int t, int tc, int H, int K,
                                                      int taps, float lower, float eps, float q_scale, int h,
                                                      int lane) {
  const int grp = threadIdx.y, C = 3 * H * K;
  if (grp < 2) {                                       // warp 0: q (group 0) and k (group 1)
    const long long c0 = (long long)(grp * H + h) * K;
    float* out = sh.head[grp];
    float sq = 0.0f;
#pragma unroll 1
    for (int kk = lane; kk < K; kk += 16) {            // the lane's own elements: read back by it alone
      const float v = kda_conv_at(x, window, cw, t, c0 + kk, C, taps);
      out[kk] = v;
      sq += v * v;
    }
    const float rn = 1.0f / sqrtf(lane16_fold(sq) + eps);
#pragma unroll 1
    for (int kk = lane; kk < K; kk += 16) {
      const float yn = out[kk] * rn;
      out[kk] = grp == 0 ? yn * q_scale : yn;
    }
  } else if (grp == 2) {
    for (int kk = lane; kk < K; kk += 16) {
#ifdef CONTROL_GATE_HEAD
      const float inner = ea * (gemv_bf(sh.a[tc][kk]) + dt_bias[(long long)((h + 1) % H) * K + kk]);
#else
      const float inner = ea * (gemv_bf(sh.a[tc][kk]) + dt_bias[(long long)h * K + kk]);
#endif
      sh.head[2][kk] = exp_f32(lower * sigmoid_f32(inner));
    }
  }
}

// One token t of a sequence (tc: its row in the chunk, sh.a's row) for value row vr0 + threadIdx.y of head h, by
// its group of 16 threads (the block's groups together: barriers): kda_head_token, then kda_token on the group's
// own v channel (kda_conv_at) with the group's state row s: kda_conv, l2norm x2, kda_gate and kda_recurrence
// (V = K).  x, beta, y point at the sequence's first row; window at its [taps-1, 3HK] saved rows (null: zeros).
static __device__ __forceinline__ void kda_row_step(KdaStepShared& sh, float* s, const __nv_bfloat16* x,
                                                    const __nv_bfloat16* window, const __nv_bfloat16* cw,
                                                    const float* dt_bias, const __nv_bfloat16* beta,
                                                    __nv_bfloat16* y, float ea, int t, int tc, int H, int K,
                                                    int taps, float lower, float eps, float q_scale, int h, int vr0,
                                                    int lane) {
  const int vr = vr0 + threadIdx.y;
  const bool active = vr < K;
  const int C = 3 * H * K;
  const long long cv = (long long)(2 * H + h) * K;
  kda_head_token(sh, x, window, cw, dt_bias, ea, t, tc, H, K, taps, lower, eps, q_scale, h, lane);
  __syncthreads();                                     // sh.head holds token t
  float qv[KDA_MAX_J], kv[KDA_MAX_J], gv[KDA_MAX_J];
#pragma unroll
  for (int j = 0; j < KDA_MAX_J; ++j) {
    const int kk = lane + 16 * j;
    qv[j] = kk < K ? sh.head[0][kk] : 0.0f;
    kv[j] = kk < K ? sh.head[1][kk] : 0.0f;
    gv[j] = kk < K ? sh.head[2][kk] : 0.0f;
  }
  const float vv = active ? kda_conv_at(x, window, cw, t, cv + vr, C, taps) : 0.0f;
  const float bv = active ? ld_bf16(beta, (long long)t * H + h) : 0.0f;
  const float yv = kda_token(s, qv, kv, gv, lane, K, active, vv, bv);
  if (active && lane == 0) y[((long long)t * H + h) * K + vr] = to_bf16(yv);
  __syncthreads();                                     // every group has read sh.head (and sh.a) of token t
}

// The decode rows of one segment for value row vr0 + threadIdx.y of head h (the block's groups together:
// barriers): per chunk of 16 tokens kda_lowrank_chunk, then kda_row_step per token: the bits of gemm_multi's f_b
// and g_b, kda_conv, l2norm x2, kda_gate and kda_recurrence.  S_in null: a zero state; S_out null: the state not
// written.  x, beta, y and lr's rows point at the segment's first row; window at its [taps-1, 3HK] saved rows.
static __device__ __forceinline__ void kda_step_group(KdaStepShared& sh, const KdaLowRank& lr, const float* S_in,
                                                      float* S_out, const __nv_bfloat16* x,
                                                      const __nv_bfloat16* window, const __nv_bfloat16* cw,
                                                      const float* a_log, const float* dt_bias,
                                                      const __nv_bfloat16* beta, __nv_bfloat16* y, int n, int H,
                                                      int K, int taps, float lower, float eps, float q_scale, int h,
                                                      int vr0, int lane) {
  const int vr = vr0 + threadIdx.y;
  const bool active = vr < K;
  float s[KDA_MAX_J];
  const long long srow = ((long long)h * K + (active ? vr : 0)) * K;
  kda_load_state(s, S_in, srow, lane, K, active && S_in != nullptr);
  const float ea = exp_f32(a_log[h]);
  for (int t0 = 0; t0 < n; t0 += GEMV_ROWS) {
    const int nt = min(GEMV_ROWS, n - t0);
    kda_lowrank_chunk(sh, lr, H, K, h, vr0, t0, nt);
    for (int t = t0; t < t0 + nt; ++t)
      kda_row_step(sh, s, x, window, cw, dt_bias, beta, y, ea, t, t - t0, H, K, taps, lower, eps, q_scale, h, vr0,
                   lane);
  }
  if (S_out != nullptr) kda_store_state(s, S_out, srow, lane, K, active);
}

// The decode step of one segment in one launch (kda_step_group), out of place.  The q/k channels' next window is
// written by the first group of each head, v's by its row's group.  grid (ceil(K / 16), H); block (16, 16).
extern "C" __global__ void __launch_bounds__(256, 1) kda_step(
    const float* __restrict__ S_in,            // [H, K, K] f32
    const __nv_bfloat16* __restrict__ x,       // [n, 3, H, K] bf16: conv input
    const __nv_bfloat16* __restrict__ window,  // [taps-1, 3HK] bf16, oldest first
    const __nv_bfloat16* __restrict__ cw,      // [3HK, taps] bf16 conv taps
    const __nv_bfloat16* __restrict__ fa,      // [n, r] bf16: f_a's rows
    const __nv_bfloat16* __restrict__ ga,      // [n, r] bf16: g_a's rows
    const __nv_bfloat16* __restrict__ fb,      // [H K, r] bf16 f_b (this rank's heads)
    const __nv_bfloat16* __restrict__ gb,      // [H K, r] bf16 g_b (this rank's heads)
    const float* __restrict__ a_log,           // [H] fp32 (stored F32)
    const float* __restrict__ dt_bias,         // [H, K] fp32 (stored F32)
    const __nv_bfloat16* __restrict__ beta,    // [n, H] bf16
    __nv_bfloat16* __restrict__ y,             // [n, H, K] bf16
    __nv_bfloat16* __restrict__ gate,          // [n, H, K] bf16: gate_out
    float* __restrict__ S_out,                 // [H, K, K] f32
    __nv_bfloat16* __restrict__ window_out,    // [taps-1, 3HK] bf16
    int n, int H, int K, int r, int taps, float lower, float eps, float q_scale) {
  __shared__ __align__(16) KdaStepShared sh;
  const int h = blockIdx.y, vr0 = blockIdx.x * KDA_STEP_ROWS;
  const int lane = threadIdx.x, vr = vr0 + threadIdx.y;
  const bool active = vr < K;
  const int C = 3 * H * K;
  const long long cq = (long long)h * K, ck = cq + (long long)H * K, cv = ck + (long long)H * K;
  const KdaLowRank lr = {fa, ga, fb, gb, gate, r};
  kda_step_group(sh, lr, S_in, S_out, x, window, cw, a_log, dt_bias, beta, y, n, H, K, taps, lower, eps, q_scale, h,
                 vr0, lane);
  for (int j = 0; j < taps - 1; ++j) {                 // the next window: exact bf16 copies
    if (blockIdx.x == 0 && threadIdx.y == 0)
      for (int kk = lane; kk < K; kk += 16) {
        window_out[(long long)j * C + cq + kk] = kda_full_at(x, window, n + j, cq + kk, C, taps);
        window_out[(long long)j * C + ck + kk] = kda_full_at(x, window, n + j, ck + kk, C, taps);
      }
    if (active && lane == 0) window_out[(long long)j * C + cv + vr] = kda_full_at(x, window, n + j, cv + vr, C, taps);
  }
}

// The decode step of several sequences in one launch, their states in slots updated in place (a CUDA graph's fixed
// addresses; engine/graph_capture.py).  Entry e of seg is (row0, n, slot): rows row0 .. row0 + n - 1 of x, fa, ga,
// beta, y and gate are one sequence's rows, run in order on S[slot] and window[slot]; n = 0: no work; slot < 0: a
// padding row run on a zero state and window, nothing written back; a row of no entry: y and gate +0.0.
// A block (value rows vr0 .., head h) steps every entry: per chunk of 16 of the call's rows it computes a and the
// gate of all of them (kda_lowrank_chunk: f_b's and g_b's head slices read once per chunk, not once per sequence),
// then steps the chunk's rows in order (kda_row_step), the group's state row in registers from its entry's first
// row (loaded) to its last (stored; an entry may span chunks).  In place is safe: a group owns its state row and
// its v channel's window (read first, written after, rows ascending: row j is written after row n + j > j was
// read); the q/k channels of head h are read by every block of h, so for each entry only the block that finishes
// it last (counted in done[e, h], which it sets back to 0 for the next launch) writes them.
// CONTROL_ENTRY_CARRY (planted): an entry after the block's first starts from the previous entry's state.
// grid (ceil(K / 16), H); block (16, 16).
extern "C" __global__ void __launch_bounds__(256, 1) kda_step_slots(
    float* S,                                  // [slots, H, K, K] f32, in place
    const __nv_bfloat16* __restrict__ x,       // [R, 3, H, K] bf16: conv input
    __nv_bfloat16* window,                     // [slots, taps-1, 3HK] bf16, in place
    const __nv_bfloat16* __restrict__ cw,      // [3HK, taps] bf16 conv taps
    const __nv_bfloat16* __restrict__ fa,      // [R, r] bf16: f_a's rows
    const __nv_bfloat16* __restrict__ ga,      // [R, r] bf16: g_a's rows
    const __nv_bfloat16* __restrict__ fb,      // [H K, r] bf16 f_b (this rank's heads)
    const __nv_bfloat16* __restrict__ gb,      // [H K, r] bf16 g_b (this rank's heads)
    const float* __restrict__ a_log,           // [H] fp32 (stored F32)
    const float* __restrict__ dt_bias,         // [H, K] fp32 (stored F32)
    const __nv_bfloat16* __restrict__ beta,    // [R, H] bf16
    const int* __restrict__ seg,               // [E, 3] int32 (row0, n, slot)
    __nv_bfloat16* __restrict__ y,             // [R, H, K] bf16
    __nv_bfloat16* __restrict__ gate,          // [R, H, K] bf16: gate_out
    int* __restrict__ done,                    // [E, H] int32, 0 on entry and exit
    int R, int E, int H, int K, int r, int taps, float lower, float eps, float q_scale) {
  __shared__ __align__(16) KdaStepShared sh;
  __shared__ int ent[GEMV_ROWS];                       // entry of each row of the chunk, -1: none
  __shared__ int last;
  const int h = blockIdx.y, vr0 = blockIdx.x * KDA_STEP_ROWS, lane = threadIdx.x, vr = vr0 + threadIdx.y;
  const int tid = threadIdx.y * 16 + threadIdx.x;
  const bool active = vr < K;
  const int C = 3 * H * K;
  const long long cq = (long long)h * K, ck = cq + (long long)H * K, cv = ck + (long long)H * K;
  const long long srow = ((long long)h * K + (active ? vr : 0)) * K;
  const KdaLowRank lr = {fa, ga, fb, gb, gate, r};
  const float ea = exp_f32(a_log[h]);
  float s[KDA_MAX_J];
  kda_load_state(s, nullptr, srow, lane, K, false);
#ifdef CONTROL_ENTRY_CARRY
  bool started = false;
#endif
  for (int c0 = 0; c0 < R; c0 += GEMV_ROWS) {
    const int nt = min(GEMV_ROWS, R - c0);
    __syncthreads();                                   // every thread has read the previous chunk's ent
    if (tid < nt) {                                    // rows of no entry, or of an entry with n <= 0: none
      int found = -1;
      for (int e = 0; e < E; ++e)
        if (seg[3 * e + 1] > 0 && seg[3 * e] <= c0 + tid && c0 + tid < seg[3 * e] + seg[3 * e + 1]) found = e;
      ent[tid] = found;
    }
    __syncthreads();                                   // ent is read by kda_lowrank_chunk's gate writes
    kda_lowrank_chunk(sh, lr, H, K, h, vr0, c0, nt, ent);
    for (int t = c0; t < c0 + nt; ++t) {
      const int e = ent[t - c0];                       // the same for the whole block: barriers below are uniform
      if (e < 0) {
        if (active && lane == 0) y[((long long)t * H + h) * K + vr] = to_bf16(0.0f);
        continue;
      }
      const int row0 = seg[3 * e], n = seg[3 * e + 1], slot = seg[3 * e + 2];
      float* Ss = slot >= 0 ? S + (long long)slot * H * K * K : nullptr;
      __nv_bfloat16* win = slot >= 0 ? window + (long long)slot * (taps - 1) * C : nullptr;
      const __nv_bfloat16* xs = x + (long long)row0 * C;
#ifdef CONTROL_ENTRY_CARRY
      if (t == row0 && !started) kda_load_state(s, Ss, srow, lane, K, active && Ss != nullptr);
      started = true;
#else
      if (t == row0) kda_load_state(s, Ss, srow, lane, K, active && Ss != nullptr);
#endif
      kda_row_step(sh, s, xs, win, cw, dt_bias, beta + (long long)row0 * H, y + (long long)row0 * H * K, ea, t - row0,
                   t - c0, H, K, taps, lower, eps, q_scale, h, vr0, lane);
      if (t != row0 + n - 1 || slot < 0) continue;     // the entry's last row: its state and window written back
      kda_store_state(s, Ss, srow, lane, K, active);
      for (int j = 0; j < taps - 1; ++j)               // v: this group's own channel, in place
        if (active && lane == 0) win[(long long)j * C + cv + vr] = kda_full_at(xs, win, n + j, cv + vr, C, taps);
#ifdef CONTROL_WINDOW_EAGER
      if (tid == 0) last = 1;
#else
      if (tid == 0) {                                  // kda_row_step's last barrier: every group has read the window
        __threadfence();
        last = atomicAdd(&done[(long long)e * H + h], 1) == (int)gridDim.x - 1;
        if (last) done[(long long)e * H + h] = 0;
      }
#endif
      __syncthreads();
      if (last)
        for (int kk = tid; kk < K; kk += 256)
          for (int j = 0; j < taps - 1; ++j) {         // rows ascending: in place
            win[(long long)j * C + cq + kk] = kda_full_at(xs, win, n + j, cq + kk, C, taps);
            win[(long long)j * C + ck + kk] = kda_full_at(xs, win, n + j, ck + kk, C, taps);
          }
      __syncthreads();                                 // last is read before the next entry's count sets it
    }
  }
}
