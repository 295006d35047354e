#ifndef PPPBRIDGE_CCARRYLESSMULTIPLY_H
#define PPPBRIDGE_CCARRYLESSMULTIPLY_H

#include <stddef.h>
#include <stdint.h>

/// Whether this CPU multiplies without carries (x86-64 PCLMULQDQ, and the AVX state the
/// instruction's VEX form needs when this file is built for AVX); when not, the fold below
/// must not be called. Always 0 on other architectures.
int pb_carryless_multiply_available(void);

/// Folds `bytes` (`length` >= 64) for a reflected CRC (RFC 1662's FCS-16 and FCS-32) down to
/// 16 bytes congruent to them modulo the CRC's polynomial, with `register_` (the CRC register
/// so far, LSB first) added into the first bytes. Folds whole 16-byte blocks only: returns how
/// many bytes it consumed (a multiple of 16, at least 64, at most `length`; 0 for fewer than
/// 64 bytes, and always 0 where the CPU cannot multiply without carries) and writes the 16
/// folded bytes to `folded`. The register over `folded` from zero, then over the bytes not
/// consumed, is the register over `bytes` from `register_`.
///
/// `constants` are x^575, x^511, x^191 and x^127 modulo the polynomial, each bit-reflected
/// into a 64-bit word (the coefficient of x^j at bit 63 - j): the distances of a 512-bit and a
/// 128-bit fold, less one for the product's reflected alignment.
size_t pb_reflected_crc_fold(uint32_t register_, const uint8_t *bytes, size_t length,
                             const uint64_t constants[4], uint8_t folded[16]);

#endif
