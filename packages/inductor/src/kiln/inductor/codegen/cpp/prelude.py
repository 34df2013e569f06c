"""The C++ header every generated translation unit starts with: types, conversions, op helpers, RNG.
It ends with kiln.runtime's ``PCH_END`` line: g++ parses it once per compiler and flags (a precompiled
header in the compile cache), not once per library.

No torch headers: kernels see raw pointers; bf16 is carried as its 16 bits, fp16 as _Float16.
"""

from kiln.runtime import PCH_END

# Note: glibc declares SIMD variants of expf/logf/erff/tanhf/... (libmvec) only under __FAST_MATH__.
# Defining the macro (without -ffast-math's finite-math assumptions) lets g++ vectorise loops that call
# them while NaN/inf semantics stay IEEE; the library links -lmvec.
VECTOR_MATH = "#define __FAST_MATH__ 1\n"

PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>
#include <omp.h>
typedef uint16_t kiln_bf16;

static inline float kiln_bf16_to_f32(kiln_bf16 v) {
  uint32_t u = ((uint32_t)v) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline kiln_bf16 kiln_f32_to_bf16(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (kiln_bf16)((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return (kiln_bf16)(u >> 16);
}
// select first, NaN fix-up second: g++ turns these into max/min + blend; the nested form
// `(a != a) ? a : (a > b ? a : b)` compiled to data-dependent branches in loops it could not
// vectorise (a BN+ReLU+max-pool kernel: 4.2 ms on random data, 0.3 ms with these forms)
template <typename T> static inline T kiln_max(T a, T b) { T m = (a > b) ? a : b; return (a != a) ? a : m; }
template <typename T> static inline T kiln_min(T a, T b) { T m = (a < b) ? a : b; return (a != a) ? a : m; }
// floats: torch's div_floor, from the same fmod as a % b; floor(a / b) rounds the quotient first
// (1.0 // 0.1 is 9 in torch, floor(1.0f / 0.1f) is 10) and gives inf // 2 = inf, -1 // inf = -0
template <typename T> static inline T kiln_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    if (b == 0) return a / b;
    T m = std::fmod(a, b), d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;
    if (d == 0) return std::copysign(T(0), a / b);
    T f = std::floor(d);
    return (d - f > T(0.5)) ? f + 1 : f;
  } else { T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q; }
}
// shifts by any count as torch defines them (C++ leaves a count of the width or more undefined): a count
// outside [0, bits) shifts everything out, << gives 0 and >> the sign
template <typename T> static inline T kiln_shl(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return (b < 0 || b >= T(sizeof(T) * 8)) ? T(0) : (T)((U)a << b);
}
template <typename T> static inline T kiln_shr(T a, T b) {
  return (b < 0 || b >= T(sizeof(T) * 8)) ? (a < 0 ? T(-1) : T(0)) : (T)(a >> b);
}
template <typename T> static inline T kiln_truncdiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::trunc(a / b); } else { return a / b; }
}
template <typename T> static inline T kiln_mod(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    T r = std::fmod(a, b); if (r != 0 && ((r < 0) != (b < 0))) r += b; return r;
  } else { T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
}
template <typename T> static inline T kiln_fmod(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::fmod(a, b); } else { return a % b; }
}
template <typename T> static inline T kiln_pow(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::pow(a, b); }
  else { if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
         T r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
}
// sign(NaN) is 0 in torch (both comparisons are false), not NaN
template <typename T> static inline T kiln_sign(T a) { return (T)((T(0) < a) - (a < T(0))); }
template <typename T> static inline T kiln_sigmoid(T a) { return T(1) / (T(1) + std::exp(-a)); }
template <typename T> static inline T kiln_relu(T a) { T m = (a > T(0)) ? a : T(0); return (a != a) ? a : m; }
template <typename T> static inline bool kiln_isnan(T a) { return a != a; }

// Philox4x32-10 counter-based generator: (seed, offset) -> 4 x uint32, no state between calls.
static inline void kiln_philox(uint64_t seed, uint64_t offset, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)(offset >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int i = 0; i < 10; ++i) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}
static inline float kiln_rand(int64_t seed, int64_t offset) {
  uint32_t r[4]; kiln_philox((uint64_t)seed, (uint64_t)offset, r);
  return (float)(r[0] >> 8) * (1.0f / 16777216.0f);
}
static inline float kiln_randn(int64_t seed, int64_t offset) {
  uint32_t r[4]; kiln_philox((uint64_t)seed, (uint64_t)offset, r);
  float u1 = ((float)(r[0] >> 8) + 1.0f) * (1.0f / 16777217.0f);
  float u2 = (float)(r[1] >> 8) * (1.0f / 16777216.0f);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.283185307179586f * u2);
}
// Indices loaded from tensors (check_index): negative ones count from the end; one outside the dim is
// eager's IndexError. The kernel counts it here, keeps the last one, and reads or writes index 0 instead
// (never memory outside the tensor); whoever called the kernel compares the count before and after the
// call (kiln_index_errors: count, index, size) and raises.
// (exported under its C name by an asm label: only kernels are declared with C linkage in this file)
static int64_t kiln_index_state[3] = {0, 0, 0};
__attribute__((visibility("default"), used)) int64_t* kiln_index_errors_() __asm__("kiln_index_errors");
int64_t* kiln_index_errors_() { return kiln_index_state; }
static inline int64_t kiln_index_out_of_range(int64_t i, int64_t n) {
  __atomic_fetch_add(&kiln_index_state[0], 1, __ATOMIC_RELAXED);
  kiln_index_state[1] = i;
  kiln_index_state[2] = n;
  return 0;
}
static inline int64_t kiln_check_index(int64_t i, int64_t n) {
  const int64_t w = i < 0 ? i + n : i;
  return __builtin_expect(w < 0 || w >= n, 0) ? kiln_index_out_of_range(i, n) : w;
}
static inline int64_t kiln_check_index_nonneg(int64_t i, int64_t n) {  // embedding, gather, scatter
  return __builtin_expect(i < 0 || i >= n, 0) ? kiln_index_out_of_range(i, n) : i;
}
""" + PCH_END
