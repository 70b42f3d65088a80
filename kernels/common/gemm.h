// float32 products C = [C +] A @ B on the CPU's AVX-512 units, chosen at run time.
//
// MKL, behind at::mm, takes its AVX2 code on AMD CPUs, AVX-512 ones included (Zen 4 and 5), and
// oneDNN, which does dispatch on the instruction set, builds a primitive for every new shape
// (0.6-1.5 ms), while the conv's chunks and a training batch's edges change shape every call. This
// is a register-blocked product (8 x 32 blocks of C in 16 zmm registers, one rank-1 update per
// step of the inner dimension) with no set-up per shape, compiled for AVX-512 by a function
// attribute whatever the library's target flags, and taken only where the CPU runs AVX-512
// (`gemm_available`); elsewhere, and for float64, callers use at::mm.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CFMTRAIN_GEMM_AVX512 1
#endif

namespace cfmtrain::gemm {

// A(i, l) = a[i * a_rs + l * a_cs]: any strides, so that A may be a transpose.
struct Operand {
  const float* a;
  int64_t a_rs, a_cs;
};

#ifdef CFMTRAIN_GEMM_AVX512
#define CFMTRAIN_AVX512 __attribute__((target("avx512f")))

constexpr int kMR = 8;      // rows of a C block
constexpr int kNR = 32;     // columns of a C block: two zmm vectors
constexpr int64_t kKC = 256;  // inner-dimension slice: the B panel (kKC x kNR) stays in L1
constexpr int64_t kMC = 96;   // rows of A per pass over B's columns (A's slice stays in L1)

// C block (R rows, columns by the masks) (=|+=) A rows [R, kc] @ B rows [kc, 32].
template <int R>
CFMTRAIN_AVX512 void block(int64_t kc, Operand A, const float* b, int64_t ldb, float* c,
                           int64_t ldc, __mmask16 m0, __mmask16 m1, bool accumulate) {
  // A masked load with an empty mask gives zeros: no branch, so that the compiler keeps the
  // accumulators in registers (with a branch GCC stored them to the stack every step).
  __m512 c0[R], c1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    c0[r] = _mm512_maskz_loadu_ps(accumulate ? m0 : 0, c + r * ldc);
    c1[r] = _mm512_maskz_loadu_ps(accumulate ? m1 : 0, c + r * ldc + 16);
  }
  const float* a = A.a;
  for (int64_t l = 0; l < kc; ++l, a += A.a_cs, b += ldb) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, b), b1 = _mm512_maskz_loadu_ps(m1, b + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * A.a_rs]);
      c0[r] = _mm512_fmadd_ps(x, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(x, b1, c1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, c0[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, c1[r]);
  }
}

CFMTRAIN_AVX512 inline void block_rows(int rows, int64_t kc, Operand A, const float* b,
                                       int64_t ldb, float* c, int64_t ldc, __mmask16 m0,
                                       __mmask16 m1, bool accumulate) {
  switch (rows) {
    case 8: return block<8>(kc, A, b, ldb, c, ldc, m0, m1, accumulate);
    case 7: return block<7>(kc, A, b, ldb, c, ldc, m0, m1, accumulate);
    case 6: return block<6>(kc, A, b, ldb, c, ldc, m0, m1, accumulate);
    case 5: return block<5>(kc, A, b, ldb, c, ldc, m0, m1, accumulate);
    case 4: return block<4>(kc, A, b, ldb, c, ldc, m0, m1, accumulate);
    case 3: return block<3>(kc, A, b, ldb, c, ldc, m0, m1, accumulate);
    case 2: return block<2>(kc, A, b, ldb, c, ldc, m0, m1, accumulate);
    default: return block<1>(kc, A, b, ldb, c, ldc, m0, m1, accumulate);
  }
}

inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// C [m, n] (row stride ldc) (=|+= with `accumulate`) A [m, k] @ B [k, n] (row stride ldb, unit
// column stride), on the calling thread.
CFMTRAIN_AVX512 inline void gemm(int64_t m, int64_t n, int64_t k, Operand A, const float* b,
                                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = 0.0f;
    return;
  }
  for (int64_t l0 = 0; l0 < k; l0 += kKC) {
    const int64_t kc = k - l0 < kKC ? k - l0 : kKC;
    const bool acc = accumulate || l0 > 0;
    for (int64_t i0 = 0; i0 < m; i0 += kMC) {
      const int64_t i1 = m - i0 < kMC ? m : i0 + kMC;
      for (int64_t j = 0; j < n; j += kNR) {
        const __mmask16 m0 = lanes(n - j), m1 = lanes(n - j - 16);
        for (int64_t i = i0; i < i1; i += kMR) {
          const int rows = static_cast<int>(i1 - i < kMR ? i1 - i : kMR);
          const Operand Ai{A.a + i * A.a_rs + l0 * A.a_cs, A.a_rs, A.a_cs};
          block_rows(rows, kc, Ai, b + l0 * ldb + j, ldb, c + i * ldc + j, ldc, m0, m1, acc);
        }
      }
    }
  }
}

// Whether the AVX-512 product is taken: the CPU runs it (and the OS saves its registers), and
// CFMTRAIN_GEMM is not "aten" (which keeps at::mm, for comparisons), read once per library.
inline bool gemm_available() {
  static const bool available = [] {
    const char* env = std::getenv("CFMTRAIN_GEMM");
    return __builtin_cpu_supports("avx512f") && !(env && std::string_view(env) == "aten");
  }();
  return available;
}
#else
inline bool gemm_available() { return false; }
#endif

// c (=|+= with `accumulate`) a @ b for 2-D tensors whose rows may be strided (b and c with unit
// column stride), on the calling thread: the AVX-512 product for float32 where the CPU runs it,
// else at::mm_out / addmm_.
inline void mm_into(at::Tensor& c, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
#ifdef CFMTRAIN_GEMM_AVX512
  if (c.scalar_type() == at::kFloat && gemm_available() && b.stride(1) == 1 &&
      c.stride(1) == 1) {
    gemm(c.size(0), c.size(1), a.size(1), {a.data_ptr<float>(), a.stride(0), a.stride(1)},
         b.data_ptr<float>(), b.stride(0), c.data_ptr<float>(), c.stride(0), accumulate);
    return;
  }
#endif
  if (accumulate)
    c.addmm_(a, b);
  else
    at::mm_out(c, a, b);
}

}  // namespace cfmtrain::gemm
