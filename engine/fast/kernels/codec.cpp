// leapvox's optional CPU kernels for the codec decoder (built with w8a8.cpp into one library by engine/kernels).
//
// overlap_add: the transposed convolution's overlap-add and bias, bit-identical to the composite it replaces.
// snake: SnakeBeta, y = x + sin(x * a)^2 * b per channel (a = e^alpha, b = 1 / (e^beta + 1e-9)), in one pass over x
// instead of torch's four. sin^2 is computed from a Cody-Waite reduction by pi/2 and Cephes' single-precision sin
// and cos polynomials (a few ulp from libm's sin for the arguments the codec sees). Elementwise, so a sample's value
// does not depend on how the frames were chunked (streamed output stays equal to one-shot output).
//
// linear_f32: y [M, N] = x [M, K] w [N, K]^T + bias in fp32 with a fixed summation order per output: 16 partial sums
// over k = i mod 16 (one FMA chain each, k in order), then the same fixed tree over the 16. A value's rounding
// depends only on its own row and column, never on M or on how the work is split, so a streamed codec decode
// equals the one-shot decode bit for bit without padding small calls up to 16 rows (BLAS rounds a handful of rows
// differently, and slowly). Weights are read in their own [N, K] rows.
//
// window_attention: the codec pre-transformer's sliding-window attention. Query i sees the W keys i .. i+W-1 of its
// call's key buffer under a mask; scores, the softmax (fp32, max first) and the weighted sum of values run in one
// fixed order per query, so, as above, a query's output does not depend on how many queries the call holds (the
// composite it replaces built [n, W, D] products and sums to get the same property, and was slower).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>
#include <limits>
#include <cmath>

namespace {

// sin(x)^2 for 16 floats
inline __m512 sin2_16(__m512 x) {
  const __m512 j = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.636619772367581343f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(j, _mm512_set1_ps(1.5703125f), x);
  r = _mm512_fnmadd_ps(j, _mm512_set1_ps(4.837512969970703125e-4f), r);
  r = _mm512_fnmadd_ps(j, _mm512_set1_ps(7.54978995489188216e-8f), r);
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 s = _mm512_fmadd_ps(_mm512_set1_ps(-1.9515295891e-4f), z, _mm512_set1_ps(8.3321608736e-3f));
  s = _mm512_fmadd_ps(s, z, _mm512_set1_ps(-1.6666654611e-1f));
  s = _mm512_fmadd_ps(_mm512_mul_ps(s, z), r, r);  // sin(r)
  __m512 c = _mm512_fmadd_ps(_mm512_set1_ps(2.443315711809948e-5f), z, _mm512_set1_ps(-1.388731625493765e-3f));
  c = _mm512_fmadd_ps(c, z, _mm512_set1_ps(4.166664568298827e-2f));
  c = _mm512_fmadd_ps(_mm512_mul_ps(c, z), z, _mm512_fnmadd_ps(_mm512_set1_ps(0.5f), z, _mm512_set1_ps(1.0f)));
  // an odd quadrant takes cos(r); the sign of the result does not matter once squared
  const __mmask16 odd = _mm512_test_epi32_mask(_mm512_cvtps_epi32(j), _mm512_set1_epi32(1));
  const __m512 v = _mm512_mask_mov_ps(s, odd, c);
  return _mm512_mul_ps(v, v);
}

at::Tensor snake(const at::Tensor& x_, const at::Tensor& a_, const at::Tensor& b_) {
  TORCH_CHECK(x_.dim() == 3 && x_.scalar_type() == at::kFloat, "snake: x must be fp32 [B, C, L]");
  const at::Tensor x = x_.contiguous(), a = a_.contiguous(), b = b_.contiguous();
  const int64_t B = x.size(0), C = x.size(1), L = x.size(2);
  TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.numel() == C && b.numel() == C,
              "snake: per-channel fp32 scales [C]");
  at::Tensor y = at::empty_like(x);
  const float *xp = x.data_ptr<float>(), *ap = a.data_ptr<float>(), *bp = b.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, B * C, std::max<int64_t>(1, 16384 / std::max<int64_t>(L, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t c = row % C;
      const __m512 va = _mm512_set1_ps(ap[c]), vb = _mm512_set1_ps(bp[c]);
      const float* xr = xp + row * L;
      float* yr = yp + row * L;
      for (int64_t i = 0; i < L; i += 16) {
        const __mmask16 m = (L - i) >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (L - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, xr + i);
        _mm512_mask_storeu_ps(yr + i, m, _mm512_fmadd_ps(sin2_16(_mm512_mul_ps(v, va)), vb, v));
      }
    }
  });
  return y;
}

