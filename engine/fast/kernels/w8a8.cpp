// leapvox's optional CPU kernel for w8a8 linears on x86-64 with AVX-512 VNNI (built on first use by
// engine/fast/kernels/__init__.py when a C++ compiler is present; without one leapvox uses torch's prebuilt kernels).
//
// y[m, n] = sx[m] * sw[n] * (sum_k qx[m, k] * w[n, k] - zx[m] * wsum[n]) + bias[n]
//
// w: int8 codes [N, K] (per-output-row scales sw [N], row sums wsum [N]), packed by engine/kernels (`pack`) in
// blocks of 64 output rows, 4 input features at a time, read once per call for all M rows of x;
// x: fp32 [M, K], quantized here per row to unsigned 8 bits with a zero point (the row's range including 0 over
// 255 steps), so the integer dot products are exact (vpdpbusd: u8 x s8 summed in int32). Rows of w are split
// across torch's own intra-op threads (at::parallel_for), so no second thread pool competes with torch's.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int64_t kCols = 64;   // output columns per packed block (4 vectors of 16 int32 sums)
constexpr int64_t kXBlock = 4;  // activation rows per pass over a block (more rows: another pass, from cache)
constexpr int64_t kPrefetch = 4096;  // bytes ahead in a weight stream (the best of 512 .. 8192 measured)

// the lanes of 16 output columns starting at c0 that exist (N - c0 of them at the tail)
inline __mmask16 tail_mask(int64_t N, int64_t c0) {
  return (N - c0) >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (N - c0)) - 1);
}

// fn(row) for rows 0..n-1: on torch's threads when there are enough rows to pay for waking them (prefill, large
// verify calls), else in order here. Each row's work is independent of the others', so the bits do not change.
template <typename F>
inline void rows_in_parallel(int64_t n, const F& fn) {
  if (n < 8) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  at::parallel_for(0, n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

// x row [K] -> u8 codes [K], scale, zero point (asymmetric over [min(x, 0), max(x, 0)], round half to even)
void quantize_row(const float* x, int64_t K, uint8_t* q, float* scale, int32_t* zero) {
  __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 v = _mm512_loadu_ps(x + k);
    lo = _mm512_min_ps(lo, v);
    hi = _mm512_max_ps(hi, v);
  }
  float mn = _mm512_reduce_min_ps(lo), mx = _mm512_reduce_max_ps(hi);
  for (; k < K; ++k) {
    mn = std::min(mn, x[k]);
    mx = std::max(mx, x[k]);
  }
  float s = (mx - mn) / 255.0f;
  if (!(s > 0.0f) || !std::isfinite(s)) s = 1.0f;  // an all-zero row (or inf/nan: garbage in, garbage out)
  int32_t z = static_cast<int32_t>(std::nearbyint(-mn / s));
  z = std::min(255, std::max(0, z));
  const float inv = 1.0f / s;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i vz = _mm512_set1_epi32(z), v0 = _mm512_setzero_si512(), v255 = _mm512_set1_epi32(255);
  for (k = 0; k + 16 <= K; k += 16) {
    __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv));  // nearest, ties to even
    r = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(r, vz), v0), v255);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtepi32_epi8(r));
  }
  for (; k < K; ++k) {
    int32_t r = static_cast<int32_t>(std::nearbyint(x[k] * inv)) + z;
    q[k] = static_cast<uint8_t>(std::min(255, std::max(0, r)));
  }
  *scale = s;
  *zero = z;
}

// The epilogue of 16 output columns of one row: sx * ws * d (+ bias as one explicit FMA, so that no compiler
// contraction can round it differently in one instantiation than in another: every row count, and the AMX path,
// gives the same bits)
inline __m512 scaled(__m512i d, float sx, __m512 ws, const __m512* bias) {
  const __m512 f = _mm512_mul_ps(_mm512_set1_ps(sx), ws);
  return bias ? _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(d), *bias) : _mm512_mul_ps(f, _mm512_cvtepi32_ps(d));
}

