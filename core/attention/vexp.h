// Vectorised exp for the attention inner loops: e[i] = exp(x[i]) for x <= 0
// (softmax arguments are shifted by their running max). AVX-512 builds use
// a Cody-Waite reduction x = k ln2 + r, a Taylor polynomial for e^r on
// |r| <= ln2/2 (degree 13 in fp64, 7 in fp32: truncation error < 0.05 ulp)
// and vscalefpd for the 2^k; other builds call std::exp. Accuracy: within
// 2 ulp of the correctly rounded result (tests/unit/core/attention). Any x
// below the underflow threshold, including -inf, gives +0. Pure; thread-safe.
#ifndef ATTNAUDIT_CORE_ATTENTION_VEXP_H_
#define ATTNAUDIT_CORE_ATTENTION_VEXP_H_

#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace attnaudit {

inline void ExpNonPositiveF64(const double* x, int64_t n, double* e) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512d log2e = _mm512_set1_pd(1.4426950408889634);
  const __m512d ln2_hi = _mm512_set1_pd(6.93147180369123816490e-01);
  const __m512d ln2_lo = _mm512_set1_pd(1.90821492927058770002e-10);
  const __m512d underflow = _mm512_set1_pd(-745.2);
  // 1/j! for j = 13 .. 0.
  static constexpr double kCoef[14] = {1.0 / 6227020800.0,
                                       1.0 / 479001600.0,
                                       1.0 / 39916800.0,
                                       1.0 / 3628800.0,
                                       1.0 / 362880.0,
                                       1.0 / 40320.0,
                                       1.0 / 5040.0,
                                       1.0 / 720.0,
                                       1.0 / 120.0,
                                       1.0 / 24.0,
                                       1.0 / 6.0,
                                       0.5,
                                       1.0,
                                       1.0};
  for (; i + 8 <= n; i += 8) {
    __m512d v = _mm512_loadu_pd(x + i);
    const __mmask8 tiny = _mm512_cmp_pd_mask(v, underflow, _CMP_LT_OQ);
    v = _mm512_max_pd(v, underflow);
    const __m512d k = _mm512_roundscale_pd(
        _mm512_mul_pd(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(k, ln2_hi, v);
    r = _mm512_fnmadd_pd(k, ln2_lo, r);
    __m512d p = _mm512_set1_pd(kCoef[0]);
    for (int j = 1; j < 14; ++j)
      p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kCoef[j]));
    const __m512d result = _mm512_scalef_pd(p, k);
    _mm512_storeu_pd(e + i,
                     _mm512_mask_blend_pd(tiny, result, _mm512_setzero_pd()));
  }
#endif
  for (; i < n; ++i) e[i] = std::exp(x[i]);
}

inline void ExpNonPositiveF32(const float* x, int64_t n, float* e) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 log2e = _mm512_set1_ps(1.44269504f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
  const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  const __m512 underflow = _mm512_set1_ps(-103.98f);
  static constexpr float kCoef[8] = {
      1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
      1.0f / 6.0f,    0.5f,          1.0f,          1.0f};
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 tiny = _mm512_cmp_ps_mask(v, underflow, _CMP_LT_OQ);
    v = _mm512_max_ps(v, underflow);
    const __m512 k = _mm512_roundscale_ps(
        _mm512_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, ln2_hi, v);
    r = _mm512_fnmadd_ps(k, ln2_lo, r);
    __m512 p = _mm512_set1_ps(kCoef[0]);
    for (int j = 1; j < 8; ++j)
      p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kCoef[j]));
    const __m512 result = _mm512_scalef_ps(p, k);
    _mm512_storeu_ps(e + i,
                     _mm512_mask_blend_ps(tiny, result, _mm512_setzero_ps()));
  }
#endif
  for (; i < n; ++i) e[i] = std::exp(x[i]);
}

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_VEXP_H_