// The transposed convolution's overlap-add (CausalTransConv1d, kernel k = stride s + overlap, overlap <= s):
// cols [B, L, C, k] (frame t's contribution to samples t*s .. t*s+k-1), spill [B, C, overlap] (the frame before
// this call's samples past its end) -> y [B, C, L*s] with y[b, c, t*s + j] = (cols[t, c, j] + prev(t, c, j)) + bias[c],
// prev the previous frame's cols[t-1, c, s + j] (spill at t = 0) for j < overlap, else nothing: the same additions
// in the same order as the torch composite it replaces, so the same bits, in one pass instead of five.
at::Tensor overlap_add(const at::Tensor& cols_, const at::Tensor& spill_, const at::Tensor& bias_, int64_t s) {
  TORCH_CHECK(cols_.dim() == 4 && cols_.scalar_type() == at::kFloat, "overlap_add: cols must be fp32 [B, L, C, k]");
  const at::Tensor cols = cols_.contiguous(), spill = spill_.contiguous(), bias = bias_.contiguous();
  const int64_t B = cols.size(0), L = cols.size(1), C = cols.size(2), k = cols.size(3), ov = k - s;
  TORCH_CHECK(s >= 1 && ov >= 0 && ov <= s, "overlap_add: needs stride <= k <= 2 * stride");
  TORCH_CHECK(spill.scalar_type() == at::kFloat && spill.dim() == 3 && spill.size(0) == B && spill.size(1) == C &&
              spill.size(2) == ov, "overlap_add: spill must be fp32 [B, C, k - stride]");
  TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.numel() == C, "overlap_add: bias fp32 [C]");
  at::Tensor y = at::empty({B, C, L * s}, cols.options());
  const float *cp = cols.data_ptr<float>(), *sp = spill.data_ptr<float>(), *bp = bias.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, B * C, std::max<int64_t>(1, 8192 / std::max<int64_t>(L * s, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / C, c = row % C;
      const float bc = bp[c];
      float* yr = yp + row * L * s;
      const float* prev = sp + row * ov;  // the spill, then each frame's tail
      for (int64_t t = 0; t < L; ++t) {
        const float* cur = cp + ((b * L + t) * C + c) * k;
        for (int64_t j = 0; j < ov; ++j) yr[t * s + j] = (cur[j] + prev[j]) + bc;
        for (int64_t j = ov; j < s; ++j) yr[t * s + j] = cur[j] + bc;
        prev = cur + s;
      }
    }
  });
  return y;
}

// ---- linear_f32 -----------------------------------------------------------------------------------------------------

// MB rows of x (m0 ..) against NB rows of w (n0 ..), all of K
template <int MB, int NB>
inline void dot_tile(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, int64_t m0, int64_t n0,
                     const float* bias, float* y, int64_t ldy) {
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  const float* xr = x + m0 * ldx;
  const float* wr = w + n0 * ldw;
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_ps(wr + j * ldw + k);
    for (int i = 0; i < MB; ++i) {
      const __m512 xv = _mm512_loadu_ps(xr + i * ldx + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    const __mmask16 mk = static_cast<__mmask16>((1u << (K - k)) - 1);
    __m512 wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_maskz_loadu_ps(mk, wr + j * ldw + k);
    for (int i = 0; i < MB; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mk, xr + i * ldx + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j)
      y[(m0 + i) * ldy + n0 + j] = _mm512_reduce_add_ps(acc[i][j]) + (bias ? bias[n0 + j] : 0.0f);
}

template <int NB>
inline void dot_rows(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, int64_t m0, int64_t m1,
                     int64_t n0, const float* bias, float* y, int64_t ldy) {
  int64_t m = m0;
  for (; m + 4 <= m1; m += 4) dot_tile<4, NB>(x, ldx, w, ldw, K, m, n0, bias, y, ldy);
  switch (m1 - m) {
    case 3: dot_tile<3, NB>(x, ldx, w, ldw, K, m, n0, bias, y, ldy); break;
    case 2: dot_tile<2, NB>(x, ldx, w, ldw, K, m, n0, bias, y, ldy); break;
    case 1: dot_tile<1, NB>(x, ldx, w, ldw, K, m, n0, bias, y, ldy); break;
    default: break;
  }
}

// x [M, K] fp32 (rows contiguous), w [N, K] fp32 (rows contiguous, any row stride), bias [N] or None -> [M, N]
at::Tensor linear_f32(const at::Tensor& x_, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_.dim() == 2 && x_.scalar_type() == at::kFloat, "linear_f32: x must be fp32 [M, K]");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.size(1) == x_.size(1) && w.stride(1) == 1,
              "linear_f32: w must be fp32 [N, K] with x's K and contiguous rows");
  const at::Tensor x = x_.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor b;
  const float* bptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == N, "linear_f32: bias must be fp32 [N]");
    bptr = b.data_ptr<float>();
  }
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ldw = w.stride(0);
  // tiles: 64 rows of x (so a tile of x stays in cache while its weight rows stream) x 4 weight rows
  constexpr int64_t kRows = 64, NB = 4;
  const int64_t mchunks = (M + kRows - 1) / kRows, full = N / NB, ntiles = full + N % NB;
  at::parallel_for(0, mchunks * ntiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t mc = t / ntiles, nt = t % ntiles;
      const int64_t m0 = mc * kRows, m1 = std::min(M, m0 + kRows);
      if (nt < full)
        dot_rows<NB>(xp, K, wp, ldw, K, m0, m1, nt * NB, bptr, yp, N);
      else
        dot_rows<1>(xp, K, wp, ldw, K, m0, m1, full * NB + (nt - full), bptr, yp, N);
    }
  });
  return y;
}

