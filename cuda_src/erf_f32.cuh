// erf_f32.cuh -- a float32 erf built from IEEE +, *, / and exp_f32 only, so the GPU (NVRTC --fmad=false), the CPU
// emulator (-ffp-contract=off) and the NumPy twin (cupyglm/backend/erf_f32.py, same steps and constants) give the
// same bits.  |x| < 1.5: x * P(x^2), P the Taylor series of erf / x to 24 terms in Horner form; 1.5 <= |x| < 4:
// 1 - exp(-x^2) / sqrt(pi) / K(x), K the Laplace continued fraction x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))
// evaluated from depth ERF_CF_DEPTH up; |x| >= 4: 1 (erfc(4) is below half an ULP of 1).  Capped at 1, odd.
#pragma once
#include "exp_f32.cuh"

#define ERF_TAYLOR_TERMS 24
#define ERF_CF_DEPTH 60

static __device__ __forceinline__ float erf_f32(float x) {
  const float C[ERF_TAYLOR_TERMS] = {   // 2/sqrt(pi) * (-1)^n / (n! (2n + 1)), rounded to float32
      0x1.20dd76p+0f,  -0x1.812746p-2f,  0x1.ce2f22p-4f,  -0x1.b82ce4p-6f,  0x1.565bcep-8f,  -0x1.c02db4p-11f,
      0x1.f9a326p-14f, -0x1.f4d25cp-17f, 0x1.b9e6cap-20f, -0x1.5f742ep-23f, 0x1.fcc572p-27f, -0x1.51d718p-30f,
      0x1.9e6ad6p-34f, -0x1.d8453cp-38f, 0x1.f683aep-42f, -0x1.f56f08p-46f, 0x1.d70b36p-50f, -0x1.a2007ap-54f,
      0x1.5f791ap-58f, -0x1.18cc8ap-62f, 0x1.ab5cc4p-67f, -0x1.3676fcp-71f, 0x1.af83c2p-76f, -0x1.1f690cp-80f};
  const float a = x < 0.0f ? -x : x;
  float y;
  if (a < 1.5f) {
    const float t = a * a;
    float p = C[ERF_TAYLOR_TERMS - 1];
    for (int n = ERF_TAYLOR_TERMS - 2; n >= 0; --n) p = p * t + C[n];
    y = a * p;
  } else if (a >= 4.0f) {
    y = 1.0f;
  } else {                                                        // NaN lands here and stays NaN
    float d = a;
    for (int k = ERF_CF_DEPTH; k > 0; --k) d = a + (0.5f * (float)k) / d;
    y = 1.0f - exp_f32(-(a * a)) * 0x1.20dd76p-1f / d;           // 1/sqrt(pi)
  }
  y = y > 1.0f ? 1.0f : y;
  return x < 0.0f ? -y : y;
}

// The reference's exact GELU: (x * 0.5) * (1 + erf(x / sqrt(2))), float32.
static __device__ __forceinline__ float gelu_f32(float x) {
  return (x * 0.5f) * (1.0f + erf_f32(x / 0x1.6a09e6p+0f));
}
