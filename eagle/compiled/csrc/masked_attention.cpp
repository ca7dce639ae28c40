// Attention of our compiled forwards on a CPU (eagle/compiled/attention_kernel.py builds it; the compiled graphs
// call it through eagle/compiled/grouped_attention.py): a few query rows, a plain step's token or a verify's tree
// nodes, over a bucket of a static KV cache, each row under its own additive mask row.
//
//   masked_attention(q [1, H, r, D], k [1, Hk, L, D], v [1, Hk, L, D], mask [1, 1, r, L], scale) -> [1, r, H, D]
//
// A mask value at or below -1e30 (the dtype's lowest, as HF's and our masks write, or -inf) hides its column: the
// column is skipped, so its weight is exactly the 0 that softmax gives it; any other value is added to the score.
// The rows read the columns up to their last visible one, not the whole bucket: a bucket's rows past the context
// cost nothing. One task per (key/value head, block of rows), handed to torch's threads: the block's rows and the
// G = H / Hk query heads of the key/value head share every key and value read, 32 at a time from L1. fp32
// arithmetic; q, k, v, mask and the output all fp32 or all bf16. The loops over D are plain C++, which -O3
// -march=native vectorizes. Past kMaxRows rows the call goes to ATen's SDPA (`wide`).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

constexpr float kHidden = -1e30f;  // mask values at or below this hide their column
constexpr int64_t kChunk = 32;     // keys (values) a task takes at a time: 8 KB of fp32 at D = 64
constexpr int64_t kMaxRows = 24;   // rows up to which this kernel runs. Its time grows with the rows, SDPA's (over
                                   // the whole bucket) less: on a 2-core Zen 5 (AVX512-BF16; 9 query / 3 key-value
                                   // heads, 150 visible columns of 256) bf16 at 2 threads 53 / 74 / 112 us at 12 / 16
                                   // / 24 rows against SDPA's 101 / 112 / 170, at 1 thread 79 / 134 / 222 against
                                   // 137 / 167 / 251, and at 32 rows 1.05x SDPA's time; on an AVX512F Xeon (fp32, 1
                                   // thread) it took 1.3x SDPA's time at 16 rows

inline float widen(float x) { return x; }
inline float widen(at::BFloat16 x) { return static_cast<float>(x); }
inline void narrow(float* out, float x) { *out = x; }
inline void narrow(at::BFloat16* out, float x) { *out = at::BFloat16(x); }

struct Shape {
  int64_t H, Hk, G, r, L, D;
};

// Dot product of two fp32 vectors of D elements (D a template constant where it can be: fully unrolled).
template <int kD>
inline float dot(const float* a, const float* b, int64_t D) {
  float sum = 0.f;
  if constexpr (kD > 0) {
    for (int d = 0; d < kD; ++d) sum += a[d] * b[d];
  } else {
    for (int64_t d = 0; d < D; ++d) sum += a[d] * b[d];
  }
  return sum;
}

// Rows [j0, j1) of x [*, D] as fp32: x itself (fp32), or widened into `buffer` (bf16).
template <typename T>
inline const float* widened(const T* x, int64_t j0, int64_t j1, int64_t D, float* buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return x + j0 * D;
  } else {
    for (int64_t e = 0; e < (j1 - j0) * D; ++e) buffer[e] = widen(x[j0 * D + e]);
    return buffer;
  }
}

// acc[0:D] += sum over j < c of p[j] values[j] [c, D], in registers where D is a template constant.
template <int kD>
inline void accumulate(const float* p, const float* values, int64_t c, float* acc, int64_t D) {
  if constexpr (kD > 0) {
    float a[kD];
    for (int d = 0; d < kD; ++d) a[d] = acc[d];
    for (int64_t j = 0; j < c; ++j)
      for (int d = 0; d < kD; ++d) a[d] += p[j] * values[j * kD + d];
    for (int d = 0; d < kD; ++d) acc[d] = a[d];
  } else {
    for (int64_t j = 0; j < c; ++j)
      for (int64_t d = 0; d < D; ++d) acc[d] += p[j] * values[j * D + d];
  }
}