// ---- window_attention -----------------------------------------------------------------------------------------------

// q [B, H, n, D], k, v [B, H, W-1+n, D] (D a multiple of 16, last dim contiguous), mask [n, W] bool -> [B, H, n, D]
at::Tensor window_attention(const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_, const at::Tensor& mask_,
                            double scale) {
  TORCH_CHECK(q_.dim() == 4 && q_.scalar_type() == at::kFloat, "window_attention: q must be fp32 [B, H, n, D]");
  const at::Tensor q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous(), mask = mask_.contiguous();
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), D = q.size(3), W = mask.size(1);
  TORCH_CHECK(D % 16 == 0, "window_attention: head_dim must be a multiple of 16");
  TORCH_CHECK(k.sizes() == v.sizes() && k.dim() == 4 && k.size(0) == B && k.size(1) == H && k.size(3) == D &&
                  k.size(2) == W - 1 + n && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "window_attention: k, v must be fp32 [B, H, W-1+n, D]");
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.dim() == 2 && mask.size(0) == n, "window_attention: mask [n, W]");
  at::Tensor out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const bool* mp = mask.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  const int64_t L = W - 1 + n, dv = D / 16;
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, B * H * n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> p(W);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / n, i = t % n;
      const float* qi = qp + t * D;
      const float* kb = kp + (bh * L + i) * D;
      const float* vb = vp + (bh * L + i) * D;
      const bool* mi = mp + i * W;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t w = 0; w < W; ++w) {
        if (!mi[w]) continue;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t d = 0; d < dv; ++d)
          acc = _mm512_fmadd_ps(_mm512_loadu_ps(qi + 16 * d), _mm512_loadu_ps(kb + w * D + 16 * d), acc);
        p[w] = _mm512_reduce_add_ps(acc) * sc;
        mx = std::max(mx, p[w]);
      }
      float sum = 0.0f;
      for (int64_t w = 0; w < W; ++w) {
        p[w] = mi[w] ? std::exp(p[w] - mx) : 0.0f;
        sum += p[w];
      }
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a query the mask shuts out entirely reads zeros
      for (int64_t d = 0; d < dv; ++d) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t w = 0; w < W; ++w)
          if (p[w] != 0.0f) acc = _mm512_fmadd_ps(_mm512_set1_ps(p[w] * inv), _mm512_loadu_ps(vb + w * D + 16 * d), acc);
        _mm512_storeu_ps(op + t * D + 16 * d, acc);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(leapvox_kernels, m) {
  m.def("snake(Tensor x, Tensor a, Tensor b) -> Tensor");
  m.def("overlap_add(Tensor cols, Tensor spill, Tensor bias, int stride) -> Tensor");
  m.def("linear_f32(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("window_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(leapvox_kernels, CPU, m) {
  m.impl("snake", &snake);
  m.impl("overlap_add", &overlap_add);
  m.impl("linear_f32", &linear_f32);
  m.impl("window_attention", &window_attention);
}
