#ifndef CFRAMINGBASELINE_H
#define CFRAMINGBASELINE_H
#include <stddef.h>
#include <stdint.h>

/* A plain C implementation of RFC 1662 async framing, written the way the RFC presents it:
   one byte at a time, FCS-16 by the 256-entry table of RFC 1662 appendix C.2.
   It is the reference the framing benchmark measures our Swift framer against. */

/* Frames `count` information fields of `length` bytes each (at `info`, back to back) as
   protocol `protocol` with FF 03, escaping control characters set in `accm` plus 0x7D/0x7E.
   Consecutive frames share one flag. Returns bytes written to `out`. */
size_t cbaseline_encode(const uint8_t *info, size_t length, size_t count, uint16_t protocol,
                        uint32_t accm, uint8_t *out);

/* Decoder state for a stream fed in chunks. */
struct cbaseline_decoder {
    uint8_t *buffer;
    size_t capacity;
    size_t length;
    uint16_t fcs;
    int escaped;
    int overflow;
    uint32_t raccm;
    size_t frames;
    size_t bad_fcs;
    size_t information_bytes;
};

void cbaseline_decoder_init(struct cbaseline_decoder *d, uint8_t *buffer, size_t capacity, uint32_t raccm);
/* Decodes a chunk; counts good frames and the bytes of their information fields. */
void cbaseline_decode(struct cbaseline_decoder *d, const uint8_t *in, size_t n);

#endif