// Rows [i0, i1) of key/value head h: out[i, h*G + g, :] for their G query heads each. Every key and value of the
// columns the rows see is read once for all of them.
template <typename T, int kD>
void attend(const T* q, const T* k, const T* v, const T* mask, float scale, const Shape& s, int64_t h, int64_t i0,
            int64_t i1, T* out, std::vector<float>& scratch) {
  const int64_t G = s.G, D = s.D, rows = (i1 - i0) * G;  // query vectors of this task, row-major by (i, g)
  int64_t span = 0;  // the columns any of the rows sees lie in [0, span)
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = s.L - 1; j >= span; --j)
      if (widen(mask[i * s.L + j]) > kHidden) {
        span = j + 1;
        break;
      }
  scratch.resize(rows * D * 2 + kChunk * D + rows * span);
  float* queries = scratch.data();   // [rows, D], scaled
  float* acc = queries + rows * D;   // [rows, D]
  float* row = acc + rows * D;       // [kChunk, D], keys or values widened (bf16)
  float* scores = row + kChunk * D;  // [rows, span]
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const T* qg = q + ((h * G + g) * s.r + i) * D;
      float* dst = queries + ((i - i0) * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = widen(qg[d]) * scale;
    }
  const T* keys = k + h * s.L * D;
  for (int64_t j0 = 0; j0 < span; j0 += kChunk) {  // a chunk of keys stays in L1 while every query meets it
    const int64_t j1 = std::min(span, j0 + kChunk);
    const float* chunk = widened<T>(keys, j0, j1, D, row);
    for (int64_t n = 0; n < rows; ++n) {
      const float* qn = queries + n * D;
      float* sn = scores + n * span;
      for (int64_t j = j0; j < j1; ++j) sn[j] = dot<kD>(qn, chunk + (j - j0) * D, D);
    }
  }
  for (int64_t n = 0; n < rows; ++n) {  // softmax over the visible columns; hidden ones get exactly 0
    const T* m = mask + (i0 + n / G) * s.L;
    float* sn = scores + n * span;
    float top = kHidden;
    for (int64_t j = 0; j < span; ++j) {
      const float bias = widen(m[j]);
      sn[j] = bias > kHidden ? sn[j] + bias : kHidden;
      top = std::max(top, sn[j]);
    }
    float sum = 0.f;
    for (int64_t j = 0; j < span; ++j) {
      const float e = sn[j] > kHidden ? std::exp(sn[j] - top) : 0.f;
      sn[j] = e;
      sum += e;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;  // a row that sees no column gets zeros
    for (int64_t j = 0; j < span; ++j) sn[j] *= inv;
  }
  std::fill(acc, acc + rows * D, 0.f);
  const T* values = v + h * s.L * D;
  for (int64_t j0 = 0; j0 < span; j0 += kChunk) {
    const int64_t j1 = std::min(span, j0 + kChunk);
    const float* chunk = widened<T>(values, j0, j1, D, row);
    for (int64_t n = 0; n < rows; ++n)
      accumulate<kD>(scores + n * span + j0, chunk, j1 - j0, acc + n * D, D);
  }
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const float* a = acc + ((i - i0) * G + g) * D;
      T* o = out + (i * s.H + h * G + g) * D;
      for (int64_t d = 0; d < D; ++d) narrow(o + d, a[d]);
    }
}

// Row blocks per key/value head: enough tasks for every thread twice (when there are rows for it), so that a few
// heads do not leave threads idle; each block reads its head's keys and values once.
int64_t row_blocks(const Shape& s) {
  const int64_t want = 2 * at::get_num_threads();
  return std::min(s.r, std::max<int64_t>(1, (want + s.Hk - 1) / s.Hk));
}

template <typename T, int kD>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale,
         const Shape& s, at::Tensor& out) {
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  const T* mp = mask.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t blocks = row_blocks(s), per = (s.r + blocks - 1) / blocks;
  at::parallel_for(0, s.Hk * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / blocks, i0 = (task % blocks) * per, i1 = std::min(s.r, i0 + per);
      if (i0 < i1) attend<T, kD>(qp, kp, vp, mp, static_cast<float>(scale), s, h, i0, i1, op, scratch);
    }
  });
}

template <typename T>
void run_any(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale,
             const Shape& s, at::Tensor& out) {
  if (s.D == 64)
    run<T, 64>(q, k, v, mask, scale, s, out);
  else if (s.D == 128)
    run<T, 128>(q, k, v, mask, scale, s, out);
  else
    run<T, 0>(q, k, v, mask, scale, s, out);
}

// More than kMaxRows rows (a wide verify): ATen's SDPA, whose blocked products win there, with the G query heads of a
// key/value head as its rows (no copy of the cache per head).
at::Tensor wide(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& attn_mask,
                double scale, const Shape& s) {
  auto rows = query.reshape({1, s.Hk, s.G * s.r, s.D});
  auto mask = attn_mask.repeat({1, 1, s.G, 1});
  auto out = at::scaled_dot_product_attention(rows, key, value, mask, 0.0, false, scale);
  return out.reshape({1, s.H, s.r, s.D}).transpose(1, 2).contiguous();
}

}  // namespace

at::Tensor masked_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& attn_mask, double scale) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && attn_mask.dim() == 4,
              "masked_attention: q, k, v and mask must be 4-D");
  TORCH_CHECK(query.size(0) == 1 && key.size(0) == 1 && value.size(0) == 1 && attn_mask.size(0) == 1 &&
                  attn_mask.size(1) == 1,
              "masked_attention: one sequence (batch 1) and one mask for all heads");
  const Shape s{query.size(1), key.size(1), 0, query.size(2), key.size(2), query.size(3)};
  TORCH_CHECK(s.Hk > 0 && s.H % s.Hk == 0, "masked_attention: query heads must be a multiple of key/value heads");
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(3) == s.D, "masked_attention: k and v must be [1, Hk, L, D]");
  TORCH_CHECK(attn_mask.size(2) == s.r && attn_mask.size(3) == s.L, "masked_attention: mask must be [1, 1, r, L]");
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "masked_attention: fp32 or bf16");
  TORCH_CHECK(key.scalar_type() == dtype && value.scalar_type() == dtype && attn_mask.scalar_type() == dtype,
              "masked_attention: q, k, v and mask of one dtype");
  Shape shape = s;
  shape.G = s.H / s.Hk;
  if (s.r > kMaxRows) return wide(query, key, value, attn_mask, scale, shape);
  auto q = query.contiguous();
  auto k = key.contiguous();
  auto v = value.contiguous();
  auto mask = attn_mask.contiguous();
  auto out = at::empty({1, s.r, s.H, s.D}, query.options());
  if (dtype == at::kFloat)
    run_any<float>(q, k, v, mask, scale, shape, out);
  else
    run_any<at::BFloat16>(q, k, v, mask, scale, shape, out);
  return out;
}

TORCH_LIBRARY_FRAGMENT(eagle, m) {
  m.def("masked_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(eagle, CPU, m) { m.impl("masked_attention", &masked_attention); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("masked_attention", &masked_attention, "q [1, H, r, D] over k, v [1, Hk, L, D] under mask [1, 1, r, L]");
}
