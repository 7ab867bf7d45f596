// dequant.cuh -- quantised weights decoded in registers: FP8 block-scaled (e4m3 values, one fp32 scale per
// bn x bk block) and NVFP4 (e2m1 values packed two a byte, one e4m3 scale per 16 values, one fp32 scale per
// tensor).  Self-contained (no other project header): any kernel may include it.
//
// Every decode is exact (a code -> its float32 value by bit assembly), and each weight value is one fixed
// sequence of IEEE fp32 operations that the NumPy twin (cupyglm/backend/qweight.py) repeats:
//   FP8    w = e4m3(v[e, n, k]) * s[e, n / bn, k / bk]                     (one rounding)
//   NVFP4  w = (e2m1(q[e, n, k]) * e4m3(s[e, n, k / 16])) * s2[e]          (the first product is exact)
// Scale semantics as the checkpoints store them: FP8's `weight_scale_inv` multiplies (the name is the inverse of
// the quantiser's scale); ModelOpt NVFP4's `weight_scale` (e4m3) and `weight_scale_2` (fp32) both multiply.
// Nibble order (ModelOpt): byte i of a row holds element 2i in bits 0-3 and element 2i+1 in bits 4-7.
//
// Planted controls of the contract: CONTROL_SCALE_NEXT_BLOCK reads the scale of the next block along K,
// CONTROL_SCALE_TRANSPOSED indexes the scale grid [k block][n block], CONTROL_NIBBLE_SWAP reads the nibbles
// high-first.
#pragma once

// e4m3 (fn: no infinities; S.1111.111 is NaN; bias 7; subnormals m * 2^-9) -> float32, exact.
static __device__ __forceinline__ float dq_e4m3(unsigned int c) {
  const unsigned int e = (c >> 3) & 15u, m = c & 7u, sign = (c & 0x80u) << 24;
  if (e == 15u && m == 7u) return __uint_as_float(0x7fffffffu);
  const float mag = e == 0u ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
  return __uint_as_float(__float_as_uint(mag) | sign);
}

// e2m1 (S.EE.M, bias 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) -> float32, exact.
static __device__ __forceinline__ float dq_e2m1(unsigned int c) {
  const unsigned int e = (c >> 1) & 3u, m = c & 1u, sign = (c & 8u) << 28;
  const float mag = e == 0u ? (float)m * 0.5f : __uint_as_float(((e + 126u) << 23) | (m << 22));
  return __uint_as_float(__float_as_uint(mag) | sign);
}

// Where the scales and codes are found (the GEMM readers below and the decode GEMV, gemv_q_tc.cuh, both index
// through these, so a planted control changes every kernel that reads the format the same way).
// FP8: the fp32 scale of block (nb, kb) of expert e in the [E, sn, sk] grid.
static __device__ __forceinline__ long long dq_fp8_scale_at(long long e, int nb, int kb, int sn, int sk) {
#if defined(CONTROL_SCALE_NEXT_BLOCK)
  kb = (kb + 1) % sk;
#endif
#if defined(CONTROL_SCALE_TRANSPOSED)
  return e * (long long)sn * sk + (long long)(kb % sn) * sk + (nb % sk);
#else
  return (e * sn + nb) * (long long)sk + kb;
#endif
}

// NVFP4: the e4m3 scale of group g (16 values) of row n of expert e in the [E, N, K / 16] grid.
static __device__ __forceinline__ long long dq_nvfp4_scale_at(long long e, int n, int g, int N, int K) {
#if defined(CONTROL_SCALE_NEXT_BLOCK)
  g = (g + 1) % (K / 16);
#endif
#if defined(CONTROL_SCALE_TRANSPOSED)
  return e * (long long)N * (K / 16) + (long long)g * N + n;   // read as if stored [K / 16, N]
#else
  return (e * N + n) * (long long)(K / 16) + g;
#endif
}

// NVFP4: the e2m1 code of element k from its byte (element 2i in the low nibble).
static __device__ __forceinline__ unsigned int dq_nvfp4_code(unsigned int byte, int k) {
#if defined(CONTROL_NIBBLE_SWAP)
  return (k & 1) ? (byte & 15u) : (byte >> 4);
#else
  return (k & 1) ? (byte >> 4) : (byte & 15u);
#endif
}

// FP8 block-scaled weights of E experts (E = 1 for a plain projection).
struct DqFp8 {
  const unsigned char* __restrict__ v;   // [E, N, K] e4m3 codes
  const float* __restrict__ s;           // [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
  int N, K, bn, bk, sn, sk;
  __device__ DqFp8(const unsigned char* v_, const float* s_, int N_, int K_, int bn_, int bk_)
      : v(v_), s(s_), N(N_), K(K_), bn(bn_), bk(bk_), sn((N_ + bn_ - 1) / bn_), sk((K_ + bk_ - 1) / bk_) {}
  __device__ __forceinline__ float at(long long e, int n, int k) const {
    const float q = dq_e4m3(v[(e * N + n) * (long long)K + k]);
    return q * s[dq_fp8_scale_at(e, n / bn, k / bk, sn, sk)];
  }
};

// NVFP4 weights of E experts (K a multiple of 16).
struct DqNvfp4 {
  const unsigned char* __restrict__ v;   // [E, N, K / 2] two e2m1 codes a byte (element 2i low nibble)
  const unsigned char* __restrict__ s;   // [E, N, K / 16] e4m3 weight_scale
  const float* __restrict__ s2;          // [E] fp32 weight_scale_2
  int N, K;
  __device__ DqNvfp4(const unsigned char* v_, const unsigned char* s_, const float* s2_, int N_, int K_)
      : v(v_), s(s_), s2(s2_), N(N_), K(K_) {}
  __device__ __forceinline__ float at(long long e, int n, int k) const {
    const long long row = e * N + n;
    const unsigned int code = dq_nvfp4_code(v[row * (K / 2) + k / 2], k);
    const float q = dq_e2m1(code) * dq_e4m3(s[dq_nvfp4_scale_at(e, n, k / 16, N, K)]);
    return q * s2[e];
  }
};
