// y [M, O] = x [M, I] . w [O, I]^T for the few rows of a decode step, bf16 weights read once: the linear layers
// of eagle/compiled/gemv.py, in two kinds:
//   - bf16 x, bf16 y (fp32 sums, rounded to nearest even), on a CPU with AVX512-BF16 (pair dot products);
//   - fp32 x, fp32 y, on a CPU with AVX512F but no bf16 arithmetic, or with AVX2 and FMA only: each bf16 weight
//     widened to fp32 in a register (its 16 bits moved to the high half), then fp32 multiply-adds. Exactly the
//     products of the fp32 model whose weights are these bf16 values, reading half the bytes.
//
// A decode step multiplies a handful of rows by every weight once, so it is bound by how fast the weights stream
// from memory. The AVX512 forms read w [O, I]: each thread takes blocks of 16 (or 18) output rows. R output rows are
// read together (4; 3 from 7 input rows), one register of inputs at a time, fetched 8 rows ahead; the input rows are
// taken up to 8 at a time, each multiplied into the R weight registers (up to 24 accumulators of the 32 registers).
// The first group of input rows reads the weights from memory, the later groups re-read the same R rows from L1 (R x
// I x 2 bytes) while they fetch rows further ahead into L2, so any row count streams the weights once. Up to 8 rows
// take one pass: multiplying while the weights stream in, where a second pass over L1 would add its products' time
// to the stream's (on an AVX512F Xeon an 8-row call of the target's weights took 0.8x as long as two passes of 4).
// Inputs need not fill the last register: it is loaded masked. Each output is its row's own sum, whatever rows run
// beside it. The AVX2 form (avx2_gemv below) reads the weights packed in pairs of output rows, each pair one run of
// bytes, as bf16 or (the draft head's approximate weights: `gemv_int8_linear`) as int8 codes with a scale a row,
// read against the input rows rounded to 16-bit integers.

#include <torch/extension.h>

#include <cfloat>

#include <ATen/Parallel.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define EAGLE_GEMV_F32 1  // the fp32 kind: widening loads need AVX512BW/VL's masked 16-bit loads
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define EAGLE_GEMV_AVX2 1  // the fp32 kind in 8-lane registers (avx2_gemv below)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

#ifdef EAGLE_GEMV_F32
constexpr int kGroup = 8;       // input rows multiplied together (one pass over the weights)
constexpr int64_t kBlock = 16;  // output rows a task, at least (rounded up to a multiple of R)
constexpr int64_t kAhead = 8;   // output rows the weights are fetched ahead

// The first two levels of the transposing tree below. halves(x, y): lanes 0-7 partial sums of x, 8-15 of y.
inline __m512 halves(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
}

// quarters(x, y) of two `halves`: quarter q holds 4 partial sums of the q-th of their 4 sources.
inline __m512 quarters(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
}

// sums[i] = the sum of a[i]'s 16 lanes, for i < count (<= 16), by one transposing tree: 8 + 4 + 4 + 2 vector
// adds for all of them, where 16 separate reductions cost ~12 instructions each.
inline void reduce16(const __m512* a, int count, float* sums) {
  __m512 v[16];
  for (int i = 0; i < 16; ++i) v[i] = i < count ? a[i] : _mm512_setzero_ps();
  __m512 b[8];  // b[i]: lanes 0-7 partial sums of v[2i], 8-15 of v[2i+1]
  for (int i = 0; i < 8; ++i) b[i] = halves(v[2 * i], v[2 * i + 1]);
  __m512 c[4];  // c[i]: quarter q holds 4 partial sums of v[4i + q]
  for (int i = 0; i < 4; ++i) c[i] = quarters(b[2 * i], b[2 * i + 1]);
  const __m512 u = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
  const __m512 w = _mm512_add_ps(_mm512_unpacklo_ps(c[2], c[3]), _mm512_unpackhi_ps(c[2], c[3]));
  // lane 4q + j: the sum of v[4j + q]
  const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(u, w, 0x44), _mm512_shuffle_ps(u, w, 0xEE));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, t);
  for (int i = 0; i < count; ++i) sums[i] = lanes[4 * (i % 4) + i / 4];
}

// reduce16's sums of up to 4 registers, by the same tree (so the same sums, bit for bit) without its 12 zero
// registers: a pass of one input row reduces 3 or 4 at a time.
inline void reduce4(const __m512* a, int count, float* sums) {
  __m512 v[4];
  for (int i = 0; i < 4; ++i) v[i] = i < count ? a[i] : _mm512_setzero_ps();
  const __m512 c = quarters(halves(v[0], v[1]), halves(v[2], v[3]));  // quarter q: 4 partial sums of v[q]
  const __m512 u = _mm512_add_ps(c, _mm512_permute_ps(c, 0x4E));  // lane 4q: partials 0 + 2, lane 4q + 1: 1 + 3
  const __m512 t = _mm512_add_ps(u, _mm512_permute_ps(u, 0xB1));  // lane 4q: the sum of v[q]
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, t);
  for (int i = 0; i < count; ++i) sums[i] = lanes[4 * i];
}