// One block of 64 output columns against MB activation rows (m0..m0+MB-1). The block is stored as [K/4][64][4]:
// for each group of 4 input features, the 4 weights of column 0, of column 1, ... so one 64-byte load holds 16
// columns x 4 features, vpdpbusd adds x's 4 bytes (broadcast) times them into 16 column sums at once, and the
// block is read as one sequential stream. No horizontal sums: the epilogue scales 16 columns per instruction.
template <int MB>
inline void block_rows(const int8_t* wb, const uint8_t* qx, int64_t Kp, int64_t m0, int64_t n0, int64_t N,
                       const float* sx, const int32_t* zx, const float* ws, const int32_t* wsum, const float* bias,
                       float* y) {
  __m512i acc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_si512();
  const int64_t quads = Kp / 4;
  for (int64_t q = 0; q < quads; ++q) {
    const int8_t* wq = wb + q * 256;
    for (int j = 0; j < 4; ++j) _mm_prefetch(reinterpret_cast<const char*>(wq + 64 * j + kPrefetch), _MM_HINT_T0);
    const __m512i w0 = _mm512_loadu_si512(wq), w1 = _mm512_loadu_si512(wq + 64);
    const __m512i w2 = _mm512_loadu_si512(wq + 128), w3 = _mm512_loadu_si512(wq + 192);
    for (int m = 0; m < MB; ++m) {
      int32_t four;
      std::memcpy(&four, qx + (m0 + m) * Kp + 4 * q, 4);
      const __m512i xb = _mm512_set1_epi32(four);
      acc[m][0] = _mm512_dpbusd_epi32(acc[m][0], xb, w0);
      acc[m][1] = _mm512_dpbusd_epi32(acc[m][1], xb, w1);
      acc[m][2] = _mm512_dpbusd_epi32(acc[m][2], xb, w2);
      acc[m][3] = _mm512_dpbusd_epi32(acc[m][3], xb, w3);
    }
  }
  for (int j = 0; j < 4; ++j) {
    const int64_t c0 = n0 + 16 * j;
    if (c0 >= N) break;
    const __mmask16 mask = tail_mask(N, c0);
    const __m512 vs = _mm512_maskz_loadu_ps(mask, ws + c0);
    const __m512i vsum = _mm512_maskz_loadu_epi32(mask, wsum + c0);
    const __m512 vb = bias ? _mm512_maskz_loadu_ps(mask, bias + c0) : _mm512_setzero_ps();
    for (int m = 0; m < MB; ++m) {
      const __m512i d = _mm512_sub_epi32(acc[m][j], _mm512_mullo_epi32(_mm512_set1_epi32(zx[m0 + m]), vsum));
      _mm512_mask_storeu_ps(y + (m0 + m) * N + c0, mask, scaled(d, sx[m0 + m], vs, bias ? &vb : nullptr));
    }
  }
}

inline void block_all_rows(const int8_t* wb, const uint8_t* qx, int64_t M, int64_t Kp, int64_t n0, int64_t N,
                           const float* sx, const int32_t* zx, const float* ws, const int32_t* wsum,
                           const float* bias, float* y) {
  int64_t m = 0;
  for (; m + kXBlock <= M; m += kXBlock) block_rows<kXBlock>(wb, qx, Kp, m, n0, N, sx, zx, ws, wsum, bias, y);
  switch (M - m) {
    case 3: block_rows<3>(wb, qx, Kp, m, n0, N, sx, zx, ws, wsum, bias, y); break;
    case 2: block_rows<2>(wb, qx, Kp, m, n0, N, sx, zx, ws, wsum, bias, y); break;
    case 1: block_rows<1>(wb, qx, Kp, m, n0, N, sx, zx, ws, wsum, bias, y); break;
    default: break;
  }
}

// ---- w4a8: 4-bit weights in groups of 64 input features, 8-bit activations per group of 64 --------------------
//
// w[n, k] ~ s[n, g] * u[n, k] + m[n, g] with u in 0..15 (g = k / 64; s, m stored fp16), x[k] ~ sx[g] * qx[k] with qx
// signed 8 bits (symmetric per row and group). Per group: sum_k w x = sx[g] * (s * sum u qx + m * sum qx), where
// sum u qx is exact in int32 (vpdpbusd: the weights' nibbles as the unsigned operand, x's codes as the signed one).
// Packed per block of 64 output rows as [K/8][64][4] bytes: byte (c, i) of octet o holds u[c, 8o + i] in its low
// nibble and u[c, 8o + 4 + i] in its high one, so one 64-byte load covers 16 columns x 8 features; scales and mins
// [K/64][2][64] fp16 per block.
constexpr int64_t kGroup4 = 64;

// x row [K] (K % 64 == 0) -> s8 codes [K], per-group scales sx [K/64] and code sums xs [K/64]
void quantize_row_groups(const float* x, int64_t K, int8_t* q, float* sx, int32_t* xs) {
  for (int64_t g = 0; g < K / kGroup4; ++g) {
    const float* xg = x + g * kGroup4;
    __m512 a = _mm512_setzero_ps();
    for (int i = 0; i < 4; ++i) a = _mm512_max_ps(a, _mm512_abs_ps(_mm512_loadu_ps(xg + 16 * i)));
    float s = _mm512_reduce_max_ps(a) / 127.0f;
    if (!(s > 0.0f) || !std::isfinite(s)) s = 1.0f;
    const __m512 vinv = _mm512_set1_ps(1.0f / s);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    __m512i sum = _mm512_setzero_si512();
    for (int i = 0; i < 4; ++i) {
      __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + 16 * i), vinv));  // nearest, ties to even
      r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
      sum = _mm512_add_epi32(sum, r);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * kGroup4 + 16 * i), _mm512_cvtepi32_epi8(r));
    }
    sx[g] = s;
    xs[g] = _mm512_reduce_add_epi32(sum);
  }
}

