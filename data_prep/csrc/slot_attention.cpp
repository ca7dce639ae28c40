// One step of attention for the rows of our batched reply engine, each row in a slot of a KV cache
// (data_prep/slot_attention.py builds and calls it; data_prep/batched_decoding.py is the engine).
//
//   slot_decode(q [B, H, D], k [B, Hk, D], v [B, Hk, D], k_cache [S, Hk, T, D], v_cache [S, Hk, T, D],
//               slots [B] int64, lengths [B] int64, scale, window, softcap) -> [B, H, D]
//
// Every row b first writes its key and value at position lengths[b] - 1 of slot slots[b]; then each
// row's H query heads attend over its slot's positions [max(0, lengths[b] - window), lengths[b])
// (window 0: all; softcap > 0: scores soft-capped as Gemma 2's are). Rows are tokens: a reply's next
// token, or a prompt's tokens, several rows of one slot at consecutive positions, each seeing the
// ones before it. The Hk key/value heads are shared by G = H / Hk query heads each. One task per
// (row, key/value head), handed to the threads as they free up: its keys are read once for all G
// heads, and its values once. fp32 arithmetic, fp32 or bf16 storage. On a CPU with AVX512-BF16,
// bf16 rows whose head size is a multiple of 32 (up to 128) take dot products in bf16 pairs and add
// values in 16-lane fp32 registers; every other case runs portable loops, which the compiler vectorizes.

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

namespace {

inline float to_float(float x) { return x; }
inline float to_float(at::BFloat16 x) {
  uint32_t bits = uint32_t(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline void store(float* out, float x) { *out = x; }
inline void store(at::BFloat16* out, float x) { *out = at::BFloat16(x); }  // round to nearest even

struct Task {  // one (row, key/value head): where its queries, keys and values live
  const float* q;   // [G, D] fp32 (exact for bf16 queries)
  const void* keys;  // [n, D] at `stride` elements a position, from the first visible one
  const void* values;
  int64_t n;         // visible positions
  int64_t stride;    // elements between positions
};

// scores[g * n + j] = q_g . key_j, for the portable path
template <typename T>
void scores_portable(const Task& t, int64_t G, int64_t D, float* scores, float* row) {
  const T* keys = static_cast<const T*>(t.keys);
  for (int64_t j = 0; j < t.n; ++j) {
    const T* k = keys + j * t.stride;
    for (int64_t d = 0; d < D; ++d) row[d] = to_float(k[d]);
    for (int64_t g = 0; g < G; ++g) {
      const float* q = t.q + g * D;
      float dot = 0.f;
      for (int64_t d = 0; d < D; ++d) dot += q[d] * row[d];
      scores[g * t.n + j] = dot;
    }
  }
}

// acc[g * D + d] = sum_j p[g * n + j] * value_j[d], for the portable path
template <typename T>
void values_portable(const Task& t, int64_t G, int64_t D, const float* p, float* acc, float* row) {
  const T* values = static_cast<const T*>(t.values);
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t j = 0; j < t.n; ++j) {
    const T* v = values + j * t.stride;
    for (int64_t d = 0; d < D; ++d) row[d] = to_float(v[d]);
    for (int64_t g = 0; g < G; ++g) {
      const float w = p[g * t.n + j];
      float* a = acc + g * D;
      for (int64_t d = 0; d < D; ++d) a[d] += w * row[d];
    }
  }
}

#ifdef __AVX512BF16__
constexpr int64_t kAhead = 16;  // positions

// G query heads a key/value head, C 16-lane chunks a head (D = 16 C): both known to the compiler, so
// the queries and the G x C accumulators stay in registers. Scores: dot products of bf16 pairs; values:
// fp32 multiply-adds. The keys and values are fetched kAhead positions ahead of use, the values already
// while the scores are taken: the hardware's prefetchers stop at every 4 KB page (32 positions of a
// 64-wide head), and left alone the memory idled while the scores' softmax ran (256 rows over 512 positions,
// 30 layers, one run: 109 ms without, 91 ms with, the same work from cache 38 ms). Tried and slower here:
// 16 keys' sums at once by a transpose (1.9 against 1.5 ms a layer at 128 slots over 512 positions), and
// bf16 weights with paired value rows (no faster).
template <int G, int C>
void scores_bf16(const Task& t, float* scores) {
  constexpr int P = C / 2;  // 32 bf16 a register
  __m512bh q[G][P];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < P; ++c)
      q[g][c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(t.q + g * 16 * C + 32 * c + 16),
                                    _mm512_loadu_ps(t.q + g * 16 * C + 32 * c));
  const uint16_t* keys = static_cast<const uint16_t*>(t.keys);
  const uint16_t* values = static_cast<const uint16_t*>(t.values);
  for (int64_t j = 0; j < t.n; ++j) {
    const uint16_t* k = keys + j * t.stride;
    for (int c = 0; c < C; c += 2) {  // 64 bytes a line: keys into L1, values into L2 for values_bf16
      _mm_prefetch(reinterpret_cast<const char*>(k + kAhead * t.stride + 16 * c), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(values + (j + kAhead) * t.stride + 16 * c), _MM_HINT_T1);
    }
    __m512bh kv[P];
    for (int c = 0; c < P; ++c) kv[c] = (__m512bh)_mm512_loadu_si512(k + 32 * c);
    for (int g = 0; g < G; ++g) {
      __m512 acc = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[g][0], kv[0]);
      for (int c = 1; c < P; ++c) acc = _mm512_dpbf16_ps(acc, q[g][c], kv[c]);
      scores[g * t.n + j] = _mm512_reduce_add_ps(acc);
    }
  }
}

