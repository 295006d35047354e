#include "CFramingBaseline.h"

/* RFC 1662 appendix C.2: the table for the 16-bit FCS (generated, as the RFC shows how). */
static uint16_t fcstab[256];
static int fcstab_ready;

static void fcs_init(void) {
    if (fcstab_ready) return;
    for (unsigned b = 0; b < 256; b++) {
        unsigned v = b;
        for (int i = 8; i--;) v = v & 1 ? (v >> 1) ^ 0x8408 : v >> 1;
        fcstab[b] = (uint16_t)v;
    }
    fcstab_ready = 1;
}

#define PPPINITFCS16 0xffff
#define PPPGOODFCS16 0xf0b8
#define FCS16(fcs, c) (((fcs) >> 8) ^ fcstab[((fcs) ^ (c)) & 0xff])

static inline int needs_escape(uint8_t c, uint32_t accm) {
    return c == 0x7e || c == 0x7d || (c < 0x20 && (accm & (1u << c)));
}

static inline uint8_t *put(uint8_t *o, uint8_t c, uint32_t accm) {
    if (needs_escape(c, accm)) {
        *o++ = 0x7d;
        *o++ = c ^ 0x20;
    } else {
        *o++ = c;
    }
    return o;
}

size_t cbaseline_encode(const uint8_t *info, size_t length, size_t count, uint16_t protocol,
                        uint32_t accm, uint8_t *out) {
    fcs_init();
    uint8_t *o = out;
    *o++ = 0x7e;
    for (size_t f = 0; f < count; f++) {
        const uint8_t *p = info + f * length;
        uint16_t fcs = PPPINITFCS16;
        uint8_t header[4] = {0xff, 0x03, (uint8_t)(protocol >> 8), (uint8_t)protocol};
        for (int i = 0; i < 4; i++) {
            fcs = FCS16(fcs, header[i]);
            o = put(o, header[i], accm);
        }
        for (size_t i = 0; i < length; i++) {
            fcs = FCS16(fcs, p[i]);
            o = put(o, p[i], accm);
        }
        fcs ^= 0xffff;
        o = put(o, fcs & 0xff, accm);
        o = put(o, fcs >> 8, accm);
        *o++ = 0x7e;
    }
    return (size_t)(o - out);
}

void cbaseline_decoder_init(struct cbaseline_decoder *d, uint8_t *buffer, size_t capacity, uint32_t raccm) {
    fcs_init();
    d->buffer = buffer;
    d->capacity = capacity;
    d->length = 0;
    d->fcs = PPPINITFCS16;
    d->escaped = 0;
    d->overflow = 0;
    d->raccm = raccm;
    d->frames = 0;
    d->bad_fcs = 0;
    d->information_bytes = 0;
}

void cbaseline_decode(struct cbaseline_decoder *d, const uint8_t *in, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t c = in[i];
        if (c == 0x7e) {
            if (d->length >= 4 && !d->escaped && !d->overflow) {
                if (d->fcs == PPPGOODFCS16) {
                    d->frames++;
                    d->information_bytes += d->length - 4 - 2;
                } else {
                    d->bad_fcs++;
                }
            }
            d->length = 0;
            d->fcs = PPPINITFCS16;
            d->escaped = 0;
            d->overflow = 0;
            continue;
        }
        if (c < 0x20 && (d->raccm & (1u << c))) continue;
        if (c == 0x7d) {
            d->escaped = 1;
            continue;
        }
        if (d->escaped) {
            c ^= 0x20;
            d->escaped = 0;
        }
        if (d->length < d->capacity) {
            d->buffer[d->length++] = c;
            d->fcs = FCS16(d->fcs, c);
        } else {
            d->overflow = 1;
        }
    }
}
