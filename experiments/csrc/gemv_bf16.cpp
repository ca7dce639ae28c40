// y [M, O] = x [M, I] . w [O, I]^T for a few rows M (1-4), bf16 in and out, fp32 sums: what a decode step's
// linear layers need on a CPU with AVX512-BF16 (experiments/gemv_roofline.py times it against torch's).
//
// The weights are streamed once: each thread takes blocks of 16 output rows; 4 of them at a time are read
// 32 inputs a register, fetched 8 rows ahead, and every one of the M input rows is multiplied into them by
// bf16 pair dot products (4 M accumulators in registers), summed across lanes at the end of a row.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>

namespace {

#ifdef __AVX512BF16__
constexpr int kRows = 4;      // output rows read together
constexpr int64_t kBlock = 16;  // output rows a task

template <int M>
void block(const uint16_t* x, const uint16_t* w, float* y, int64_t I, int64_t O, int64_t o0, int64_t o1) {
  for (int64_t o = o0; o < o1; o += kRows) {
    const int n = static_cast<int>(std::min<int64_t>(kRows, o1 - o));
    __m512 acc[M][kRows];
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < kRows; ++r) acc[m][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < I; k += 32) {
      __m512bh rows[kRows];
      for (int r = 0; r < kRows; ++r) {
        const uint16_t* p = w + (o + std::min(r, n - 1)) * I + k;
        _mm_prefetch(reinterpret_cast<const char*>(p + 8 * I), _MM_HINT_T0);
        rows[r] = (__m512bh)_mm512_loadu_si512(p);
      }
      for (int m = 0; m < M; ++m) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * I + k);
        for (int r = 0; r < kRows; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, rows[r]);
      }
    }
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < n; ++r) y[m * O + o + r] = _mm512_reduce_add_ps(acc[m][r]);
  }
}
#endif

}  // namespace

torch::Tensor gemv(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "gemv: bf16 x and w");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && x.dim() == 2 && w.dim() == 2, "gemv: contiguous 2-d x, w");
  const int64_t M = x.size(0), I = x.size(1), O = w.size(0);
  TORCH_CHECK(w.size(1) == I && I % 32 == 0 && M >= 1 && M <= 4, "gemv: 1-4 rows, inputs a multiple of 32");
#ifndef __AVX512BF16__
  TORCH_CHECK(false, "gemv: this CPU has no AVX512-BF16");
#else
  auto y = torch::empty({M, O}, x.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, (O + kBlock - 1) / kBlock, 1, [&](int64_t b0, int64_t b1) {
    const int64_t o0 = b0 * kBlock, o1 = std::min(O, b1 * kBlock);
    switch (M) {
      case 1: block<1>(xp, wp, yp, I, O, o0, o1); break;
      case 2: block<2>(xp, wp, yp, I, O, o0, o1); break;
      case 3: block<3>(xp, wp, yp, I, O, o0, o1); break;
      default: block<4>(xp, wp, yp, I, O, o0, o1); break;
    }
  });
  return y.to(at::kBFloat16);
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gemv", &gemv, "y = x w^T for 1-4 bf16 rows"); }