template <int G, int C>
void values_bf16(const Task& t, const float* p, float* out) {
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  const uint16_t* values = static_cast<const uint16_t*>(t.values);
  for (int64_t j = 0; j < t.n; ++j) {
    const uint16_t* v = values + j * t.stride;
    for (int c = 0; c < C; c += 2) _mm_prefetch(reinterpret_cast<const char*>(v + kAhead * t.stride + 16 * c), _MM_HINT_T0);
    __m512 row[C];
    for (int c = 0; c < C; ++c)  // bf16 -> fp32: the 16 bits become the high half
      row[c] = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(v + 16 * c))), 16));
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * t.n + j]);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(w, row[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + g * 16 * C + 16 * c, acc[g][c]);
}

void softmax_rows(float* scores, int64_t G, int64_t n, float scale, float cap);

template <int G, int C>
void attend_bf16(const Task& t, float* scores, float* out, float scale, float cap) {
  scores_bf16<G, C>(t, scores);
  softmax_rows(scores, G, t.n, scale, cap);
  values_bf16<G, C>(t, scores, out);
}

using Attend = void (*)(const Task&, float*, float*, float, float);
#define EAGLE_ROW(g) {&attend_bf16<g, 2>, &attend_bf16<g, 4>, &attend_bf16<g, 6>, &attend_bf16<g, 8>}
const Attend kAttend[8][4] = {EAGLE_ROW(1), EAGLE_ROW(2), EAGLE_ROW(3), EAGLE_ROW(4),
                              EAGLE_ROW(5), EAGLE_ROW(6), EAGLE_ROW(7), EAGLE_ROW(8)};
#undef EAGLE_ROW

// the kernel for G heads of size D, or nullptr: D one of 32, 64, 96, 128 and G at most 8
Attend fast_path(int64_t G, int64_t D) {
  return (D % 32 == 0 && D <= 128 && G >= 1 && G <= 8) ? kAttend[G - 1][D / 32 - 1] : nullptr;
}
#endif

// p = softmax(x) over each query head's n scores, in place, x = scale * score, or cap * tanh(x / cap) when
// logits are soft-capped (cap > 0)
void softmax_rows(float* scores, int64_t G, int64_t n, float scale, float cap) {
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * n;
    for (int64_t j = 0; j < n; ++j) s[j] = cap > 0 ? cap * std::tanh(s[j] * scale / cap) : s[j] * scale;
    float top = s[0];
    for (int64_t j = 1; j < n; ++j) top = std::max(top, s[j]);
    float total = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - top);
      total += s[j];
    }
    const float inv = 1.f / total;
    for (int64_t j = 0; j < n; ++j) s[j] *= inv;
  }
}

