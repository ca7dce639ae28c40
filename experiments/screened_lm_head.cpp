// A prototype of the screened lm_head (experiments/screened_argmax.py `--time`): logits [M, V] of fp32 rows x [M, H]
// whose argmax is exactly that of x . w^T, reading int8 rows in place of bf16 ones. AVX2 and FMA.
//
//   1. approx[m, v] = s_v * (x_m . q_v) over int8 rows q packed in pairs ([V/2, H/8, 2 rows, 8 inputs]: one
//      16-byte chunk a pair and 8 inputs, widened to fp32 in registers), written as the upper end
//      approx + |x_m|_1 * c_v (c_v: half the row's scale plus its rounding slack); each thread keeps the largest
//      lower end approx - |x_m|_1 * c_v it saw.
//   2. a token whose upper end is below the largest lower end cannot be the argmax: -inf. Every other one (the
//      candidates, a handful) gets its exact logit from the fp32 row w_v.
//
// `screened_logits_i16` takes the rows x as 16-bit integers too (x = s_x k + e, |k| <= 16383, |e| <= s_x / 2): the
// approximate logit is s_x s_v (k . q_v), an exact integer sum of pair products (`_mm256_madd_epi16`: 16 products
// an instruction, where widening int8 to fp32 costs two instructions for 8), and its bound gains
// s_x / 2 * s_v |q_v|_1 (the caller's a_v): a few thousandths of a logit for SmolLM2's hidden states.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int kGroup = 6;            // input rows a pass, at most
constexpr int64_t kTaskPairs = 16;   // pairs a thread's task takes, at least
constexpr int64_t kAhead = 2048;     // bytes of weights fetched ahead

inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Rows x[0..G-1] against the int8 pair at `pair` (tokens v, v + 1): their upper ends into y, lower ends into low.
template <int G>
void pass(const float* x, const int8_t* pair, const float* scale, const float* c, const float* l1, float* y,
          float* low, int64_t H, int64_t V, int64_t v) {
  __m256 acc[G][2];
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < H; k += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(pair + 2 * k + kAhead), _MM_HINT_T0);
    const __m128i chunk = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pair + 2 * k));
    const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(chunk));
    const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(chunk, chunk)));
    for (int g = 0; g < G; ++g) {
      const __m256 xv = _mm256_loadu_ps(x + g * H + k);
      acc[g][0] = _mm256_fmadd_ps(xv, w0, acc[g][0]);
      acc[g][1] = _mm256_fmadd_ps(xv, w1, acc[g][1]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < 2; ++r) {
      const float approx = scale[v + r] * sum8(acc[g][r]), bound = l1[g] * c[v + r];
      y[g * V + v + r] = approx + bound;
      low[g] = std::max(low[g], approx - bound);
    }
}

void group(int g, const float* x, const int8_t* pair, const float* scale, const float* c, const float* l1, float* y,
           float* low, int64_t H, int64_t V, int64_t v) {
  switch (g) {
    case 1: pass<1>(x, pair, scale, c, l1, y, low, H, V, v); break;
    case 2: pass<2>(x, pair, scale, c, l1, y, low, H, V, v); break;
    case 3: pass<3>(x, pair, scale, c, l1, y, low, H, V, v); break;
    case 4: pass<4>(x, pair, scale, c, l1, y, low, H, V, v); break;
    case 5: pass<5>(x, pair, scale, c, l1, y, low, H, V, v); break;
    default: pass<6>(x, pair, scale, c, l1, y, low, H, V, v); break;
  }
}

inline int32_t sum8i(__m256i v) {  // exact: the caller's sums stay below 2^31
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

float dot(const float* x, const float* w, int64_t H) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t k = 0; k < H; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), acc);
  return sum8(acc);
}

// The int16 form's pass: int8 rows packed [V/2, H/16, 2, 16], inputs k [G, H] int16.
template <int G>
void pass16(const int16_t* k, const int8_t* pair, const float* scale, const float* a, const float* c,
            const float* sx, const float* l1, float* y, float* low, int64_t H, int64_t V, int64_t v) {
  __m256i acc[G][2];
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_si256();
  for (int64_t i = 0; i < H; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(pair + 2 * i + kAhead), _MM_HINT_T0);
    const __m256i chunk = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair + 2 * i));
    const __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(chunk));
    const __m256i w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(chunk, 1));
    for (int g = 0; g < G; ++g) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + g * H + i));
      acc[g][0] = _mm256_add_epi32(acc[g][0], _mm256_madd_epi16(xv, w0));
      acc[g][1] = _mm256_add_epi32(acc[g][1], _mm256_madd_epi16(xv, w1));
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < 2; ++r) {
      // |k . q| <= 16383 * 127 * H < 2^31 for H <= 1024: an exact integer, then three fp32 roundings
      const float approx = sx[g] * scale[v + r] * static_cast<float>(sum8i(acc[g][r]));
      const float bound = l1[g] * c[v + r] + sx[g] * a[v + r] + 1e-6f * std::abs(approx);
      y[g * V + v + r] = approx + bound;
      low[g] = std::max(low[g], approx - bound);
    }
}