// The bf16 kind's step: 32 inputs a register, pair dot products into fp32 lanes.
struct Bf16 {
  using X = uint16_t;
  using Y = at::BFloat16;
  using Mask = __mmask32;
  static constexpr int64_t kLanes = 32;
#ifdef __AVX512BF16__
  static __m512bh load(const uint16_t* p, Mask mask) {
    return (__m512bh)(mask == Mask(~0u) ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask, p));
  }
  using W = __m512bh;
  static W weights(const uint16_t* p, Mask mask) { return load(p, mask); }
  static __m512 madd(__m512 acc, const uint16_t* x, W w, Mask mask) { return _mm512_dpbf16_ps(acc, load(x, mask), w); }
#else  // never called: gemv refuses bf16 inputs where the CPU has no AVX512-BF16
  using W = __m512;
  static W weights(const uint16_t*, Mask) { return _mm512_setzero_ps(); }
  static __m512 madd(__m512 acc, const uint16_t*, W, Mask) { return acc; }
#endif
};

// The fp32 kind's step: 16 inputs a register; 16 bf16 weights widened to fp32, then multiply-adds.
struct F32 {
  using X = float;
  using Y = float;
  using Mask = __mmask16;
  using W = __m512;
  static constexpr int64_t kLanes = 16;
  static W weights(const uint16_t* p, Mask mask) {
    const __m256i h = mask == Mask(0xFFFF) ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                           : _mm256_maskz_loadu_epi16(mask, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 madd(__m512 acc, const float* x, W w, Mask mask) {
    return _mm512_fmadd_ps(mask == Mask(0xFFFF) ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(mask, x), w, acc);
  }
};

// Output rows o..o+n-1 (n <= R) for input rows x[0..G-1]; `fetch`: prefetch the weights ahead (first group).
template <typename K, int G, int R, bool fetch>
void rows_block(const typename K::X* x, const uint16_t* w, typename K::Y* y, int64_t I, int64_t O, int64_t o, int n,
                int64_t ahead) {
  using Mask = typename K::Mask;
  __m512 acc[G][R];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) acc[g][r] = _mm512_setzero_ps();
  const uint16_t* row[R];
  for (int r = 0; r < R; ++r) row[r] = w + (o + std::min(r, n - 1)) * I;
  const auto step = [&](int64_t k, Mask mask) {
    typename K::W wv[R];
    for (int r = 0; r < R; ++r) {
      if (fetch) _mm_prefetch(reinterpret_cast<const char*>(row[r] + kAhead * I + k), _MM_HINT_T0);
      else _mm_prefetch(reinterpret_cast<const char*>(row[r] + ahead * I + k), _MM_HINT_T1);
      wv[r] = K::weights(row[r] + k, mask);
    }
    for (int g = 0; g < G; ++g)
      for (int r = 0; r < R; ++r) acc[g][r] = K::madd(acc[g][r], x + g * I + k, wv[r], mask);
  };
  const int64_t full = I / K::kLanes * K::kLanes;
  for (int64_t k = 0; k < full; k += K::kLanes) step(k, Mask(~Mask(0)));
  if (full < I) step(full, Mask((Mask(1) << (I - full)) - 1));
  float sums[G * R];
  if (G * R <= 4)
    reduce4(&acc[0][0], G * R, sums);
  else
    for (int c = 0; c < G * R; c += 16) reduce16(&acc[0][0] + c, std::min(16, G * R - c), sums + c);
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < n; ++r) y[g * O + o + r] = typename K::Y(sums[g * R + r]);
}

template <typename K, int R, bool fetch>
void group(int g, const typename K::X* x, const uint16_t* w, typename K::Y* y, int64_t I, int64_t O, int64_t o, int n,
           int64_t ahead) {
  switch (g) {
    case 1: rows_block<K, 1, R, fetch>(x, w, y, I, O, o, n, ahead); break;
    case 2: rows_block<K, 2, R, fetch>(x, w, y, I, O, o, n, ahead); break;
    case 3: rows_block<K, 3, R, fetch>(x, w, y, I, O, o, n, ahead); break;
    case 4: rows_block<K, 4, R, fetch>(x, w, y, I, O, o, n, ahead); break;
    case 5: rows_block<K, 5, R, fetch>(x, w, y, I, O, o, n, ahead); break;
    case 6: rows_block<K, 6, R, fetch>(x, w, y, I, O, o, n, ahead); break;
    case 7: rows_block<K, 7, R, fetch>(x, w, y, I, O, o, n, ahead); break;
    default: rows_block<K, 8, R, fetch>(x, w, y, I, O, o, n, ahead); break;
  }
}

