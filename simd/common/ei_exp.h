/* edgeinfer's exp in double, the softmax's (attn_softmax.h): one fixed sequence of IEEE
 * operations, separate multiplies and adds with no fused ones (the build has
 * -ffp-contract=off), so the scalar reference, every instruction set's vectors and the numpy
 * engine (edgeinfer/engines/reference.py: ei_exp) compute it bit for bit alike. libm's exp is
 * a call a value, which no vector can match bit for bit; this one is within 1 ulp of it
 * (tests/simd/test_native_kernels.py measures it against math.exp).
 *
 * x = n ln2 + r: n = x log2(e) rounded to an integer by adding 1.5 * 2^52 (ties to even);
 * r = (x - n ln2_hi) - n ln2_lo, ln2_hi's 42 bits times n exact; exp(r) = the Taylor series
 * to r^13 by Horner (|r| <= 0.347: the next term is below 5e-18); times 2^n as two powers of
 * two, 2^floor(n / 2) and then 2^(n - floor(n / 2)), so that a subnormal result is rounded
 * once, by the second. Below -746: 0; above 710: infinity; a NaN: itself. */
#ifndef EI_EXP_H
#define EI_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define EI_EXP_LOG2E 0x1.71547652b82fep+0
#define EI_EXP_SHIFTER 0x1.8p+52 /* adding it rounds to an integer, held in the low bits */
#define EI_EXP_LN2_HI 0x1.62e42fefa38p-1
#define EI_EXP_LN2_LO 0x1.ef35793c7673p-45
#define EI_EXP_MIN (-746.0)
#define EI_EXP_MAX 710.0
#define EI_EXP_DEGREE 13

/* 1 / k! for k = 0 .. EI_EXP_DEGREE, rounded to double */
static const double ei_exp_coef[EI_EXP_DEGREE + 1] = {
    1.0, 1.0, 0x1p-1, 0x1.5555555555555p-3, 0x1.5555555555555p-5, 0x1.1111111111111p-7,
    0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-16, 0x1.71de3a556c734p-19,
    0x1.27e4fb7789f5cp-22, 0x1.ae64567f544e4p-26, 0x1.1eed8eff8d898p-29, 0x1.6124613a86d09p-33};

/* 2^k for -1022 <= k <= 1023 */
static inline double ei_exp_pow2(int64_t k) {
    const uint64_t bits = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &bits, 8);
    return d;
}

static inline double ei_exp(double x) {
    if (!(x >= EI_EXP_MIN)) return x != x ? x : 0.0;
    if (x > EI_EXP_MAX) return (double)INFINITY;
    const double nd = x * EI_EXP_LOG2E + EI_EXP_SHIFTER;
    const double n = nd - EI_EXP_SHIFTER;
    const double r = (x - n * EI_EXP_LN2_HI) - n * EI_EXP_LN2_LO;
    double p = ei_exp_coef[EI_EXP_DEGREE];
    for (int k = EI_EXP_DEGREE - 1; k >= 0; k--) p = p * r + ei_exp_coef[k];
    const int64_t ni = (int64_t)n, n1 = ((ni + 2048) >> 1) - 1024; /* floor(n / 2), n + 2048 > 0 */
    return (p * ei_exp_pow2(n1)) * ei_exp_pow2(ni - n1);
}

#endif