// One block of 64 output columns against MB activation rows (w4a8). Each group's integer sums are scaled into fp32
// outputs at the group's end, in group order.
template <int MB>
inline void block_rows4(const uint8_t* wb, const uint16_t* sm, const int8_t* qx, const float* sx, const int32_t* xs,
                        int64_t K, int64_t m0, int64_t n0, int64_t N, const float* bias, float* y) {
  const int64_t G = K / kGroup4;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  __m512 out[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < 4; ++j) out[m][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i acc[MB][4];
    for (int m = 0; m < MB; ++m)
      for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_si512();
    const uint8_t* wg = wb + g * (kGroup4 / 8) * 256;
    for (int64_t o = 0; o < kGroup4 / 8; ++o) {
      const uint8_t* wo = wg + o * 256;
      __m512i wl[4], wh[4];
      for (int j = 0; j < 4; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(wo + 64 * j + kPrefetch), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(wo + 64 * j);
        wl[j] = _mm512_and_si512(v, nib);
        wh[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      }
      for (int m = 0; m < MB; ++m) {
        int32_t lo4, hi4;
        const int8_t* xq = qx + (m0 + m) * K + g * kGroup4 + 8 * o;
        std::memcpy(&lo4, xq, 4);
        std::memcpy(&hi4, xq + 4, 4);
        const __m512i xl = _mm512_set1_epi32(lo4), xh = _mm512_set1_epi32(hi4);
        for (int j = 0; j < 4; ++j) {
          acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], wl[j], xl);
          acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], wh[j], xh);
        }
      }
    }
    const uint16_t* smg = sm + g * 128;
    for (int j = 0; j < 4; ++j) {
      const __m512 vs = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(smg + 16 * j)));
      const __m512 vm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(smg + 64 + 16 * j)));
      for (int m = 0; m < MB; ++m) {
        const float sg = sx[(m0 + m) * G + g];
        const __m512 t = _mm512_fmadd_ps(vm, _mm512_set1_ps(sg * static_cast<float>(xs[(m0 + m) * G + g])), out[m][j]);
        out[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[m][j]), _mm512_mul_ps(vs, _mm512_set1_ps(sg)), t);
      }
    }
  }
  for (int j = 0; j < 4; ++j) {
    const int64_t c0 = n0 + 16 * j;
    if (c0 >= N) break;
    const __mmask16 mask = tail_mask(N, c0);
    const __m512 vb = bias ? _mm512_maskz_loadu_ps(mask, bias + c0) : _mm512_setzero_ps();
    for (int m = 0; m < MB; ++m) _mm512_mask_storeu_ps(y + (m0 + m) * N + c0, mask, _mm512_add_ps(out[m][j], vb));
  }
}

inline void block_all_rows4(const uint8_t* wb, const uint16_t* sm, const int8_t* qx, const float* sx,
                            const int32_t* xs, int64_t M, int64_t K, int64_t n0, int64_t N, const float* bias,
                            float* y) {
  int64_t m = 0;
  for (; m + kXBlock <= M; m += kXBlock) block_rows4<kXBlock>(wb, sm, qx, sx, xs, K, m, n0, N, bias, y);
  switch (M - m) {
    case 3: block_rows4<3>(wb, sm, qx, sx, xs, K, m, n0, N, bias, y); break;
    case 2: block_rows4<2>(wb, sm, qx, sx, xs, K, m, n0, N, bias, y); break;
    case 1: block_rows4<1>(wb, sm, qx, sx, xs, K, m, n0, N, bias, y); break;
    default: break;
  }
}

// A packed weight. w8a8 (bits 8): codes [N/64][K/4][64][4], per-row scales, row sums of the codes. w4a8 (bits 4):
// nibbles [N/64][K/8][64][4] (w4), fp16 scales and mins [N/64][K/64][2][64] (sm). Optional bias either way.
struct Packed {
  const int8_t* w;
  const float* scale;
  const int32_t* sum;
  const float* bias;
  int64_t N, Kp, blocks;
  int bits = 8;
  const uint8_t* w4 = nullptr;
  const uint16_t* sm = nullptr;
};

void linear_raw4(const float* xp, int64_t M, int64_t K, const Packed& p, float* yp) {
  const int64_t G = K / kGroup4;
  std::vector<int8_t> qx(static_cast<size_t>(M * K));
  std::vector<float> sx(M * G);
  std::vector<int32_t> xs(M * G);
  rows_in_parallel(M, [&](int64_t m) { quantize_row_groups(xp + m * K, K, qx.data() + m * K, &sx[m * G], &xs[m * G]); });
  const int64_t block_bytes = K * kCols / 2, block_sm = G * 2 * kCols;
  at::parallel_for(0, p.blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk)
      block_all_rows4(p.w4 + blk * block_bytes, p.sm + blk * block_sm, qx.data(), sx.data(), xs.data(), M, K,
                      blk * kCols, p.N, p.bias, yp);
  });
}