// Output rows o0..o1-1 for all M input rows, R output rows at a time.
template <typename K, int R>
void block(const typename K::X* x, const uint16_t* w, typename K::Y* y, int64_t M, int64_t I, int64_t O, int64_t o0,
           int64_t o1) {
  for (int64_t o = o0; o < o1; o += R) {
    const int n = static_cast<int>(std::min<int64_t>(R, o1 - o));
    for (int64_t m = 0; m < M; m += kGroup) {
      const int g = static_cast<int>(std::min<int64_t>(kGroup, M - m));
      if (m == 0)
        group<K, R, true>(g, x, w, y, I, O, o, n, 0);
      else  // the later groups fetch rows further ahead into L2, while they compute from L1
        group<K, R, false>(g, x + m * I, w, y + m * O, I, O, o, n, kAhead + R * (m / kGroup));
    }
  }
}

// The threads' tasks: blocks of the output rows, R at a time.
template <typename K, int R>
void tasks(const typename K::X* x, const uint16_t* w, typename K::Y* y, int64_t M, int64_t I, int64_t O) {
  constexpr int64_t rows = (kBlock + R - 1) / R * R;  // a task's output rows: a multiple of R (16; 18 for R = 3)
  at::parallel_for(0, (O + rows - 1) / rows, 1, [&](int64_t b0, int64_t b1) {
    block<K, R>(x, w, y, M, I, O, b0 * rows, std::min(O, b1 * rows));
  });
}

template <typename K>
void run(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& y) {
  const int64_t M = x.size(0), I = x.size(1), O = w.size(0);
  const auto* xp = reinterpret_cast<const typename K::X*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* yp = reinterpret_cast<typename K::Y*>(y.data_ptr());
  if (M < 7)  // up to 6 x 4 accumulators
    tasks<K, 4>(xp, wp, yp, M, I, O);
  else  // 7 or 8 input rows a pass: 3 output rows, up to 24 accumulators (of 32 registers)
    tasks<K, 3>(xp, wp, yp, M, I, O);
}
#endif

}  // namespace

#ifdef EAGLE_GEMV_AVX2
// The fp32 kind on a CPU with AVX2 and FMA but no AVX512: 8 inputs a register, 16 registers, over weights packed
// in pairs of output rows (`pack` in eagle/compiled/gemv.py): w [O/2, I/8, 2, 2, 4], pair p holding, for each 8
// inputs in turn, their first 4 weights of rows 2p and 2p + 1, then their last 4 of both. A pair is one run of
// bytes, so the weights stream as one sequence, where rows of [O, I] read side by side are as many streams: on a
// 2-core Zen 3 the target's weights took 0.71-0.89x the time of that at 1-16 input rows (pairs of rows read in
// one pass beat blocks of 4 or 8 read in passes of 2, and match blocks of 8 in one pass at 1 row). Input rows are
// taken up to kGroup at a time (groups of even size), G x 2 accumulators, 2 weights and an input within the 16
// registers; the first group fetches the weights 2 KB ahead, later ones re-read the pair from L1 (2 x I x 2
// bytes). The 4 + 4 order widens a 32-byte chunk into the two rows' registers with one interleave each
// (`widen_pair`), where widening each row's 8 weights took two instructions: 0.94-0.96x the time at 4 input
// rows, the same at 1 (Zen 3).
namespace avx2_gemv {
constexpr int kRows = 2;              // output rows a pass: the packing's
constexpr int kGroup = 6;             // input rows a pass, at most: 12 accumulators
constexpr int kAheadBytes = 2048;     // weights fetched ahead of the first group
constexpr int64_t kTaskPairs = 8;     // pairs a thread's task takes, at least

// A chunk [2 halves][2 rows][4 inputs] of bf16 as the two rows' 8 fp32 weights: interleaving zeros below each
// 16 bits (per 128-bit lane: lane 0 takes half 0, lane 1 half 1) puts a row's inputs 0-7 in order.
inline void widen_pair(const uint16_t* chunk, __m256& row0, __m256& row1) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk)), zero = _mm256_setzero_si256();
  row0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
  row1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
}

