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
// heads, and its values once. fp32 arithmetic; q, k, v and the output fp32 or bf16, the caches in
// their dtype or, under fp32 rows, in bf16 (half the bytes read; the rows' keys and values rounded
// as they are written). Heads whose size is a multiple of 32 (up to 128), at most 8 query heads a
// key/value head, take vector paths: with AVX512-BF16, bf16 rows over bf16 caches take dot products
// in bf16 pairs; with AVX512F, keys and values (bf16 widened) meet fp32 queries (fp32 rows' own, never
// rounded to bf16) in 16-lane fp32 registers. Every
// other case runs portable loops, which the compiler vectorizes.

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
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

#ifdef __AVX512F__
constexpr int64_t kAhead = 16;  // positions

void softmax_rows(float* scores, int64_t G, int64_t n, float scale, float cap);
using Attend = void (*)(const Task&, float*, float*, float, float);

// 16 elements of a key or value row as fp32 (bf16: its 16 bits become the high half)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// one row's D = 16 C elements, a 64-byte line at a time, fetched into L1 (T0) or L2 (T1)
template <typename T, int C, _mm_hint Hint>
inline void fetch(const T* row) {
  for (int e = 0; e < 16 * C; e += 64 / int(sizeof(T))) _mm_prefetch(reinterpret_cast<const char*>(row + e), Hint);
}

// G query heads a key/value head, C 16-lane chunks a head: both known to the compiler, so the queries and
// the G x C accumulators stay in registers. The keys and values are fetched kAhead positions ahead of use,
// the values already while the scores are taken: the hardware's prefetchers stop at every 4 KB page, and
// left alone the memory idled while the scores' softmax ran (bf16, 256 rows over 512 positions, 30 layers,
// Zen 4: 109 ms without, 91 ms with, the same work from cache 38 ms). Tried and slower there: 16 keys' sums
// at once by a transpose, and bf16 weights with paired value rows.
template <typename T, int G, int C>
void scores_f32(const Task& t, float* scores) {
  __m512 q[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) q[g][c] = _mm512_loadu_ps(t.q + g * 16 * C + 16 * c);
  const T* keys = static_cast<const T*>(t.keys);
  const T* values = static_cast<const T*>(t.values);
  for (int64_t j = 0; j < t.n; ++j) {
    const T* k = keys + j * t.stride;
    fetch<T, C, _MM_HINT_T0>(k + kAhead * t.stride);
    fetch<T, C, _MM_HINT_T1>(values + (j + kAhead) * t.stride);
    __m512 kv[C];
    for (int c = 0; c < C; ++c) kv[c] = load16(k + 16 * c);
    for (int g = 0; g < G; ++g) {
      __m512 acc = _mm512_mul_ps(q[g][0], kv[0]);
      for (int c = 1; c < C; ++c) acc = _mm512_fmadd_ps(q[g][c], kv[c], acc);
      scores[g * t.n + j] = _mm512_reduce_add_ps(acc);
    }
  }
}

template <typename T, int G, int C>
void values_f32(const Task& t, const float* p, float* out) {
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  const T* values = static_cast<const T*>(t.values);
  for (int64_t j = 0; j < t.n; ++j) {
    const T* v = values + j * t.stride;
    fetch<T, C, _MM_HINT_T0>(v + kAhead * t.stride);
    __m512 row[C];
    for (int c = 0; c < C; ++c) row[c] = load16(v + 16 * c);
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * t.n + j]);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(w, row[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + g * 16 * C + 16 * c, acc[g][c]);
}

template <typename T, int G, int C>
void attend_f32(const Task& t, float* scores, float* out, float scale, float cap) {
  scores_f32<T, G, C>(t, scores);
  softmax_rows(scores, G, t.n, scale, cap);
  values_f32<T, G, C>(t, scores, out);
}

#ifdef __AVX512BF16__
// bf16 keys: their dot products with bf16 queries (bf16 rows': exact in bf16) in bf16 pairs, 32 a register
template <int G, int C>
void scores_bf16(const Task& t, float* scores) {
  constexpr int P = C / 2;
  __m512bh q[G][P];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < P; ++c)
      q[g][c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(t.q + g * 16 * C + 32 * c + 16),
                                    _mm512_loadu_ps(t.q + g * 16 * C + 32 * c));
  const uint16_t* keys = static_cast<const uint16_t*>(t.keys);
  const at::BFloat16* values = static_cast<const at::BFloat16*>(t.values);
  for (int64_t j = 0; j < t.n; ++j) {
    const uint16_t* k = keys + j * t.stride;
    fetch<uint16_t, C, _MM_HINT_T0>(k + kAhead * t.stride);
    fetch<at::BFloat16, C, _MM_HINT_T1>(values + (j + kAhead) * t.stride);
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
void attend_bf16(const Task& t, float* scores, float* out, float scale, float cap) {
  scores_bf16<G, C>(t, scores);
  softmax_rows(scores, G, t.n, scale, cap);
  values_f32<at::BFloat16, G, C>(t, scores, out);
}
#endif

// the vector path for rows of T over caches of S, G heads of size D, or nullptr: D one of 32, 64, 96, 128
// and G at most 8
#define EAGLE_ROW(f, g) {&f<g, 2>, &f<g, 4>, &f<g, 6>, &f<g, 8>}
#define EAGLE_TABLE(f) {EAGLE_ROW(f, 1), EAGLE_ROW(f, 2), EAGLE_ROW(f, 3), EAGLE_ROW(f, 4), \
                        EAGLE_ROW(f, 5), EAGLE_ROW(f, 6), EAGLE_ROW(f, 7), EAGLE_ROW(f, 8)}
