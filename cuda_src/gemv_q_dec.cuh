// gemv_q_dec.cuh -- the register decoders of the quantised decode GEMV (gemv_q_tc.cuh): packed FP8 / NVFP4 bytes
// to exact bf16 pairs for the tensor core's A fragments, by byte permutes (prmt), a few integer ops and one paired
// bf16 multiply a pair.  Self-contained: gemv_q_tc.cuh and the prompt-row kernels include it through that header.
#pragma once
#include "common.cuh"

// prmt: each selector nibble picks one of the 8 bytes of (b:a); its bit 3 replicates the picked byte's sign bit.
static __device__ __forceinline__ unsigned gq_prmt(unsigned a, unsigned b, unsigned s) {
#ifdef __CUEMU__
  const unsigned long long v = ((unsigned long long)b << 32) | a;
  unsigned r = 0u;
  for (int i = 0; i < 4; ++i) {
    const unsigned n = (s >> (4 * i)) & 15u, byte = (unsigned)(v >> (8 * (n & 7u))) & 0xffu;
    r |= (n & 8u ? (byte & 0x80u ? 0xffu : 0u) : byte) << (8 * i);
  }
  return r;
#else
  return __byte_perm(a, b, s);
#endif
}

// Two bf16 products that are exact (every use here), so any rounding gives the same bits.
static __device__ __forceinline__ unsigned gq_bmul2(unsigned a, unsigned b) {
#ifdef __CUEMU__
  const unsigned lo = __float_as_uint(__uint_as_float(a << 16) * __uint_as_float(b << 16)) >> 16;
  const unsigned hi = __float_as_uint(__uint_as_float(a & 0xffff0000u) * __uint_as_float(b & 0xffff0000u)) >> 16;
  return lo | (hi << 16);
#else
  unsigned d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
#endif
}

// gq_bmul2(a, both halves the low (H = 0) or high (H = 1) half of b): the broadcast is the multiply's operand.
template <int H>
static __device__ __forceinline__ unsigned gq_bmul2h(unsigned a, unsigned b) {
#ifdef __CUEMU__
  return gq_bmul2(a, H ? (b >> 16) * 0x10001u : (b & 0xffffu) * 0x10001u);
#else
  unsigned d;
  if (H)
    asm("{.reg .b16 l, h; .reg .b32 s; mov.b32 {l, h}, %2; mov.b32 s, {h, h}; fma.rn.bf16x2 %0, %1, s, %3;}"
        : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  else
    asm("{.reg .b16 l, h; .reg .b32 s; mov.b32 {l, h}, %2; mov.b32 s, {l, l}; fma.rn.bf16x2 %0, %1, s, %3;}"
        : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
#endif
}

// The e4m3 codes of bytes i, j of v (selector 0x(8+j)j(8+i)i with i, j < 4) placed as bf16 bits: each code in a
// half with its sign byte replicated above it, shifted so the code's exponent and mantissa land in the bf16's low
// exponent bits (the value x 2^-120, bf16 subnormals for e4m3's) and the replicated sign in bit 15.
static __device__ __forceinline__ unsigned gq_e4m3_bits(unsigned v, unsigned sel) {
  return (gq_prmt(v, 0u, sel) << 4) & 0x87f087f0u;
}

// e4m3 codes in bytes 0 and 2 of v (bytes 1, 3 zero) -> their bf16 pair, exact: the bits as a bf16 are the value
// x 2^-120, times 2^120.  The NaN codes read as +-480 (tc_quant.E4M3_TC).
static __device__ __forceinline__ unsigned gq_e4m3x2(unsigned v) {
  return gq_bmul2(gq_e4m3_bits(v, 0xa280u), 0x7b807b80u);
}

// 8 e2m1 codes (element j in bits 4j) -> r[j] = the bf16 pair of elements 2j, 2j + 1, exact, unscaled.  The
// magnitude's low and high bf16 bytes by lookup (index code & 7), the sign bit ORed into the high byte.
// CONTROL_NIBBLE_SWAP (planted): a byte's two codes read high-first.
static __device__ __forceinline__ void gq_e2m1x8(unsigned w, unsigned r[4]) {
#ifdef CONTROL_NIBBLE_SWAP
  w = ((w >> 4) & 0x0f0f0f0fu) | ((w & 0x0f0f0f0fu) << 4);
#endif
  const unsigned sel = w & 0x77777777u, w4 = w << 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {               // 0, .5, 1, 1.5, 2, 3, 4, 6: low bytes C0 80 00 00 | C0 80 40 00
    const unsigned s = h ? sel >> 16 : sel;   // high bytes 3F 3F 3F 00 | 40 40 40 40
    const unsigned lo = gq_prmt(0xc0800000u, 0xc0804000u, s);
    const unsigned hi = gq_prmt(0x3f3f3f00u, 0x40404040u, s) | (gq_prmt(w4, w, h ? 0x7362u : 0x5140u) & 0x80808080u);
    r[2 * h] = gq_prmt(lo, hi, 0x5140u);
    r[2 * h + 1] = gq_prmt(lo, hi, 0x7362u);
  }
}

// NVFP4's two group scale codes in bytes 0 and 1 of sc -> their bf16 pair, exact (as gq_e4m3x2).
static __device__ __forceinline__ unsigned gq_nv_scales(unsigned sc) {
  return gq_bmul2(gq_e4m3_bits(sc, 0x9180u), 0x7b807b80u);
}