inline float sum8(__m256 v) {  // the 8 lanes' sum, by one fixed tree
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Input rows x[0..G-1] times the bf16 pair of rows at `pair` (outputs o, o + 1); `fetch`: prefetch 2 KB ahead
// (first group).
template <int G>
void pass(const float* x, const uint16_t* pair, float* y, int64_t I, int64_t O, int64_t o, bool fetch) {
  __m256 acc[G][kRows];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < kRows; ++r) acc[g][r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < I; k += 8) {
    const uint16_t* chunk = pair + k * kRows;  // both rows' weights of inputs k..k+7
    if (fetch) _mm_prefetch(reinterpret_cast<const char*>(chunk) + kAheadBytes, _MM_HINT_T0);
    __m256 w0, w1;
    widen_pair(chunk, w0, w1);
    for (int g = 0; g < G; ++g) {
      const __m256 xv = _mm256_loadu_ps(x + g * I + k);
      acc[g][0] = _mm256_fmadd_ps(xv, w0, acc[g][0]);
      acc[g][1] = _mm256_fmadd_ps(xv, w1, acc[g][1]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < kRows; ++r) y[g * O + o + r] = sum8(acc[g][r]);
}

// f(std::integral_constant<int, G>) for g input rows in one pass, G = min(g, Max) (g >= 1).
template <int Max, typename F>
void by_group(int g, F&& f) {
  if constexpr (Max > 1)
    if (g < Max) return by_group<Max - 1>(g, f);
  f(std::integral_constant<int, Max>{});
}

// The size of each pass over M input rows: the fewest passes of up to `most`, of even sizes (8 rows at most 6:
// 4 + 4, which took 0.84x the time of all 8 in one pass).
inline int64_t pass_rows(int64_t M, int64_t most) {
  const int64_t passes = (M + most - 1) / most;
  return (M + passes - 1) / passes;
}

// x [M, I] times bf16 pairs of rows w [O/2, I/8, 2, 2, 4]: the threads' tasks are runs of pairs.
void run(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& y) {
  const int64_t M = x.size(0), I = x.size(1), pairs = w.size(0), O = pairs * kRows, size = pass_rows(M, kGroup);
  const auto* xp = x.data_ptr<float>();
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* yp = y.data_ptr<float>();
  at::parallel_for(0, pairs, kTaskPairs, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t m = 0; m < M; m += size)
        by_group<kGroup>(static_cast<int>(std::min(size, M - m)), [&](auto G) {
          pass<G()>(xp + m * I, wp + p * kRows * I, yp + m * O, I, O, p * kRows, m == 0);
        });
  });
}

// Int8 codes against integer rows: a row v of weights read as s_v q_v (int8 codes q_v, packed in pairs
// [O/2, I/16, 2, 16]: for each 16 inputs in turn, row 2p's codes, then row 2p + 1's; eagle/compiled/int8_codes.py)
// and an input row x as s_x k (16-bit integers k, `integer_rows`) give s_x s_v (k . q_v), whose sum is exact in
// int32 (`_mm256_madd_epi16`: 16 products an instruction, where widening the codes to fp32 for multiply-adds takes
// twice the instructions a weight). Two uses: the draft head's approximate linear layers (`int8_run`) and the
// screened lm_head (`screen`).
constexpr int64_t kCodeInputs = 16;  // inputs a code chunk holds per row
constexpr int kIntGroup = 6;         // input rows a pass, at most: 12 accumulators

inline int32_t sum8i(__m256i v) {  // exact: the caller keeps the sums below 2^31
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// An output's value s_x s_v (k . q_v) from its 8 lanes of integer sums: the draft's output, the screen's approximation.
inline float scaled_sum(float sx, float scale, __m256i acc) { return sx * scale * static_cast<float>(sum8i(acc)); }

// Input rows k[0..G-1] against the code pair at `pair` (outputs o, o + 1): acc[g][r], 8 lanes of k_g . q_{o+r};
// `fetch`: prefetch 2 KB ahead (first group).
template <int G>
[[gnu::always_inline]] inline void integer_sums(const int16_t* k, const int8_t* pair, int64_t I, bool fetch,
                                                __m256i (&acc)[G][kRows]) {  // inlined: acc stays in registers
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < kRows; ++r) acc[g][r] = _mm256_setzero_si256();
  for (int64_t i = 0; i < I; i += kCodeInputs) {
    const int8_t* chunk = pair + i * kRows;  // row o's 16 codes, then row o + 1's
    if (fetch) _mm_prefetch(reinterpret_cast<const char*>(chunk) + kAheadBytes, _MM_HINT_T0);
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk));
    const __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(codes));
    const __m256i w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(codes, 1));
    for (int g = 0; g < G; ++g) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + g * I + i));
      acc[g][0] = _mm256_add_epi32(acc[g][0], _mm256_madd_epi16(xv, w0));
      acc[g][1] = _mm256_add_epi32(acc[g][1], _mm256_madd_epi16(xv, w1));
    }
  }
}

