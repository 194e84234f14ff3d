// leapvox's portable fp32 kernel: one Qwen3 decoder layer in one call, for fp32 weights at batch 1.
//
// A narrow model (the demo's 192-wide layers) spends its decode steps in the ~25 small torch ops around each layer's
// products, not in the products. Here the whole layer runs in C++: RMSNorm, the q/k/v products, per-head q/k norms and
// rotate-half RoPE, the K/V write, attention over the cached slots (causal or under a boolean mask), the output
// product and residual, then the SwiGLU MLP and its residual. Plain C++ written for the compiler's vectoriser (built
// with the x86-64-v3 flags: AVX2 and FMA), no intrinsics. Every output value is computed in one fixed order whatever
// the number of rows or threads, so a row gives the same bits alone or inside a multi-row call (spec's verify call).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int LANES = 16;  // partial sums per dot product: two AVX2 registers

// sum of a[i] * b[i] over n floats: LANES running sums, then a fixed pairwise tree, then the tail in order
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[LANES] = {};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
#pragma omp simd
    for (int j = 0; j < LANES; ++j) acc[j] += a[i + j] * b[i + j];
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  float s = acc[0];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// four dot products of one x against rows w0..w3, each summed exactly as dot() sums it (the loads of x are shared)
inline void dot4(const float* x, const float* w0, const float* w1, const float* w2, const float* w3, int64_t n,
                 float* out) {
  float a0[LANES] = {}, a1[LANES] = {}, a2[LANES] = {}, a3[LANES] = {};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
#pragma omp simd
    for (int j = 0; j < LANES; ++j) {
      const float v = x[i + j];
      a0[j] += v * w0[i + j];
      a1[j] += v * w1[i + j];
      a2[j] += v * w2[i + j];
      a3[j] += v * w3[i + j];
    }
  }
  float* accs[4] = {a0, a1, a2, a3};
  const float* ws[4] = {w0, w1, w2, w3};
  for (int r = 0; r < 4; ++r) {
    float* acc = accs[r];
    for (int w = LANES / 2; w > 0; w /= 2)
      for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    float s = acc[0];
    for (int64_t k = i; k < n; ++k) s += x[k] * ws[r][k];
    out[r] = s;
  }
}

// y [T, N] = x [T, K] @ W^T, W [N, K] row-major (nn.Linear's layout, read in place); split over output rows when the
// product is large enough to pay for a second thread
void linear(const float* x, int64_t T, int64_t K, const float* W, int64_t N, float* y) {
  const int64_t grain = std::max<int64_t>(4, (int64_t{1} << 18) / std::max<int64_t>(1, T * K)) / 4 * 4;
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    int64_t n = begin;
    float out[4];
    for (; n + 4 <= end; n += 4)
      for (int64_t t = 0; t < T; ++t) {
        dot4(x + t * K, W + n * K, W + (n + 1) * K, W + (n + 2) * K, W + (n + 3) * K, K, out);
        for (int r = 0; r < 4; ++r) y[t * N + n + r] = out[r];
      }
    for (; n < end; ++n)
      for (int64_t t = 0; t < T; ++t) y[t * N + n] = dot(x + t * K, W + n * K, K);
  });
}

// y = w * (x / sqrt(mean(x^2) + eps)) over n floats
inline void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float r = 1.0f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

// one head [D] in place: RMS-normed with w, then rotate-half RoPE with this row's cos/sin [D] (D even)
inline void norm_rope_head(float* x, const float* w, float eps, const float* cos, const float* sin, int64_t D,
                           float* tmp) {
  rms_norm_row(x, w, D, eps, tmp);
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) {
    x[i] = tmp[i] * cos[i] - tmp[h + i] * sin[i];
    x[h + i] = tmp[h + i] * cos[h + i] + tmp[i] * sin[h + i];
  }
}