template <typename T>
torch::Tensor decode(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& k_cache,
                     torch::Tensor& v_cache, const torch::Tensor& slots, const torch::Tensor& lengths, double scale,
                     int64_t window, double softcap) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hk = k_cache.size(1), T_ = k_cache.size(2);
  const int64_t G = H / Hk;
  auto out = torch::empty({B, H, D}, q.options());
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* kc = k_cache.data_ptr<T>();
  T* vc = v_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  const int64_t cs0 = k_cache.stride(0), cs1 = k_cache.stride(1), cs2 = k_cache.stride(2);
#ifdef __AVX512BF16__
  const Attend fast = fast_path(G, D);
#endif
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(sp[b] >= 0 && sp[b] < k_cache.size(0) && lp[b] >= 1 && lp[b] <= T_, "slot_decode: row ", b,
                " has slot ", sp[b], " and length ", lp[b], " outside the cache [", k_cache.size(0), ", ", T_, "]");
  // every row's key and value first: rows of one slot (a prompt's tokens) attend over each other's
#pragma omp parallel for
  for (int64_t task = 0; task < B * Hk; ++task) {
    const int64_t b = task / Hk, h = task % Hk, at = sp[b] * cs0 + h * cs1 + (lp[b] - 1) * cs2;
    std::memcpy(kc + at, kp + (b * Hk + h) * D, D * sizeof(T));
    std::memcpy(vc + at, vp + (b * Hk + h) * D, D * sizeof(T));
  }
  // rows differ in length (a prompt's first tokens against long replies): tasks are handed out as threads free up
#pragma omp parallel
  {
    std::vector<float> qf(G * D), acc(G * D), row(D), scores;
#pragma omp for schedule(dynamic, 4)
    for (int64_t task = 0; task < B * Hk; ++task) {
      const int64_t b = task / Hk, h = task % Hk, n = lp[b];
      const int64_t first = window > 0 ? std::max<int64_t>(0, n - window) : 0;
      const int64_t base = sp[b] * cs0 + h * cs1;
      for (int64_t i = 0; i < G * D; ++i) qf[i] = to_float(qp[(b * H + h * G) * D + i]);
      Task t{qf.data(), kc + base + first * cs2, vc + base + first * cs2, n - first, cs2};
      scores.resize(G * t.n);
      bool done = false;
#ifdef __AVX512BF16__
      if constexpr (std::is_same_v<T, at::BFloat16>) {
        if (fast) {
          fast(t, scores.data(), acc.data(), float(scale), float(softcap));
          done = true;
        }
      }
#endif
      if (!done) {
        scores_portable<T>(t, G, D, scores.data(), row.data());
        softmax_rows(scores.data(), G, t.n, float(scale), float(softcap));
        values_portable<T>(t, G, D, scores.data(), acc.data(), row.data());
      }
      for (int64_t i = 0; i < G * D; ++i) store(op + (b * H + h * G) * D + i, acc[i]);
    }
  }
  return out;
}

}  // namespace

torch::Tensor slot_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor k_cache,
                          torch::Tensor v_cache, torch::Tensor slots, torch::Tensor lengths, double scale,
                          int64_t window, double softcap) {
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), "slot_decode: q, k, v must be contiguous");
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.strides() == k_cache.strides(), "slot_decode: caches of one layout");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && k.scalar_type() == k_cache.scalar_type(),
              "slot_decode: q, k, v and the caches of one dtype");
  TORCH_CHECK(q.size(1) % k_cache.size(1) == 0, "slot_decode: query heads a multiple of key/value heads");
  if (q.scalar_type() == at::kBFloat16)
    return decode<at::BFloat16>(q, k, v, k_cache, v_cache, slots, lengths, scale, window, softcap);
  TORCH_CHECK(q.scalar_type() == at::kFloat, "slot_decode: fp32 or bf16, not ", q.scalar_type());
  return decode<float>(q, k, v, k_cache, v_cache, slots, lengths, scale, window, softcap);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("slot_decode", &slot_decode, "one decode step of slot attention"); }