// Whether v is finite, by its bits: -ffast-math lets the compiler assume std::isfinite.
inline bool finite(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits >> 52 & 0x7FF) != 0x7FF;
}

// 16 inputs x * inv rounded to the nearest integers (ties to even) in [-kmax, kmax], as int16 into k.
inline void round16(const float* x, __m256 inv, __m256 kmax, int16_t* k) {
  const __m256 low = _mm256_sub_ps(_mm256_setzero_ps(), kmax);
  const __m256 a = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x), inv), low), kmax);
  const __m256 b = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8), inv), low), kmax);
  const __m256i packed = _mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b));  // lanes: a0 b0 a1 b1
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(k), _mm256_permute4x64_epi64(packed, 0xD8));
}

// The input rows x [M, I] (I a multiple of 16) as 16-bit integers k [M, I] with their scales sx [M] (a row's
// largest |x| / kmax, at least the smallest normal float) and, where l1 is given, |x|_1 (rounded up) l1 [M]:
// |k| <= kmax, where 127 kmax I < 2^31 keeps every integer sum exact, and |x / sx - k| <= 1/2 + the rounding of x
// times 1 / sx. False where a row is not finite.
bool integer_rows(const float* x, int64_t M, int64_t I, int16_t* k, float* sx, float* l1) {
  const float kmax = static_cast<float>(std::min<int64_t>(16383, INT32_MAX / (127 * I)));
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * I;
    double sum = 0;
    float peak = 0;
    for (int64_t i = 0; i < I; ++i) sum += std::abs(row[i]), peak = std::max(peak, std::abs(row[i]));
    if (!finite(sum)) return false;
    if (l1) l1[m] = static_cast<float>(sum * (1 + 1e-6));
    sx[m] = peak > 0 ? std::max(peak / kmax, FLT_MIN) : 1.0f;  // normal: 1 / sx stays finite
    const __m256 inv = _mm256_set1_ps(1.0f / sx[m]), top = _mm256_set1_ps(kmax);
    for (int64_t i = 0; i < I; i += kCodeInputs) round16(row + i, inv, top, k + m * I + i);
  }
  return true;
}

// Input rows k[0..G-1] (scales sx) times the code pair at `pair` (row scales `scale`): y's outputs o, o + 1.
template <int G>
void int8_pass(const int16_t* k, const int8_t* pair, const float* scale, const float* sx, float* y, int64_t I,
               int64_t O, int64_t o, bool fetch) {
  __m256i acc[G][kRows];
  integer_sums<G>(k, pair, I, fetch, acc);
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < kRows; ++r) y[g * O + o + r] = scaled_sum(sx[g], scale[o + r], acc[g][r]);
}

// The draft head's approximate linear: x [M, I] fp32 as integer rows times codes q [O/2, I/16, 2, 16] int8 with
// row scales [O]; y [M, O]. False (y untouched) where a row of x is not finite.
bool int8_run(const torch::Tensor& x, const torch::Tensor& q, const float* scale, torch::Tensor& y) {
  const int64_t M = x.size(0), I = x.size(1), pairs = q.size(0), O = pairs * kRows, size = pass_rows(M, kIntGroup);
  std::vector<int16_t> k(M * I);
  std::vector<float> sx(M);
  if (!integer_rows(x.data_ptr<float>(), M, I, k.data(), sx.data(), nullptr)) return false;
  const int8_t* qp = q.data_ptr<int8_t>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, pairs, kTaskPairs, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t m = 0; m < M; m += size)
        by_group<kIntGroup>(static_cast<int>(std::min(size, M - m)), [&](auto G) {
          int8_pass<G()>(k.data() + m * I, qp + p * kRows * I, scale, sx.data() + m, yp + m * O, I, O, p * kRows,
                         m == 0);
        });
  });
  return true;
}

// The screened lm_head of greedy steps (`gemv_screened_linear`): the argmax of x . w^T over the vocabulary, exactly,
// reading each row of w as int8 codes first. The approximate logit s_x s_v (k . q_v) is within
//   |x . w_v - s_x s_v (k . q_v)| <= |x|_1 max|w_v - s_v q_v| + s_x max|x/s_x - k| s_v |q_v|_1
//                                 <= |x|_1 slack[0][v] + s_x slack[1][v]   (+ 1e-6 of the approximation's size)
// of the exact one (Hoelder's inequality), where slack[0] holds half a code's step and the fp32 rounding of the
// exact sum, and slack[1] half a step of k times s_v |q_v|_1 (eagle/compiled/int8_codes.py `screen_pack`). A token
// whose upper end is below the largest lower end of its row cannot be the argmax (nor tie it); the others, a
// handful, take their exact logits from the bf16 pair through `pass` (the same bits as the unscreened call), and
// the rest -inf.

