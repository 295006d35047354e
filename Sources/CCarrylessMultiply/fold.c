// Folding for reflected CRCs with carry-less multiplication, after Gopal et al., "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Intel, 2009). A block X
// followed, d bits later, by the rest is replaced by X * x^d mod P spread over the next block:
// the message stays congruent modulo P, so its CRC is unchanged. The caller finishes the last
// 16 bytes and the tail with its table.
#include "CCarrylessMultiply.h"

#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

int pb_carryless_multiply_available(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    // ECX bit 1: PCLMULQDQ. SSE2 is part of x86-64.
    if ((c & bit_PCLMUL) == 0) return 0;
#if defined(__AVX__)
    // Built for AVX, the compiler emits the VEX form, which needs the OS to save AVX state.
    if ((c & bit_OSXSAVE) == 0 || (c & bit_AVX) == 0) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6) != 6) return 0;
#endif
    return 1;
}

__attribute__((target("pclmul,sse2")))
static inline __m128i fold(__m128i x, __m128i k) {
    // Low word by the first constant, high word by the second.
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

__attribute__((target("pclmul,sse2")))
size_t pb_reflected_crc_fold(uint32_t register_, const uint8_t *bytes, size_t length,
                             const uint64_t constants[4], uint8_t folded[16]) {
    if (length < 64) return 0;
    const __m128i k512 = _mm_set_epi64x((long long)constants[1], (long long)constants[0]);
    const __m128i k128 = _mm_set_epi64x((long long)constants[3], (long long)constants[2]);
    __m128i x0 = _mm_loadu_si128((const __m128i *)(bytes + 0));
    __m128i x1 = _mm_loadu_si128((const __m128i *)(bytes + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(bytes + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(bytes + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)register_));
    size_t done = 64;
    // Four independent chains, each folded 512 bits ahead onto its next block.
    while (length - done >= 64) {
        const uint8_t *p = bytes + done;
        x0 = _mm_xor_si128(fold(x0, k512), _mm_loadu_si128((const __m128i *)(p + 0)));
        x1 = _mm_xor_si128(fold(x1, k512), _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = _mm_xor_si128(fold(x2, k512), _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = _mm_xor_si128(fold(x3, k512), _mm_loadu_si128((const __m128i *)(p + 48)));
        done += 64;
    }
    // The four into one, 128 bits at a time, then the remaining whole blocks.
    x1 = _mm_xor_si128(fold(x0, k128), x1);
    x2 = _mm_xor_si128(fold(x1, k128), x2);
    x3 = _mm_xor_si128(fold(x2, k128), x3);
    while (length - done >= 16) {
        x3 = _mm_xor_si128(fold(x3, k128), _mm_loadu_si128((const __m128i *)(bytes + done)));
        done += 16;
    }
    _mm_storeu_si128((__m128i *)folded, x3);
    return done;
}

#else

int pb_carryless_multiply_available(void) { return 0; }

size_t pb_reflected_crc_fold(uint32_t register_, const uint8_t *bytes, size_t length,
                             const uint64_t constants[4], uint8_t folded[16]) {
    (void)register_; (void)bytes; (void)length; (void)constants;
    memset(folded, 0, 16);
    return 0;
}

#endif
