#include "CVectorScan.h"

static unsigned plain_prefix(const uint8_t *b, unsigned count, int controls) {
    for (unsigned i = 0; i < count; i++) {
        if (b[i] == 0x7E || b[i] == 0x7D || (controls && b[i] < 0x20)) return i;
    }
    return count;
}

unsigned pb_plain_prefix16_reference(const void *p, int controls) { return plain_prefix(p, 16, controls); }

unsigned pb_plain_prefix32_reference(const void *p, int controls) { return plain_prefix(p, 32, controls); }
