/* SwiGLU's gate, as the reference computes it, for every instruction set: g / (1 + exp(-g)) in
 * double with libm's exp, rounded once to float. The vector SwiGLUs compute it in double lanes
 * with an exp of their own and keep a lane only where its rounding to float is sure to be this
 * one's (x86_avx2/ops.c says why): its 29 bits below a float's mantissa farther than
 * EI_SILU_MARGIN from 2^28 (the midpoint of two floats), |g| <= 80 and the value in the floats'
 * normal range; any other lane takes ei_silu. */
#ifndef EI_SILU_H
#define EI_SILU_H

#include <math.h>

#define EI_SILU_MARGIN 4096

static inline float ei_silu(float g) { return (float)(g / (1.0 + exp(-(double)g))); }

#endif