// x [T, H] -> the layer's output [T, H]. Weights w (fp32, contiguous): ln1 [H], q_norm [D], k_norm [D], ln2 [H],
// q [nh D, H], k [nkv D, H], v [nkv D, H], o [H, nh D], gate [I, H], up [I, H], down [H, I]. K/V caches kc, vc
// [nkv, R, P, D] (fp32, D contiguous): rows t are written at slot + t into every one of the R copies, and attention
// reads copy 0 over slots [0, span): under `mask` [T, span] (bool, True = may attend) when given, else causally (row t
// sees slots <= slot + t). cos, sin [T, D]: rotate-half RoPE tables for the rows' positions.
at::Tensor qwen3_layer_f32(const at::Tensor& x_, at::TensorList w, const at::Tensor& kc, const at::Tensor& vc,
                           int64_t slot, const at::Tensor& cos_, const at::Tensor& sin_,
                           const c10::optional<at::Tensor>& mask_, int64_t span, int64_t nh, int64_t nkv, double eps_,
                           double qk_eps_) {
  TORCH_CHECK(w.size() == 11, "qwen3_layer_f32: 11 weight tensors expected");
  TORCH_CHECK(x_.dim() == 2 && x_.scalar_type() == at::kFloat, "qwen3_layer_f32: x must be fp32 [T, H]");
  const at::Tensor x = x_.contiguous(), cs = cos_.contiguous(), sn = sin_.contiguous();
  const int64_t T = x.size(0), H = x.size(1), D = kc.size(3), P = kc.size(2), R = kc.size(1);
  TORCH_CHECK(kc.dim() == 4 && vc.sizes() == kc.sizes() && kc.size(0) == nkv && kc.stride(3) == 1 &&
              vc.stride(3) == 1 && kc.scalar_type() == at::kFloat && vc.scalar_type() == at::kFloat,
              "qwen3_layer_f32: caches must be fp32 [nkv, R, P, D] with D contiguous");
  TORCH_CHECK(D % 2 == 0 && D <= 1024 && nkv > 0 && nh % nkv == 0, "qwen3_layer_f32: unsupported head shape");
  TORCH_CHECK(slot >= 0 && slot + T <= P && span <= P && span >= 1, "qwen3_layer_f32: slots past the cache");
  TORCH_CHECK(cs.dim() == 2 && cs.size(0) == T && cs.size(1) == D && sn.sizes() == cs.sizes() &&
              cs.scalar_type() == at::kFloat && sn.scalar_type() == at::kFloat, "qwen3_layer_f32: cos/sin [T, D]");
  const bool* mask = nullptr;
  at::Tensor mk;
  if (mask_.has_value() && mask_->defined()) {
    mk = mask_->contiguous();
    TORCH_CHECK(mk.scalar_type() == at::kBool && mk.dim() == 2 && mk.size(0) == T && mk.size(1) == span,
                "qwen3_layer_f32: mask must be bool [T, span]");
    mask = mk.data_ptr<bool>();
  } else {
    TORCH_CHECK(span == slot + T, "qwen3_layer_f32: without a mask, span must be slot + T");
  }
  for (size_t i = 0; i < w.size(); ++i)
    TORCH_CHECK(w[i].scalar_type() == at::kFloat && w[i].is_contiguous() && w[i].device().is_cpu(),
                "qwen3_layer_f32: weights must be contiguous fp32 CPU tensors");
  const int64_t Q = nh * D, KV = nkv * D, I = w[8].size(0), rep = nh / nkv;
  TORCH_CHECK(w[0].numel() == H && w[1].numel() == D && w[2].numel() == D && w[3].numel() == H &&
              w[4].sizes() == at::IntArrayRef({Q, H}) && w[5].sizes() == at::IntArrayRef({KV, H}) &&
              w[6].sizes() == at::IntArrayRef({KV, H}) && w[7].sizes() == at::IntArrayRef({H, Q}) &&
              w[8].sizes() == at::IntArrayRef({I, H}) && w[9].sizes() == at::IntArrayRef({I, H}) &&
              w[10].sizes() == at::IntArrayRef({H, I}),
              "qwen3_layer_f32: weight shapes do not match the layer");
  const float *ln1 = w[0].data_ptr<float>(), *qn = w[1].data_ptr<float>(), *kn = w[2].data_ptr<float>(),
              *ln2 = w[3].data_ptr<float>();
  const float eps = static_cast<float>(eps_), qk_eps = static_cast<float>(qk_eps_);
  const float* xp = x.data_ptr<float>();
  at::Tensor out = at::empty({T, H}, x.options());
  float* yp = out.data_ptr<float>();
  std::vector<float> h(T * H), q(T * Q), k(T * KV), v(T * KV), att(T * Q), tmp(D);

  // attention block
  for (int64_t t = 0; t < T; ++t) rms_norm_row(xp + t * H, ln1, H, eps, h.data() + t * H);
  linear(h.data(), T, H, w[4].data_ptr<float>(), Q, q.data());
  linear(h.data(), T, H, w[5].data_ptr<float>(), KV, k.data());
  linear(h.data(), T, H, w[6].data_ptr<float>(), KV, v.data());
  float* kp = kc.data_ptr<float>();
  float* vp = vc.data_ptr<float>();
  const int64_t ks0 = kc.stride(0), ks1 = kc.stride(1), ks2 = kc.stride(2);
  const int64_t vs0 = vc.stride(0), vs1 = vc.stride(1), vs2 = vc.stride(2);
  for (int64_t t = 0; t < T; ++t) {
    const float *c = cs.data_ptr<float>() + t * D, *s = sn.data_ptr<float>() + t * D;
    for (int64_t hd = 0; hd < nh; ++hd) norm_rope_head(q.data() + t * Q + hd * D, qn, qk_eps, c, s, D, tmp.data());
    for (int64_t hd = 0; hd < nkv; ++hd) {
      float* kr = k.data() + t * KV + hd * D;
      const float* vr = v.data() + t * KV + hd * D;
      norm_rope_head(kr, kn, qk_eps, c, s, D, tmp.data());
      for (int64_t r = 0; r < R; ++r) {
        std::memcpy(kp + hd * ks0 + r * ks1 + (slot + t) * ks2, kr, D * sizeof(float));
        std::memcpy(vp + hd * vs0 + r * vs1 + (slot + t) * vs2, vr, D * sizeof(float));
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t work = std::max<int64_t>(1, span * D);
  at::parallel_for(0, T * nh, std::max<int64_t>(1, 65536 / work), [&](int64_t begin, int64_t end) {
    std::vector<float> p(span), acc(D);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / nh, hd = task % nh, kvh = hd / rep;
      const float* qv = q.data() + t * Q + hd * D;
      const float* kb = kp + kvh * ks0;
      const float* vb = vp + kvh * vs0;
      float mx = -INFINITY;
      for (int64_t j = 0; j < span; ++j) {
        const bool ok = mask ? mask[t * span + j] : (j <= slot + t);
        p[j] = ok ? dot(qv, kb + j * ks2, D) * scale : -INFINITY;
        mx = std::max(mx, p[j]);
      }
      float total = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < span; ++j) {  // softmax weights and the values' sum, j in order
        if (std::isinf(p[j])) continue;
        const float e = std::exp(p[j] - mx);
        total += e;
        const float* vr = vb + j * vs2;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc[d] += e * vr[d];
      }
      const float inv = 1.0f / total;
      float* dst = att.data() + t * Q + hd * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = acc[d] * inv;
    }
  });
  linear(att.data(), T, Q, w[7].data_ptr<float>(), H, yp);
  for (int64_t i = 0; i < T * H; ++i) yp[i] += xp[i];

  // MLP block
  for (int64_t t = 0; t < T; ++t) rms_norm_row(yp + t * H, ln2, H, eps, h.data() + t * H);
  std::vector<float> gate(T * I), up(T * I), d(T * H);
  linear(h.data(), T, H, w[8].data_ptr<float>(), I, gate.data());
  linear(h.data(), T, H, w[9].data_ptr<float>(), I, up.data());
  for (int64_t i = 0; i < T * I; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
  linear(gate.data(), T, I, w[10].data_ptr<float>(), H, d.data());
  for (int64_t i = 0; i < T * H; ++i) yp[i] += d[i];
  return out;
}

}  // namespace

TORCH_LIBRARY(leapvox_fp32, m) {
  m.def("qwen3_layer_f32(Tensor x, Tensor[] w, Tensor kc, Tensor vc, int slot, Tensor cos, Tensor sin, Tensor? mask, "
        "int span, int nh, int nkv, float eps, float qk_eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(leapvox_fp32, CPU, m) { m.impl("qwen3_layer_f32", &qwen3_layer_f32); }
