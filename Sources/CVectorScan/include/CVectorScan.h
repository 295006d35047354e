#ifndef PPPBRIDGE_CVECTORSCAN_H
#define PPPBRIDGE_CVECTORSCAN_H

// Sixteen bytes tested at once against the bytes an asynchronous HDLC link treats specially
// (RFC 1662 §4.2): the flag 0x7E, the control escape 0x7D and, when the ACCM is all ones,
// every control character below 0x20. One compare per value and one move of the lanes' top
// bits to a mask: Swift's portable vectors give the compares but reduce the lanes through
// several more instructions, and the framer runs this once per sixteen bytes.
//
// Static inline so Swift inlines it into the framer's loop; built where the vector unit is
// part of the architecture's baseline (SSE2 on x86-64). Elsewhere the framer keeps its
// portable form.

#include <stdint.h>

#if defined(__x86_64__)
#include <emmintrin.h>

/// How many of the sixteen bytes at `p` come before the first special one: 16 when none is.
/// `controls` nonzero: bytes below 0x20 are special too.
static inline __attribute__((always_inline)) unsigned pb_plain_prefix16(const void *p, int controls) {
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i m = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x7E)), _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7D)));
    if (controls) {
        // Unsigned v <= 0x1F exactly where min(v, 0x1F) == v.
        m = _mm_or_si128(m, _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1F)), v));
    }
    // Bit 16 set: a block with no special byte counts 16.
    return (unsigned)__builtin_ctz((unsigned)_mm_movemask_epi8(m) | 0x10000u);
}
/// The same over thirty-two bytes at `p`: 32 when none is special. Both halves' masks are
/// joined and tested and counted once, so a long plain run costs one test per 32 bytes.
static inline __attribute__((always_inline)) unsigned pb_plain_prefix32(const void *p, int controls) {
    __m128i v0 = _mm_loadu_si128((const __m128i *)p);
    __m128i v1 = _mm_loadu_si128((const __m128i *)p + 1);
    __m128i flag = _mm_set1_epi8(0x7E), escape = _mm_set1_epi8(0x7D);
    __m128i m0 = _mm_or_si128(_mm_cmpeq_epi8(v0, flag), _mm_cmpeq_epi8(v0, escape));
    __m128i m1 = _mm_or_si128(_mm_cmpeq_epi8(v1, flag), _mm_cmpeq_epi8(v1, escape));
    if (controls) {
        __m128i top = _mm_set1_epi8(0x1F);
        m0 = _mm_or_si128(m0, _mm_cmpeq_epi8(_mm_min_epu8(v0, top), v0));
        m1 = _mm_or_si128(m1, _mm_cmpeq_epi8(_mm_min_epu8(v1, top), v1));
    }
    // Bit 32 set: a block with no special byte counts 32.
    uint64_t mask = (uint64_t)(unsigned)_mm_movemask_epi8(m0) | (uint64_t)(unsigned)_mm_movemask_epi8(m1) << 16;
    return (unsigned)__builtin_ctzll(mask | (1ull << 32));
}
#define PB_VECTOR_SCAN 1
#endif

/// The same test out of line, on every architecture (a scalar loop where there is no vector
/// form): what tests compare the inline form with.
unsigned pb_plain_prefix16_reference(const void *p, int controls);
unsigned pb_plain_prefix32_reference(const void *p, int controls);

#endif