// ---- AMX-INT8 for calls over many rows (w8a8) ------------------------------------------------------------------
//
// The packed block [K/4][64][4] is exactly what AMX's TDPBUSD takes as its B tile (16 quads of K x 16 columns x 4,
// row stride 256 bytes), so a call over many rows (a prefill, a large verify call) multiplies the same u8 activation
// codes by the same s8 weights in tiles of 16 rows x 16 columns x 64 inputs: the same exact int32 sums as the VNNI
// loop, then the same epilogue, so the output is bit for bit the one the VNNI loop gives. Used where Linux grants
// the process AMX tile data (arch_prctl; the CPU has AMX-INT8), for calls of at least kAmxRows rows whose K is a
// multiple of 64; LEAPVOX_AMX=0 turns it off.
constexpr int64_t kAmxRows = 5;

#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define LEAPVOX_AMX_BUILT 1  // the compiler knows AMX's intrinsics (GCC 11+, clang 12+); older ones build without
#else
#define LEAPVOX_AMX_BUILT 0
#endif

bool amx_ready() {
  static const bool ok = [] {
    if (!LEAPVOX_AMX_BUILT) return false;
    const char* env = std::getenv("LEAPVOX_AMX");
    if (env && std::string(env) == "0") return false;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  }();
  return ok;
}

#if LEAPVOX_AMX_BUILT
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tile state is per thread: each worker configures its tiles and releases them (a lambda inherits no target)
__attribute__((target("amx-tile"))) void amx_begin(const TileConfig* cfg) { _tile_loadconfig(cfg); }
__attribute__((target("amx-tile"))) void amx_end() { _tile_release(); }

// int32 sums acc [Mpad][64] of one packed block against Mpad (a multiple of 16) activation rows qx [Mpad][Kp]
__attribute__((target("amx-tile,amx-int8"))) void block_sums_amx(const int8_t* wb, const uint8_t* qx, int64_t Mpad,
                                                                  int64_t Kp, int32_t* acc) {
  for (int64_t m0 = 0; m0 < Mpad; m0 += 16) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k0 = 0; k0 < Kp; k0 += 64) {
      const int8_t* wq = wb + (k0 / 4) * 256;
      _tile_loadd(4, qx + m0 * Kp + k0, Kp);
      _tile_loadd(5, wq, 256);
      _tile_loadd(6, wq + 64, 256);
      _tile_dpbusd(0, 4, 5);
      _tile_loadd(7, wq + 128, 256);
      _tile_dpbusd(1, 4, 6);
      _tile_loadd(5, wq + 192, 256);
      _tile_dpbusd(2, 4, 7);
      _tile_dpbusd(3, 4, 5);
    }
    _tile_stored(0, acc + m0 * 64, 256);
    _tile_stored(1, acc + m0 * 64 + 16, 256);
    _tile_stored(2, acc + m0 * 64 + 32, 256);
    _tile_stored(3, acc + m0 * 64 + 48, 256);
  }
}

void linear_amx(const uint8_t* qx, int64_t M, int64_t Mpad,
                const Packed& p, const float* sx, const int32_t* zx, float* yp) {
  const int64_t Kp = p.Kp, block_bytes = Kp * kCols;
  at::parallel_for(0, p.blocks, 1, [&](int64_t begin, int64_t end) {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.rows[t] = 16;
      cfg.colsb[t] = 64;
    }
    amx_begin(&cfg);
    std::vector<int32_t> acc(static_cast<size_t>(Mpad * 64));
    for (int64_t blk = begin; blk < end; ++blk) {
      block_sums_amx(p.w + blk * block_bytes, qx, Mpad, Kp, acc.data());
      const int64_t n0 = blk * kCols;
      for (int j = 0; j < 4; ++j) {  // the VNNI loop's epilogue (block_rows)
        const int64_t c0 = n0 + 16 * j;
        if (c0 >= p.N) break;
        const __mmask16 mask = tail_mask(p.N, c0);
        const __m512 vs = _mm512_maskz_loadu_ps(mask, p.scale + c0);
        const __m512i vsum = _mm512_maskz_loadu_epi32(mask, p.sum + c0);
        const __m512 vb = p.bias ? _mm512_maskz_loadu_ps(mask, p.bias + c0) : _mm512_setzero_ps();
        for (int64_t m = 0; m < M; ++m) {
          const __m512i a = _mm512_loadu_si512(acc.data() + m * 64 + 16 * j);
          const __m512i d = _mm512_sub_epi32(a, _mm512_mullo_epi32(_mm512_set1_epi32(zx[m]), vsum));
          _mm512_mask_storeu_ps(yp + m * p.N + c0, mask, scaled(d, sx[m], vs, p.bias ? &vb : nullptr));
        }
      }
    }
    amx_end();
  });
}
#else
void linear_amx(const uint8_t*, int64_t, int64_t, const Packed&, const float*, const int32_t*, float*) {}  // unused
#endif