void group16(int g, const int16_t* k, const int8_t* pair, const float* scale, const float* a, const float* c,
             const float* sx, const float* l1, float* y, float* low, int64_t H, int64_t V, int64_t v) {
  switch (g) {
    case 1: pass16<1>(k, pair, scale, a, c, sx, l1, y, low, H, V, v); break;
    case 2: pass16<2>(k, pair, scale, a, c, sx, l1, y, low, H, V, v); break;
    case 3: pass16<3>(k, pair, scale, a, c, sx, l1, y, low, H, V, v); break;
    case 4: pass16<4>(k, pair, scale, a, c, sx, l1, y, low, H, V, v); break;
    case 5: pass16<5>(k, pair, scale, a, c, sx, l1, y, low, H, V, v); break;
    default: pass16<6>(k, pair, scale, a, c, sx, l1, y, low, H, V, v); break;
  }
}

// Step 2 of both forms: each row's candidates scored exactly from w, the others -inf.
void finish(const float* xp, const float* wp, float* yp, const std::vector<float>& lows, int threads, int64_t M,
            int64_t H, int64_t V) {
  for (int64_t m = 0; m < M; ++m) {
    float floor = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < threads; ++t) floor = std::max(floor, lows[t * M + m]);
    float* row = yp + m * V;
    for (int64_t v = 0; v < V; ++v)
      row[v] = row[v] >= floor ? dot(xp + m * H, wp + v * H, H) : -std::numeric_limits<float>::infinity();
  }
}

// Both forms: step 1 over the threads' runs of pairs, `rows(m, g, p, y, low)` scoring input rows m..m+g-1
// against pair p, then step 2.
template <typename Rows>
torch::Tensor screen(const torch::Tensor& x, const torch::Tensor& w, Rows rows) {
  const int64_t M = x.size(0), H = x.size(1), V = w.size(0);
  auto y = torch::empty({M, V}, x.options());
  float* yp = y.data_ptr<float>();
  const int64_t groups = (M + kGroup - 1) / kGroup, size = (M + groups - 1) / groups;
  const int threads = at::get_num_threads();
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  std::vector<float> lows(static_cast<size_t>(threads) * M, kNone);
  at::parallel_for(0, V / 2, kTaskPairs, [&](int64_t p0, int64_t p1) {
    std::vector<float> low(M, kNone);  // the task's own, so threads do not write one shared line at every pair
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t m = 0; m < M; m += size) rows(m, static_cast<int>(std::min(size, M - m)), p, yp, low.data());
    float* mine = lows.data() + at::get_thread_num() * M;
    for (int64_t m = 0; m < M; ++m) mine[m] = std::max(mine[m], low[m]);
  });
  finish(x.data_ptr<float>(), w.data_ptr<float>(), yp, lows, threads, M, H, V);
  return y;
}

}  // namespace

// x [M, H] fp32 (H a multiple of 8), q [V/2, H/8, 2, 8] int8, scale [V], c [V], w [V, H] fp32 -> [M, V].
torch::Tensor screened_logits(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scale,
                              const torch::Tensor& c, const torch::Tensor& w) {
  const int64_t H = x.size(1), V = w.size(0);
  TORCH_CHECK(H % 8 == 0 && V % 2 == 0 && q.numel() == V * H, "screened_logits: shapes");
  const auto l1t = x.abs().sum(1).contiguous();
  const float *xp = x.data_ptr<float>(), *sp = scale.data_ptr<float>(), *cp = c.data_ptr<float>(),
              *l1 = l1t.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  return screen(x, w, [&](int64_t m, int g, int64_t p, float* yp, float* low) {
    group(g, xp + m * H, qp + p * 2 * H, sp, cp, l1 + m, yp + m * V, low + m, H, V, 2 * p);
  });
}

// The same over inputs in int16: x [M, H] fp32 (H a multiple of 16), q [V/2, H/16, 2, 16] int8, scale, a, c [V],
// w [V, H] fp32 -> [M, V].
torch::Tensor screened_logits_i16(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scale,
                                  const torch::Tensor& a, const torch::Tensor& c, const torch::Tensor& w) {
  const int64_t H = x.size(1), V = w.size(0);
  TORCH_CHECK(H % 16 == 0 && H <= 1024 && V % 2 == 0 && q.numel() == V * H, "screened_logits_i16: shapes");
  const auto l1t = x.abs().sum(1).contiguous();
  const auto sxt = (x.abs().amax(1) / 16383).clamp_min(1e-30).contiguous();  // [M]
  const auto kt = torch::round(x / sxt.unsqueeze(1)).to(torch::kInt16).contiguous();  // [M, H]
  const float *sp = scale.data_ptr<float>(), *ap = a.data_ptr<float>(), *cp = c.data_ptr<float>(),
              *l1 = l1t.data_ptr<float>(), *sx = sxt.data_ptr<float>();
  const int16_t* kp = kt.data_ptr<int16_t>();
  const int8_t* qp = q.data_ptr<int8_t>();
  return screen(x, w, [&](int64_t m, int g, int64_t p, float* yp, float* low) {
    group16(g, kp + m * H, qp + p * 2 * H, sp, ap, cp, sx + m, l1 + m, yp + m * V, low + m, H, V, 2 * p);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("screened_logits", &screened_logits);
  m.def("screened_logits_i16", &screened_logits_i16);
}
