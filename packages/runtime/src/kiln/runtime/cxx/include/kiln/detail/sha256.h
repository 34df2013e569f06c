// SHA-256 (FIPS 180-4) for the integrity hashes of kiln packages. Why our own: libtorch's headers ship
// none, and linking OpenSSL only for this would add a dependency to every deployed program. On x86 CPUs
// with the SHA extensions the blocks go through them (~10x the portable loop: a 47 MB ResNet-18 weights
// file is checked at every load).
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(KILN_NO_SHA_NI)
#include <immintrin.h>
#define KILN_SHA_NI 1
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kiln {
namespace detail {

class Sha256 {
 public:
  Sha256() { reset(); }

  void update(const uint8_t* data, size_t n) {
    total_ += n;
    if (fill_) {
      size_t take = std::min(n, size_t(64) - fill_);
      for (size_t i = 0; i < take; ++i) buf_[fill_ + i] = data[i];
      fill_ += take; data += take; n -= take;
      if (fill_ == 64) { block(buf_); fill_ = 0; }
    }
    size_t blocks = n / 64;
    if (blocks) {
      blocks_(data, blocks);
      data += 64 * blocks;
      n -= 64 * blocks;
    }
    for (size_t i = 0; i < n; ++i) buf_[i] = data[i];
    fill_ += n;
  }

  std::string hex() {
    uint64_t bits = total_ * 8;
    uint8_t pad = 0x80;
    update(&pad, 1);
    uint8_t zero = 0;
    while (fill_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(bits >> (56 - 8 * i));
    update(len, 8);
    char out[65];
    for (int i = 0; i < 8; ++i) std::snprintf(out + 8 * i, 9, "%08x", h_[i]);
    return std::string(out, 64);
  }

 private:
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t fill_ = 0;
  uint64_t total_ = 0;

  void reset() {
    static const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    for (int i = 0; i < 8; ++i) h_[i] = init[i];
  }
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void blocks_(const uint8_t* p, size_t n) {
#ifdef KILN_SHA_NI
    static const bool ni = __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1");
    if (ni) return blocks_ni(h_, p, n);
#endif
    for (; n; --n, p += 64) block(p);
  }

#ifdef KILN_SHA_NI
  // Four rounds per sha256rnds2 pair; the message schedule by sha256msg1/msg2 (Intel's SHA extensions).
  __attribute__((target("sha,sse4.1,ssse3"))) static void blocks_ni(uint32_t* h, const uint8_t* p, size_t n) {
    const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)), 0xB1);  // CDAB
    __m128i s1 = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4)), 0x1B);  // EFGH
    __m128i s0 = _mm_alignr_epi8(tmp, s1, 8);  // ABEF
    s1 = _mm_blend_epi16(s1, tmp, 0xF0);  // CDGH
    for (; n; --n, p += 64) {
      const __m128i abef = s0, cdgh = s1;
      __m128i m[4];
      for (int g = 0; g < 16; ++g) {
        if (g < 4) {
          m[g] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), mask);
        } else {
          __m128i x = _mm_sha256msg1_epu32(m[g & 3], m[(g + 1) & 3]);
          x = _mm_add_epi32(x, _mm_alignr_epi8(m[(g + 3) & 3], m[(g + 2) & 3], 4));
          m[g & 3] = _mm_sha256msg2_epu32(x, m[(g + 3) & 3]);
        }
        __m128i w = _mm_add_epi32(m[g & 3], _mm_loadu_si128(reinterpret_cast<const __m128i*>(k_() + 4 * g)));
        s1 = _mm_sha256rnds2_epu32(s1, s0, w);
        s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(w, 0x0E));
      }
      s0 = _mm_add_epi32(s0, abef);
      s1 = _mm_add_epi32(s1, cdgh);
    }
    tmp = _mm_shuffle_epi32(s0, 0x1B);  // FEBA
    s1 = _mm_shuffle_epi32(s1, 0xB1);  // DCHG
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h), _mm_blend_epi16(tmp, s1, 0xF0));  // DCBA
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), _mm_alignr_epi8(s1, tmp, 8));  // HGFE
  }
#endif

  static const uint32_t* k_() {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    return k;
  }

  void block(const uint8_t* p) {
    const uint32_t* k = k_();
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d; h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
  }
};

inline std::string sha256_hex(const uint8_t* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.hex();
}

}  // namespace detail
}  // namespace kiln