// y [M, N] = x [M, K] (fp32 rows, row stride K) times the packed weight: rows quantized here, blocks over threads.
void linear_raw(const float* xp, int64_t M, int64_t K, const Packed& p, float* yp) {
  if (p.bits == 4) return linear_raw4(xp, M, K, p, yp);
  const int64_t Kp = p.Kp;
  const bool amx = M >= kAmxRows && Kp % 64 == 0 && amx_ready();
  const int64_t Mpad = amx ? (M + 15) / 16 * 16 : M;
  std::vector<uint8_t> qx(static_cast<size_t>(Mpad * Kp), 0);  // padding multiplies zero weights (or is ignored)
  std::vector<float> sx(M);
  std::vector<int32_t> zx(M);
  rows_in_parallel(M, [&](int64_t m) { quantize_row(xp + m * K, K, qx.data() + m * Kp, &sx[m], &zx[m]); });
  if (amx) return linear_amx(qx.data(), M, Mpad, p, sx.data(), zx.data(), yp);
  const int64_t block_bytes = Kp * kCols;
  at::parallel_for(0, p.blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk)
      block_all_rows(p.w + blk * block_bytes, qx.data(), M, Kp, blk * kCols, p.N, sx.data(), zx.data(), p.scale,
                     p.sum, p.bias, yp);
  });
}

// w4a8: nibbles uint8 [N/64, K/8, 64, 4] and scales/mins [N/64, K/64, 2, 64], fp16 bits in int16 (kernels.pack4)
Packed packed4_of(const at::Tensor& w, const at::Tensor& sm, int64_t N, const float* bias, const char* what) {
  TORCH_CHECK(w.dim() == 4 && w.scalar_type() == at::kByte && w.is_contiguous() && w.size(2) == kCols &&
              w.size(3) == 4, what, ": w must be packed uint8 [N/64, K/8, 64, 4] (engine.kernels.pack4)");
  const int64_t K = w.size(1) * 8;
  TORCH_CHECK(K % kGroup4 == 0 && sm.scalar_type() == at::kShort && sm.is_contiguous() && sm.dim() == 4 &&
              sm.size(0) == w.size(0) && sm.size(1) == K / kGroup4 && sm.size(2) == 2 && sm.size(3) == kCols,
              what, ": scales/mins must be fp16 bits in int16 [N/64, K/64, 2, 64]");
  TORCH_CHECK(N > 0 && (N + kCols - 1) / kCols == w.size(0), what, ": ", N, " rows for ", w.size(0), " blocks");
  Packed p{nullptr, nullptr, nullptr, bias, N, K, w.size(0)};
  p.bits = 4;
  p.w4 = w.data_ptr<uint8_t>();
  p.sm = reinterpret_cast<const uint16_t*>(sm.data_ptr<int16_t>());
  return p;
}

Packed packed_of(const at::Tensor& w, const at::Tensor& wscale, const at::Tensor& wsum, const float* bias,
                 const char* what) {
  if (w.scalar_type() == at::kByte) return packed4_of(w, wscale, wsum.size(0), bias, what);  // wsum: [N, 0]
  TORCH_CHECK(w.dim() == 4 && w.scalar_type() == at::kChar && w.is_contiguous() && w.size(2) == kCols &&
              w.size(3) == 4, what, ": w must be packed int8 [N/64, K/4, 64, 4] (engine.kernels.pack)");
  const int64_t N = wscale.numel();
  TORCH_CHECK((N + kCols - 1) / kCols == w.size(0), what, ": ", N, " scales for ", w.size(0), " blocks");
  TORCH_CHECK(wscale.scalar_type() == at::kFloat && wscale.is_contiguous(), what, ": wscale fp32 [N]");
  TORCH_CHECK(wsum.scalar_type() == at::kInt && wsum.numel() == N && wsum.is_contiguous(), what, ": wsum");
  return Packed{w.data_ptr<int8_t>(), wscale.data_ptr<float>(), wsum.data_ptr<int32_t>(), bias, N, w.size(1) * 4,
                w.size(0)};
}

// an optional bias's fp32 data (held alive by `hold`), or nullptr
const float* bias_of(const c10::optional<at::Tensor>& bias, int64_t N, const char* what, at::Tensor& hold) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  hold = bias->contiguous();
  TORCH_CHECK(hold.scalar_type() == at::kFloat && hold.numel() == N, what, ": bias fp32 [N]");
  return hold.data_ptr<float>();
}

at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& wscale, const at::Tensor& wsum,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "w8a8_linear: x must be fp32 [M, K]");
  at::Tensor b;
  const Packed p = packed_of(w, wscale, wsum, bias_of(bias, wscale.numel(), "w8a8_linear", b), "w8a8_linear");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K <= p.Kp && p.Kp - K < 4, "w8a8_linear: x has ", K, " features, the packed weight ", p.Kp,
              " (padded), ", p.N, " rows");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, p.N}, x.options());
  if (M == 0 || p.N == 0) return y;
  linear_raw(xc.data_ptr<float>(), M, K, p, y.data_ptr<float>());
  return y;
}

// x fp32 [M, K] times a w4a8 weight (nibbles, fp16 scales/mins, N) -> fp32 [M, N]
at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sm, int64_t N,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "w4a8_linear: x must be fp32 [M, K]");
  at::Tensor b;
  const Packed p = packed4_of(w, sm, N, bias_of(bias, N, "w4a8_linear", b), "w4a8_linear");
  TORCH_CHECK(x.size(1) == p.Kp, "w4a8_linear: x has ", x.size(1), " features, the weight ", p.Kp);
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return y;
  linear_raw4(xc.data_ptr<float>(), x.size(0), p.Kp, p, y.data_ptr<float>());
  return y;
}

