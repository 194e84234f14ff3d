// leapvox's optional CPU kernel for w8a8 linears on x86-64 with AVX-512 VNNI (built on first use by
// engine/kernels/__init__.py when a C++ compiler is present; without one leapvox uses torch's prebuilt kernels).
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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kCols = 64;   // output columns per packed block (4 vectors of 16 int32 sums)
constexpr int64_t kXBlock = 4;  // activation rows per pass over a block (more rows: another pass, from cache)

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
    const __mmask16 mask = (N - c0) >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (N - c0)) - 1);
    const __m512 vs = _mm512_maskz_loadu_ps(mask, ws + c0);
    const __m512i vsum = _mm512_maskz_loadu_epi32(mask, wsum + c0);
    const __m512 vb = bias ? _mm512_maskz_loadu_ps(mask, bias + c0) : _mm512_setzero_ps();
    for (int m = 0; m < MB; ++m) {
      const __m512i d = _mm512_sub_epi32(acc[m][j], _mm512_mullo_epi32(_mm512_set1_epi32(zx[m0 + m]), vsum));
      __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(sx[m0 + m]), vs), _mm512_cvtepi32_ps(d));
      if (bias) v = _mm512_add_ps(v, vb);
      _mm512_mask_storeu_ps(y + (m0 + m) * N + c0, mask, v);
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

at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& wscale, const at::Tensor& wsum,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "w8a8_linear: x must be fp32 [M, K]");
  TORCH_CHECK(w.dim() == 4 && w.scalar_type() == at::kChar && w.is_contiguous() && w.size(2) == kCols &&
              w.size(3) == 4, "w8a8_linear: w must be packed int8 [N/64, K/4, 64, 4] (engine.kernels.pack)");
  const int64_t M = x.size(0), K = x.size(1), N = wscale.numel(), Kp = w.size(1) * 4;
  TORCH_CHECK(K <= Kp && Kp - K < 4 && (N + kCols - 1) / kCols == w.size(0),
              "w8a8_linear: x has ", K, " features, the packed weight ", Kp, " (padded), ", N, " rows");
  TORCH_CHECK(wscale.scalar_type() == at::kFloat && wscale.is_contiguous(), "w8a8_linear: wscale fp32 [N]");
  TORCH_CHECK(wsum.scalar_type() == at::kInt && wsum.numel() == N && wsum.is_contiguous(), "w8a8_linear: wsum");
  const float* bptr = nullptr;
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == N, "w8a8_linear: bias fp32 [N]");
    bptr = b.data_ptr<float>();
  }
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;

  std::vector<uint8_t> qx(static_cast<size_t>(M * Kp), 0);  // padding multiplies zero weights
  std::vector<float> sx(M);
  std::vector<int32_t> zx(M);
  const float* xp = xc.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) quantize_row(xp + m * K, K, qx.data() + m * Kp, &sx[m], &zx[m]);

  const int8_t* wp = w.data_ptr<int8_t>();
  const float* ws = wscale.data_ptr<float>();
  const int32_t* wsm = wsum.data_ptr<int32_t>();
  float* yp = y.data_ptr<float>();
  const int64_t blocks = w.size(0), block_bytes = Kp * kCols;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk)
      block_all_rows(wp + blk * block_bytes, qx.data(), M, Kp, blk * kCols, N, sx.data(), zx.data(), ws, wsm, bptr,
                     yp);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(leapvox_kernels, m) {
  m.def("w8a8_linear(Tensor x, Tensor w, Tensor wscale, Tensor wsum, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(leapvox_kernels, CPU, m) { m.impl("w8a8_linear", &w8a8_linear); }
