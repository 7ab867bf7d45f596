// cuemu_mma.h -- part of cuemu.h (the CPU emulator); included only by cuemu.h, in its order.
// The tensor core's mma.m16n8k16 bf16 -> f32, computed by the CPU model of the architecture CUPYGLM_TC_ARCH
// (the same model as cupyglm/backend/tensor_core.py, whose docstring states the rules), and the PTX fragment
// layouts that gather the warp's 32 lanes into the tile and scatter D back.
#ifndef CUEMU_MMA_H_INCLUDED
#define CUEMU_MMA_H_INCLUDED

#ifndef CUPYGLM_TC_ARCH
#define CUPYGLM_TC_ARCH 90
#endif

namespace cuemu {

#if CUPYGLM_TC_ARCH == 90 || CUPYGLM_TC_ARCH == 120
static const int kTcGroup = 16, kTcExtraBits = 2;
#elif CUPYGLM_TC_ARCH == 80
static const int kTcGroup = 8, kTcExtraBits = 1;
#else
#error "no tensor-core model for CUPYGLM_TC_ARCH (80, 90, 120)"
#endif

// One lane's fragments of mma.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA layouts; g = lane / 4, t = lane % 4):
//   a[0] = A[g][2t..2t+1]  a[1] = A[g+8][2t..2t+1]  a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//   b[0] = B[2t..2t+1][g]  b[1] = B[2t+8..2t+9][g]        (the lower 16 bits hold the lower index)
//   c[0..1] = C[g][2t..2t+1]  c[2..3] = C[g+8][2t..2t+1];  d likewise
struct MmaLane {
  unsigned a[4];
  unsigned b[2];
  float c[4];
  float d[4];
};

struct TcPart { int sign, exp; long long sig; bool special; };

static inline TcPart tc_bf16(unsigned short u) {
  int e = (u >> 7) & 0xFF, m = u & 0x7F;
  return {(u >> 15) & 1, e == 0 ? -126 : e - 127, e == 0 ? m : (m | 0x80), e == 0xFF};
}
static inline TcPart tc_f32(float f) {
  unsigned u = bitcast<unsigned>(f);
  int e = (u >> 23) & 0xFF;
  long long m = u & 0x7FFFFF;
  return {(int)(u >> 31), e == 0 ? -126 : e - 127, e == 0 ? m : (m | 0x800000), e == 0xFF};
}

// v * 2^s for v >= 0, cut toward zero when s < 0.
static inline long long tc_shift(long long v, long long s) {
  if (v == 0) return 0;
  if (s >= 0) return v << (s > 62 ? 62 : s);
  return -s > 63 ? 0 : (v >> -s);
}

// float of total * 2^unit truncated toward zero (fp32 subnormals kept; >= 2^128 is infinity).
static inline float tc_round_rz(long long total, long long unit) {
  if (total == 0) return 0.0f;
  unsigned long long mag = total < 0 ? (unsigned long long)(-total) : (unsigned long long)total;
  long long bitlen = 64 - __builtin_clzll(mag);
  long long drop = bitlen - 24;
  if (-149 - unit > drop) drop = -149 - unit;
  if (drop < 0) drop = 0;
  unsigned long long kept = drop > 63 ? 0 : (mag >> drop);
  double v = std::ldexp((double)kept, (int)(unit + drop < -2000 ? -2000 : unit + drop));
  float f = v >= 0x1p128 ? INFINITY : (float)v;
  return total < 0 ? -f : f;
}

// NaN / infinity of one block (step 6 of the model); returns true and sets *out when they decide it.
static inline bool tc_specials(const unsigned short* a, const unsigned short* b, int n, float c, float* out) {
  bool nan = false, pos = false, neg = false;
  for (int i = 0; i < n; ++i) {
    TcPart x = tc_bf16(a[i]), y = tc_bf16(b[i]);
    bool nx = x.special && (x.sig & 0x7F), ny = y.special && (y.sig & 0x7F);
    bool ix = x.special && !nx, iy = y.special && !ny;
    bool zx = !x.special && x.sig == 0, zy = !y.special && y.sig == 0;
    if (nx || ny || (ix && zy) || (iy && zx)) nan = true;
    else if (ix || iy) ((x.sign ^ y.sign) ? neg : pos) = true;
  }
  TcPart z = tc_f32(c);
  if (z.special) {
    if (z.sig & 0x7FFFFF) nan = true;
    else (z.sign ? neg : pos) = true;
  }
  if (nan || (pos && neg)) { *out = bitcast<float>(0x7FFFFFFFu); return true; }
  if (pos || neg) { *out = pos ? INFINITY : -INFINITY; return true; }
  return false;
}

// One block: n <= kTcGroup products aligned with the accumulator c.
static inline float tc_block(const unsigned short* a, const unsigned short* b, int n, float c) {
  float sp;
  if (tc_specials(a, b, n, c, &sp)) return sp;
  TcPart z = tc_f32(c);
  long long top = z.sig ? z.exp : -100000;
  for (int i = 0; i < n; ++i) {
    TcPart x = tc_bf16(a[i]), y = tc_bf16(b[i]);
    if (x.sig * y.sig != 0 && x.exp + y.exp > top) top = x.exp + y.exp;
  }
  long long unit = top - 23 - kTcExtraBits;
  long long total = 0;
  for (int i = 0; i < n; ++i) {
    TcPart x = tc_bf16(a[i]), y = tc_bf16(b[i]);
    long long t = tc_shift(x.sig * y.sig, x.exp + y.exp - 14 - unit);
    total += (x.sign ^ y.sign) ? -t : t;
  }
  long long tc = tc_shift(z.sig, z.exp - 23 - unit);
  total += z.sign ? -tc : tc;
  return tc_round_rz(total, unit);
}

// d = a[0..15] . b[0..15] + c on the model: blocks of kTcGroup in ascending k, each result the next accumulator.
static inline float tc_dot16(const unsigned short* a, const unsigned short* b, float c) {
  for (int k0 = 0; k0 < 16; k0 += kTcGroup) c = tc_block(a + k0, b + k0, kTcGroup, c);
  return c;
}

// The warp's mma: gather the 32 lanes' fragments into A, B, C, compute D, scatter D into each lane's d.
static inline void mma_m16n8k16_run(MmaLane* const* lanes) {
  unsigned short A[16][16], Bt[8][16];
  float C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const MmaLane& f = *lanes[lane];
    int g = lane >> 2, t = lane & 3;
    for (int r = 0; r < 4; ++r) {
      int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
      A[row][col] = (unsigned short)(f.a[r] & 0xFFFFu);
      A[row][col + 1] = (unsigned short)(f.a[r] >> 16);
    }
    for (int r = 0; r < 2; ++r) {
      Bt[g][2 * t + 8 * r] = (unsigned short)(f.b[r] & 0xFFFFu);
      Bt[g][2 * t + 8 * r + 1] = (unsigned short)(f.b[r] >> 16);
    }
    for (int i = 0; i < 4; ++i) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = f.c[i];
  }
  for (int lane = 0; lane < 32; ++lane) {
    MmaLane& f = *lanes[lane];
    int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) {
      int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
      f.d[i] = tc_dot16(A[row], Bt[col], C[row][col]);
    }
  }
}

}  // namespace cuemu

#endif  // CUEMU_MMA_H_INCLUDED