// Input rows k[0..G-1] (their scales sx, their |x|_1 l1) against the code pair at `pair` (outputs o, o + 1): each
// output's upper end into y, each row's largest lower end into low.
template <int G>
void screen_pass(const int16_t* k, const int8_t* pair, const float* scale, const float* slack, const float* sx,
                 const float* l1, float* y, float* low, int64_t I, int64_t O, int64_t o) {
  __m256i acc[G][kRows];
  integer_sums<G>(k, pair, I, true, acc);
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < kRows; ++r) {
      const int64_t v = o + r;
      const float approx = scaled_sum(sx[g], scale[v], acc[g][r]);
      const float bound = l1[g] * slack[v] + sx[g] * slack[O + v] + 1e-6f * std::abs(approx);
      y[g * O + v] = approx + bound;
      low[g] = std::max(low[g], approx - bound);
    }
}

// Each row's candidates (upper end >= the row's largest lower end, `lows` [threads, M]) scored exactly from the
// bf16 pairs w, the other outputs -inf: y [M, O] holds the upper ends on entry, the logits on return.
void keep_candidates(const float* x, const uint16_t* w, float* y, const std::vector<float>& lows, int threads,
                     int64_t M, int64_t I, int64_t O) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  for (int64_t m = 0; m < M; ++m) {
    float floor = kNone;
    for (int t = 0; t < threads; ++t) floor = std::max(floor, lows[t * M + m]);
    float* row = y + m * O;
    for (int64_t v = 0; v < O; v += kRows) {
      const bool keep0 = row[v] >= floor, keep1 = row[v + 1] >= floor;
      if (keep0 || keep1) {
        float exact[kRows];
        pass<1>(x + m * I, w + v * I, exact, I, kRows, 0, false);
        row[v] = keep0 ? exact[0] : kNone;
        row[v + 1] = keep1 ? exact[1] : kNone;
      } else {
        row[v] = row[v + 1] = kNone;
      }
    }
  }
}

// The screen over x [M, I] fp32: codes q [O/2, I/16, 2, 16] int8, scale [O], slack [2, O], bf16 pairs w; y [M, O].
// False (y untouched) where a row of x is not finite.
bool screen(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& q, const torch::Tensor& scale,
            const torch::Tensor& slack, torch::Tensor& y) {
  const int64_t M = x.size(0), I = x.size(1), pairs = q.size(0), O = pairs * kRows;
  std::vector<int16_t> k(M * I);
  std::vector<float> sx(M), l1(M);
  if (!integer_rows(x.data_ptr<float>(), M, I, k.data(), sx.data(), l1.data())) return false;
  const int8_t* qp = q.data_ptr<int8_t>();
  const float *sp = scale.data_ptr<float>(), *slp = slack.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int threads = at::get_num_threads();
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  std::vector<float> lows(static_cast<size_t>(threads) * M, kNone);  // [threads, M]: each thread's own row
  at::parallel_for(0, pairs, kTaskPairs, [&](int64_t p0, int64_t p1) {
    std::vector<float> low(M, kNone);  // the task's, so that threads do not write one cache line at every pair
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t m = 0; m < M; m += 4)
        by_group<4>(static_cast<int>(std::min<int64_t>(4, M - m)), [&](auto G) {
          screen_pass<G()>(k.data() + m * I, qp + p * kRows * I, sp, slp, sx.data() + m, l1.data() + m, yp + m * O,
                           low.data() + m, I, O, p * kRows);
        });
    float* mine = lows.data() + at::get_thread_num() * M;
    for (int64_t m = 0; m < M; ++m) mine[m] = std::max(mine[m], low[m]);
  });
  keep_candidates(x.data_ptr<float>(), reinterpret_cast<const uint16_t*>(w.data_ptr()), yp, lows, threads, M, I, O);
  return true;
}
}  // namespace avx2_gemv
#endif

// Which kinds this build runs: bf16 x (AVX512-BF16), fp32 x (AVX512F with BW and VL, or AVX2 with FMA).
bool available() {
#ifdef __AVX512BF16__
  return true;
#else
  return false;
#endif
}

bool available_f32() {
#if defined(EAGLE_GEMV_F32) || defined(EAGLE_GEMV_AVX2)
  return true;
#else
  return false;
#endif
}

// The weights' layout this build reads: [O/2, I/8, 2, 2, 4] pairs of output rows (the AVX2 form), or [O, I] rows.
bool packed() {
#ifdef EAGLE_GEMV_AVX2
  return true;
#else
  return false;
#endif
}