// ---- one Qwen3 decoder layer over w8a8 / w4a8 weights (qwen3_layer) -------------------------------------------------

inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// exp(x) for 16 floats: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], degree-6 polynomial (relative error ~2e-7).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// y = x * rsqrt(mean(x^2) + eps) * w over n floats (n a multiple of 16)
inline void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const float r = 1.0f / std::sqrt(hsum(acc) / static_cast<float>(n) + eps);
  const __m512 vr = _mm512_set1_ps(r);
  for (int64_t i = 0; i < n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_mul_ps(_mm512_loadu_ps(x + i), vr)));
}

// one head [D] in place: RMS-normed with w, then rotate-half RoPE with this row's cos/sin [D]
inline void norm_rope_head(float* x, const float* w, float eps, const float* cos, const float* sin, int64_t D) {
  float tmp[512];
  rms_norm_row(x, w, D, eps, tmp);
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; i += 16) {
    const __m512 a = _mm512_loadu_ps(tmp + i), b = _mm512_loadu_ps(tmp + h + i);
    _mm512_storeu_ps(x + i, _mm512_sub_ps(_mm512_mul_ps(a, _mm512_loadu_ps(cos + i)),
                                          _mm512_mul_ps(b, _mm512_loadu_ps(sin + i))));
    _mm512_storeu_ps(x + h + i, _mm512_add_ps(_mm512_mul_ps(b, _mm512_loadu_ps(cos + h + i)),
                                              _mm512_mul_ps(a, _mm512_loadu_ps(sin + h + i))));
  }
}

// dst [16*NV] = inv * sum over j < span of p[j] * v row j (row stride vs), skipping p[j] == 0; j in order
template <int NV>
inline void weighted_sum(const float* p, int64_t span, const float* v, int64_t vs, float inv, float* dst) {
  __m512 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < span; ++j) {
    if (p[j] == 0.0f) continue;
    const __m512 pj = _mm512_set1_ps(p[j]);
    const float* vr = v + j * vs;
    for (int i = 0; i < NV; ++i) acc[i] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16 * i), acc[i]);
  }
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int i = 0; i < NV; ++i) _mm512_storeu_ps(dst + 16 * i, _mm512_mul_ps(acc[i], vinv));
}

// in-place orthonormal Walsh-Hadamard transform (Sylvester order) of each block of B floats in x [n]
inline void hadamard_blocks(float* x, int64_t n, int64_t B) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(B));
  for (int64_t b0 = 0; b0 < n; b0 += B) {
    float* v = x + b0;
    for (int64_t h = 1; h < B; h *= 2) {
      if (h >= 16) {
        for (int64_t i = 0; i < B; i += 2 * h)
          for (int64_t j = i; j < i + h; j += 16) {
            const __m512 a = _mm512_loadu_ps(v + j), c = _mm512_loadu_ps(v + j + h);
            _mm512_storeu_ps(v + j, _mm512_add_ps(a, c));
            _mm512_storeu_ps(v + j + h, _mm512_sub_ps(a, c));
          }
      } else {
        for (int64_t i = 0; i < B; i += 2 * h)
          for (int64_t j = i; j < i + h; ++j) {
            const float a = v[j], c = v[j + h];
            v[j] = a + c;
            v[j + h] = a - c;
          }
      }
    }
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < B; j += 16) _mm512_storeu_ps(v + j, _mm512_mul_ps(_mm512_loadu_ps(v + j), vs));
  }
}