template <int G, int C> void attend_f32_f32(const Task& t, float* s, float* o, float a, float b) {
  attend_f32<float, G, C>(t, s, o, a, b);
}
template <int G, int C> void attend_f32_bf16(const Task& t, float* s, float* o, float a, float b) {
  attend_f32<at::BFloat16, G, C>(t, s, o, a, b);
}
const Attend kF32[8][4] = EAGLE_TABLE(attend_f32_f32);
const Attend kF32OverBf16[8][4] = EAGLE_TABLE(attend_f32_bf16);  // fp32 rows: queries kept in fp32
#ifdef __AVX512BF16__
const Attend kBf16[8][4] = EAGLE_TABLE(attend_bf16);  // bf16 rows: queries that bf16 holds exactly
#else
const Attend kBf16[8][4] = EAGLE_TABLE(attend_f32_bf16);
#endif
#undef EAGLE_TABLE
#undef EAGLE_ROW

template <typename T, typename S>
Attend fast_path(int64_t G, int64_t D) {
  if (!(D % 32 == 0 && D <= 128 && G >= 1 && G <= 8)) return nullptr;
  if constexpr (std::is_same_v<S, float>) return kF32[G - 1][D / 32 - 1];
  else if constexpr (std::is_same_v<T, float>) return kF32OverBf16[G - 1][D / 32 - 1];
  else return kBf16[G - 1][D / 32 - 1];
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

template <typename T, typename S>
torch::Tensor decode(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& k_cache,
                     torch::Tensor& v_cache, const torch::Tensor& slots, const torch::Tensor& lengths, double scale,
                     int64_t window, double softcap) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hk = k_cache.size(1), T_ = k_cache.size(2);
  const int64_t G = H / Hk;
  auto out = torch::empty({B, H, D}, q.options());
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  S* kc = k_cache.data_ptr<S>();
  S* vc = v_cache.data_ptr<S>();
  T* op = out.data_ptr<T>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  const int64_t cs0 = k_cache.stride(0), cs1 = k_cache.stride(1), cs2 = k_cache.stride(2);
#ifdef __AVX512F__
  const Attend fast = fast_path<T, S>(G, D);
#endif
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(sp[b] >= 0 && sp[b] < k_cache.size(0) && lp[b] >= 1 && lp[b] <= T_, "slot_decode: row ", b,
                " has slot ", sp[b], " and length ", lp[b], " outside the cache [", k_cache.size(0), ", ", T_, "]");
  // every row's key and value first: rows of one slot (a prompt's tokens) attend over each other's
#pragma omp parallel for
  for (int64_t task = 0; task < B * Hk; ++task) {
    const int64_t b = task / Hk, h = task % Hk, at = sp[b] * cs0 + h * cs1 + (lp[b] - 1) * cs2;
    for (int64_t d = 0; d < D; ++d) {
      store(kc + at + d, to_float(kp[(b * Hk + h) * D + d]));
      store(vc + at + d, to_float(vp[(b * Hk + h) * D + d]));
    }
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
#ifdef __AVX512F__
      if (fast) {
        fast(t, scores.data(), acc.data(), float(scale), float(softcap));
      } else
#endif
      {
        scores_portable<S>(t, G, D, scores.data(), row.data());
        softmax_rows(scores.data(), G, t.n, float(scale), float(softcap));
        values_portable<S>(t, G, D, scores.data(), acc.data(), row.data());
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
  const auto rows = q.scalar_type(), cache = k_cache.scalar_type();
  TORCH_CHECK(k.scalar_type() == rows && v.scalar_type() == rows && v_cache.scalar_type() == cache,
              "slot_decode: q, k and v of one dtype, the two caches of one dtype");
  TORCH_CHECK(q.size(1) % k_cache.size(1) == 0, "slot_decode: query heads a multiple of key/value heads");
  if (rows == at::kBFloat16 && cache == at::kBFloat16)
    return decode<at::BFloat16, at::BFloat16>(q, k, v, k_cache, v_cache, slots, lengths, scale, window, softcap);
  if (rows == at::kFloat && cache == at::kFloat)
    return decode<float, float>(q, k, v, k_cache, v_cache, slots, lengths, scale, window, softcap);
  TORCH_CHECK(rows == at::kFloat && cache == at::kBFloat16, "slot_decode: rows and caches fp32, bf16, or fp32 rows "
              "over bf16 caches, not ", rows, " over ", cache);
  return decode<float, at::BFloat16>(q, k, v, k_cache, v_cache, slots, lengths, scale, window, softcap);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("slot_decode", &slot_decode, "one decode step of slot attention"); }