int64_t out_features(const torch::Tensor& w) { return w.dim() == 5 ? w.size(0) * w.size(3) : w.size(0); }
int64_t in_features(const torch::Tensor& w) { return w.dim() == 5 ? w.size(1) * w.size(2) * w.size(4) : w.size(1); }

// Whether w is in this build's layout: contiguous bf16, [O, I] or packed [O/2, I/8, 2, 2, 4].
bool readable(const torch::Tensor& w) {
  const bool layout = packed() ? w.dim() == 5 && w.size(2) == 2 && w.size(3) == 2 && w.size(4) == 4 : w.dim() == 2;
  return layout && w.scalar_type() == at::kBFloat16 && w.is_contiguous();
}

torch::Tensor gemv(const torch::Tensor& x, const torch::Tensor& w) {
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && (bf16 || x.scalar_type() == at::kFloat), "gemv: bf16 w, bf16 or fp32 x");
  TORCH_CHECK(bf16 ? available() : available_f32(), "gemv: built for a CPU without ",
              bf16 ? "AVX512-BF16" : "AVX512F/BW/VL or AVX2/FMA");
  TORCH_CHECK(x.is_contiguous() && x.dim() == 2 && readable(w),
              packed() ? "gemv: contiguous 2-d x, packed w [O/2, I/8, 2, 2, 4]" : "gemv: contiguous 2-d x, w");
  TORCH_CHECK(!x.is_cuda() && !w.is_cuda(), "gemv: CPU tensors");
  const int64_t M = x.size(0), I = x.size(1), O = out_features(w);
  TORCH_CHECK(in_features(w) == I, "gemv: x [M, I] and w [O, I]");
  auto y = torch::empty({M, O}, x.options());
  if (M == 0 || O == 0) return y;
  if (I == 0) return y.zero_();
#ifdef EAGLE_GEMV_F32
  if (bf16) run<Bf16>(x, w, y);
  else run<F32>(x, w, y);
#elif defined(EAGLE_GEMV_AVX2)
  avx2_gemv::run(x, w, y);  // fp32 x only: available() is false without AVX512-BF16
#endif
  return y;
}

// w [O, I] of any layout (the packed one unpacked).
at::Tensor row_major(const at::Tensor& w) {
  return w.dim() == 5 ? w.permute({0, 3, 1, 2, 4}).reshape({out_features(w), in_features(w)}) : w;
}

// The op a linear layer calls (eagle/compiled/gemv.py): x [..., I] w [O, I]^T -> [..., O]; more than `max_rows`
// rows (a prompt, a wide verify) go to ATen, which is compute-bound there and blocks its work better: `full`, the
// graph's own fp32 w^T [I, O] that the bf16 w copies, where the pass gave it (no weights widened per call), else
// the linear of w in x's dtype.
at::Tensor gemv_linear(const at::Tensor& x, const at::Tensor& w, int64_t max_rows,
                       const std::optional<at::Tensor>& full) {
  const int64_t I = x.size(-1);
  const int64_t M = I ? x.numel() / I : 0;
  const bool ours = x.scalar_type() == at::kBFloat16 ? available() : x.scalar_type() == at::kFloat && available_f32();
  if (!ours || M > max_rows || !readable(w) || in_features(w) != I)
    return full.has_value() ? at::matmul(x, *full) : at::linear(x, row_major(w).to(x.scalar_type()));
  auto shape = x.sizes().vec();
  shape.back() = out_features(w);
  return gemv(x.reshape({M, I}).contiguous(), w).view(shape);
}

// Whether q is int8 codes in the AVX2 form's pairs [O/2, I/16, 2, 16] and scale their rows' fp32 scales [O].
bool int8_readable(const at::Tensor& q, const at::Tensor& scale) {
  return packed() && q.dim() == 4 && q.size(2) == 2 && q.size(3) == 16 && q.scalar_type() == at::kChar &&
         q.is_contiguous() && scale.dim() == 1 && scale.size(0) == 2 * q.size(0) &&
         scale.scalar_type() == at::kFloat && scale.is_contiguous();
}

// The draft head's linear layers over int8 weights (eagle/compiled/gemv.py `int8_drafts`): x [..., I] fp32 times
// w [O, I]^T, w's row o read as scale[o] * q[o] and x's rows as 16-bit integers times a scale a row (q's codes
// rounded from w: an approximation, which drafting may use and verifying never does). More than `max_rows` rows,
// or a row not finite, take `full`, the graph's own exact fp32 w^T [I, O].
at::Tensor gemv_int8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, int64_t max_rows,
                            const at::Tensor& full) {
  const int64_t I = x.size(-1);
  const int64_t M = I ? x.numel() / I : 0;
  if (x.scalar_type() != at::kFloat || M > max_rows || M == 0 || !int8_readable(q, scale) || q.size(1) * 16 != I)
    return at::matmul(x, full);
#ifdef EAGLE_GEMV_AVX2
  auto shape = x.sizes().vec();
  shape.back() = scale.size(0);
  auto y = torch::empty({M, scale.size(0)}, x.options());
  if (avx2_gemv::int8_run(x.reshape({M, I}).contiguous(), q, scale.data_ptr<float>(), y)) return y.view(shape);
#endif
  return at::matmul(x, full);
}