// x [T, H] -> the layer's output [T, H]. Weights w: ln1 [H], q_norm [D], k_norm [D], ln2 [H], then (packed, scale,
// row sums) of qkv [q | k | v], o, gate_up [gate | up], down. K/V caches kc, vc [nkv, R, P, D] (fp32, D contiguous):
// rows t are written at slot + t into every one of the R copies (PredictorLoop keeps each KV head repeated) and
// attention reads copy 0 over slots [0, span): under `mask` [T, span] (bool, True = may attend) when given, else
// causally (row t sees slots <= slot + t). cos, sin [T, D]: rotate-half RoPE tables for the rows' positions. With
// rot_block > 0 the down projection's input is turned by an orthonormal Hadamard rotation per block of that size.
at::Tensor qwen3_layer(const at::Tensor& x_, at::TensorList w, const at::Tensor& kc, const at::Tensor& vc,
                       int64_t slot, const at::Tensor& cos_, const at::Tensor& sin_,
                       const c10::optional<at::Tensor>& mask_, int64_t span, int64_t nh, int64_t nkv, double eps_,
                       double qk_eps_, int64_t rot_block) {
  TORCH_CHECK(w.size() == 16, "qwen3_layer: 16 weight tensors expected");
  TORCH_CHECK(x_.dim() == 2 && x_.scalar_type() == at::kFloat, "qwen3_layer: x must be fp32 [T, H]");
  const at::Tensor x = x_.contiguous(), cs = cos_.contiguous(), sn = sin_.contiguous();
  const int64_t T = x.size(0), H = x.size(1), D = kc.size(3), P = kc.size(2), R = kc.size(1);
  TORCH_CHECK(kc.dim() == 4 && vc.sizes() == kc.sizes() && kc.size(0) == nkv && kc.stride(3) == 1 &&
              vc.stride(3) == 1 && kc.scalar_type() == at::kFloat && vc.scalar_type() == at::kFloat,
              "qwen3_layer: caches must be fp32 [nkv, R, P, D] with D contiguous");
  TORCH_CHECK(D % 32 == 0 && D <= 512 && H % 16 == 0 && nh % nkv == 0, "qwen3_layer: unsupported head shape");
  TORCH_CHECK(slot + T <= P && span <= P && span >= 1, "qwen3_layer: slots past the cache");
  TORCH_CHECK(cs.dim() == 2 && cs.size(0) == T && cs.size(1) == D && sn.sizes() == cs.sizes() &&
              cs.scalar_type() == at::kFloat && sn.scalar_type() == at::kFloat, "qwen3_layer: cos/sin [T, D]");
  const bool* mask = nullptr;
  at::Tensor mk;
  if (mask_.has_value() && mask_->defined()) {
    mk = mask_->contiguous();
    TORCH_CHECK(mk.scalar_type() == at::kBool && mk.dim() == 2 && mk.size(0) == T && mk.size(1) == span,
                "qwen3_layer: mask must be bool [T, span]");
    mask = mk.data_ptr<bool>();
  } else {
    TORCH_CHECK(span == slot + T, "qwen3_layer: without a mask, span must be slot + T");
  }
  for (int i = 0; i < 4; ++i)
    TORCH_CHECK(w[i].scalar_type() == at::kFloat && w[i].is_contiguous(), "qwen3_layer: norm weights fp32");
  const float *ln1 = w[0].data_ptr<float>(), *qn = w[1].data_ptr<float>(), *kn = w[2].data_ptr<float>(),
              *ln2 = w[3].data_ptr<float>();
  const Packed qkv = packed_of(w[4], w[5], w[6], nullptr, "qwen3_layer qkv");
  const Packed o = packed_of(w[7], w[8], w[9], nullptr, "qwen3_layer o");
  const Packed gu = packed_of(w[10], w[11], w[12], nullptr, "qwen3_layer gate_up");
  const Packed dn = packed_of(w[13], w[14], w[15], nullptr, "qwen3_layer down");
  const int64_t Q = nh * D, KV = nkv * D, I = gu.N / 2, rep = nh / nkv;
  TORCH_CHECK(qkv.N == Q + 2 * KV && qkv.Kp == H && o.N == H && o.Kp == Q && gu.Kp == H && dn.N == H &&
              dn.Kp == I && I % 16 == 0, "qwen3_layer: weight shapes do not match the layer");
  TORCH_CHECK(rot_block == 0 || (I % rot_block == 0 && rot_block >= 16 && (rot_block & (rot_block - 1)) == 0),
              "qwen3_layer: bad rotation block");
  const float eps = static_cast<float>(eps_), qk_eps = static_cast<float>(qk_eps_);
  const float* xp = x.data_ptr<float>();
  at::Tensor out = at::empty({T, H}, x.options());
  float* yp = out.data_ptr<float>();
  std::vector<float> h(T * H), q(T * qkv.N), att(T * Q), g(T * 2 * I);

  // attention block
  rows_in_parallel(T, [&](int64_t t) { rms_norm_row(xp + t * H, ln1, H, eps, h.data() + t * H); });
  linear_raw(h.data(), T, H, qkv, q.data());
  float* kp = kc.data_ptr<float>();
  float* vp = vc.data_ptr<float>();
  const int64_t ks0 = kc.stride(0), ks1 = kc.stride(1), ks2 = kc.stride(2);
  const int64_t vs0 = vc.stride(0), vs1 = vc.stride(1), vs2 = vc.stride(2);
  rows_in_parallel(T, [&](int64_t t) {  // rows write distinct slots
    float* row = q.data() + t * qkv.N;
    const float *c = cs.data_ptr<float>() + t * D, *s = sn.data_ptr<float>() + t * D;
    for (int64_t hd = 0; hd < nh; ++hd) norm_rope_head(row + hd * D, qn, qk_eps, c, s, D);
    for (int64_t hd = 0; hd < nkv; ++hd) {
      float* k = row + Q + hd * D;
      const float* v = row + Q + KV + hd * D;
      norm_rope_head(k, kn, qk_eps, c, s, D);
      for (int64_t r = 0; r < R; ++r) {
        std::memcpy(kp + hd * ks0 + r * ks1 + (slot + t) * ks2, k, D * sizeof(float));
        std::memcpy(vp + hd * vs0 + r * vs1 + (slot + t) * vs2, v, D * sizeof(float));
      }
    }
  });
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t work = std::max<int64_t>(1, span * D);
  at::parallel_for(0, T * nh, std::max<int64_t>(1, 32768 / work), [&](int64_t begin, int64_t end) {
    std::vector<float> p(span);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / nh, hd = task % nh, kvh = hd / rep;
      const float* qv = q.data() + t * qkv.N + hd * D;
      const float* kb = kp + kvh * ks0;
      const float* vb = vp + kvh * vs0;
      float mx = -INFINITY;
      for (int64_t j = 0; j < span; ++j) {
        const bool ok = mask ? mask[t * span + j] : (j <= slot + t);
        if (!ok) {
          p[j] = -INFINITY;
          continue;
        }
        const float* kr = kb + j * ks2;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int64_t i = 0; i < D; i += 32) {
          a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qv + i), _mm512_loadu_ps(kr + i), a0);
          a1 = _mm512_fmadd_ps(_mm512_loadu_ps(qv + i + 16), _mm512_loadu_ps(kr + i + 16), a1);
        }
        p[j] = hsum(_mm512_add_ps(a0, a1)) * scale;
        mx = std::max(mx, p[j]);
      }
      float total = 0.0f;
      int64_t j = 0;
      const __m512 vmx = _mm512_set1_ps(mx);
      for (; j + 16 <= span; j += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.data() + j), vmx));  // -inf -> 0 (clamped)
        const __mmask16 live = _mm512_cmp_ps_mask(_mm512_loadu_ps(p.data() + j), _mm512_set1_ps(-INFINITY),
                                                  _CMP_NEQ_OQ);
        const __m512 em = _mm512_maskz_mov_ps(live, e);
        _mm512_storeu_ps(p.data() + j, em);
        total += hsum(em);
      }
      for (; j < span; ++j) {
        const float e = std::isinf(p[j]) ? 0.0f : std::exp(p[j] - mx);
        p[j] = e;
        total += e;
      }
      const float inv = 1.0f / total;
      float* dst = att.data() + t * Q + hd * D;
      // the values' sum in registers, 128 (else 32) columns at a time; each column sums j in order (same bits)
      if (D % 128 == 0)
        for (int64_t d0 = 0; d0 < D; d0 += 128) weighted_sum<8>(p.data(), span, vb + d0, vs2, inv, dst + d0);
      else
        for (int64_t d0 = 0; d0 < D; d0 += 32) weighted_sum<2>(p.data(), span, vb + d0, vs2, inv, dst + d0);
    }
  });
  linear_raw(att.data(), T, Q, o, yp);
  for (int64_t i = 0; i < T * H; i += 16)
    _mm512_storeu_ps(yp + i, _mm512_add_ps(_mm512_loadu_ps(yp + i), _mm512_loadu_ps(xp + i)));

  // MLP block
  rows_in_parallel(T, [&](int64_t t) { rms_norm_row(yp + t * H, ln2, H, eps, h.data() + t * H); });
  linear_raw(h.data(), T, H, gu, g.data());
  std::vector<float> act(T * I);  // silu(gate) * up, rows packed [T, I] for the product
  rows_in_parallel(T, [&](int64_t t) {
    const float* gate = g.data() + t * 2 * I;
    const float* up = gate + I;
    float* a = act.data() + t * I;
    for (int64_t i = 0; i < I; i += 16) {
      const __m512 v = _mm512_loadu_ps(gate + i);
      const __m512 sig = _mm512_div_ps(_mm512_set1_ps(1.0f),
                                       _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), v))));
      _mm512_storeu_ps(a + i, _mm512_mul_ps(_mm512_mul_ps(v, sig), _mm512_loadu_ps(up + i)));
    }
    if (rot_block) hadamard_blocks(a, I, rot_block);
  });
  std::vector<float> d(T * H);
  linear_raw(act.data(), T, I, dn, d.data());
  for (int64_t i = 0; i < T * H; i += 16)
    _mm512_storeu_ps(yp + i, _mm512_add_ps(_mm512_loadu_ps(yp + i), _mm512_loadu_ps(d.data() + i)));
  return out;
}

}  // namespace

TORCH_LIBRARY(leapvox_kernels, m) {
  m.def("w8a8_linear(Tensor x, Tensor w, Tensor wscale, Tensor wsum, Tensor? bias) -> Tensor");
  m.def("w4a8_linear(Tensor x, Tensor w, Tensor sm, int n, Tensor? bias) -> Tensor");
  m.def("amx_enabled() -> bool", +[]() { return amx_ready(); });  // no tensors: a catch-all kernel
  m.def("qwen3_layer(Tensor x, Tensor[] w, Tensor kc, Tensor vc, int slot, Tensor cos, Tensor sin, Tensor? mask, "
        "int span, int nh, int nkv, float eps, float qk_eps, int rot_block) -> Tensor");
}

TORCH_LIBRARY_IMPL(leapvox_kernels, CPU, m) {
  m.impl("w8a8_linear", &w8a8_linear);
  m.impl("w4a8_linear", &w4a8_linear);
  m.impl("qwen3_layer", &qwen3_layer);
}
