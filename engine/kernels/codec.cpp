// leapvox's optional CPU kernels for the codec decoder (built with w8a8.cpp into one library by engine/kernels).
//
// overlap_add: the transposed convolution's overlap-add and bias, bit-identical to the composite it replaces.
// snake: SnakeBeta, y = x + sin(x * a)^2 * b per channel (a = e^alpha, b = 1 / (e^beta + 1e-9)), in one pass over x
// instead of torch's four. sin^2 is computed from a Cody-Waite reduction by pi/2 and Cephes' single-precision sin
// and cos polynomials (a few ulp from libm's sin for the arguments the codec sees). Elementwise, so a sample's value
// does not depend on how the frames were chunked (streamed output stays equal to one-shot output).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cstdint>

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(leapvox_kernels, m) {
  m.def("snake(Tensor x, Tensor a, Tensor b) -> Tensor");
  m.def("overlap_add(Tensor cols, Tensor spill, Tensor bias, int stride) -> Tensor");
}

TORCH_LIBRARY_IMPL(leapvox_kernels, CPU, m) {
  m.impl("snake", &snake);
  m.impl("overlap_add", &overlap_add);
}