namespace {
thread_local bool screening = false;  // this thread's forwards are greedy steps: `set_screening`
}

// Whether the calling thread's lm_head calls screen (`gemv_screened_linear`): set around a greedy step's forward
// (eagle/compiled/gemv.py `screened_argmax`), so a sampling step in the same thread never sees it. Returns the
// setting before.
bool set_screening(bool on) {
  const bool before = screening;
  screening = on;
  return before;
}

// Whether q, scale and slack are w's screening codes (`screen_pack`): q [O/2, I/16, 2, 16] int8, scale [O] and
// slack [2, O] fp32, all contiguous, in this build's packed layout.
bool screen_readable(const at::Tensor& w, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& slack) {
  const int64_t O = out_features(w), I = in_features(w);
  return packed() && q.dim() == 4 && q.size(0) * 2 == O && q.size(1) * 16 == I && q.size(2) == 2 &&
         q.size(3) == 16 && q.scalar_type() == at::kChar && q.is_contiguous() && scale.dim() == 1 &&
         scale.size(0) == O && scale.scalar_type() == at::kFloat && scale.is_contiguous() && slack.dim() == 2 &&
         slack.size(0) == 2 && slack.size(1) == O && slack.scalar_type() == at::kFloat && slack.is_contiguous() &&
         127 * I < INT32_MAX;
}

// The target's lm_head (eagle/compiled/int8_codes.py `screen_pack`): `gemv_linear(x, w, max_rows, full)`, except in a
// greedy step (`set_screening`) of up to `screen_rows` fp32 rows, where only each row's argmax matters: there the
// candidates for it (a handful of the O outputs, every token that may be or tie the largest logit) get their exact
// logits, the same bits as `gemv_linear`'s, and the others -inf, read from q's int8 codes instead of w's bf16
// values (avx2_gemv::screen).
at::Tensor gemv_screened_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& q, const at::Tensor& scale,
                                const at::Tensor& slack, int64_t max_rows, int64_t screen_rows, const at::Tensor& full) {
  const int64_t I = x.size(-1);
  const int64_t M = I ? x.numel() / I : 0;
  if (!screening || x.scalar_type() != at::kFloat || M == 0 || M > screen_rows || !readable(w) ||
      in_features(w) != I || !screen_readable(w, q, scale, slack))
    return gemv_linear(x, w, max_rows, full);
#ifdef EAGLE_GEMV_AVX2
  auto shape = x.sizes().vec();
  shape.back() = out_features(w);
  auto y = torch::empty({M, out_features(w)}, x.options());
  if (avx2_gemv::screen(x.reshape({M, I}).contiguous(), w, q, scale, slack, y)) return y.view(shape);
#endif
  return gemv_linear(x, w, max_rows, full);  // a row not finite
}

TORCH_LIBRARY_FRAGMENT(eagle, m) {
  m.def("gemv_linear(Tensor x, Tensor w, int max_rows, Tensor? full=None) -> Tensor");
  m.def("gemv_int8_linear(Tensor x, Tensor q, Tensor scale, int max_rows, Tensor full) -> Tensor");
  m.def("gemv_screened_linear(Tensor x, Tensor w, Tensor q, Tensor scale, Tensor slack, int max_rows, int screen_rows, "
        "Tensor full) -> Tensor");
}
TORCH_LIBRARY_IMPL(eagle, CPU, m) {
  m.impl("gemv_linear", &gemv_linear);
  m.impl("gemv_int8_linear", &gemv_int8_linear);
  m.impl("gemv_screened_linear", &gemv_screened_linear);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemv", &gemv, "y [M, O] = x [M, I] w [O, I]^T, bf16 w (in the build's layout), bf16 or fp32 x");
  m.def("available", &available, "built with AVX512-BF16 (bf16 x)");
  m.def("available_f32", &available_f32, "built with AVX512F/BW/VL or AVX2/FMA (fp32 x)");
  m.def("set_screening", &set_screening, "this thread's lm_head calls screen (greedy steps); returns the setting before");
  m.def("packed", &packed, "reads weights packed [O/2, I/8, 2, 2, 4] (the AVX2 form), not [O, I]");
}
