// Sums as the CPU engine's: it adds exact terms in double and rounds once to float. Here a
// float pair (hi, lo) carries about 48 bits, built from error-free transformations whose
// every operation is 'precise' (no contraction or reassociation may change a rounding), so
// the float a sum rounds to is the CPU's but where the exact sum lies within about 2^-47 of
// a rounding boundary. Products are split (Veltkamp and Dekker) rather than fused: Vulkan
// does not promise that fma() rounds once.

// s + e == a + b exactly (Knuth's TwoSum)
void two_sum(float a, float b, out float s, out float e) {
    precise float ss = a + b;
    precise float bb = ss - a;
    precise float ee = (a - (ss - bb)) + (b - bb);
    s = ss;
    e = ee;
}

// hi + lo == a, each half of a's 24 bits
void split_float(float a, out float hi, out float lo) {
    precise float c = 4097.0 * a;
    precise float h = c - (c - a);
    precise float l = a - h;
    hi = h;
    lo = l;
}

// p + e == a * b exactly (Dekker's TwoProduct)
void two_prod(float a, float b, out float p, out float e) {
    float ah, al, bh, bl;
    split_float(a, ah, al);
    split_float(b, bh, bl);
    precise float pp = a * b;
    precise float ee = ((ah * bh - pp) + ah * bl + al * bh) + al * bl;
    p = pp;
    e = ee;
}

// (hi, lo) += x
void ff_add(inout float hi, inout float lo, float x) {
    float s, e;
    two_sum(hi, x, s, e);
    precise float l = lo + e;
    hi = s;
    lo = l;
}

// (hi, lo) += (x_hi, x_lo)
void ff_add2(inout float hi, inout float lo, float x_hi, float x_lo) {
    float s, e;
    two_sum(hi, x_hi, s, e);
    precise float l = (lo + x_lo) + e;
    hi = s;
    lo = l;
}

// (hi, lo) += a * b * n for floats a, b and an integer n below 2^24 in magnitude: a * b is
// kept whole, its product with n to within 2^-48 of the term
void ff_add_scaled(inout float hi, inout float lo, float a, float b, int n) {
    float p, e, q, f;
    two_prod(a, b, p, e);
    two_prod(p, float(n), q, f);
    precise float rest = f + e * float(n);
    ff_add2(hi, lo, q, rest);
}

// the float nearest hi + lo
float ff_round(float hi, float lo) {
    precise float r = hi + lo;
    return r;
}

// a / b rounded to nearest (Vulkan's division may be 2.5 ulp off): the quotient corrected by
// its exact remainder
float exact_div(float a, float b) {
    const float q = a / b;
    float p, e;
    two_prod(q, b, p, e);
    precise float r = (a - p) - e;
    precise float c = q + r / b;
    return r == 0.0 ? q : c; // and a zero keeps its sign
}

// (hi + lo) / n rounded to nearest, for an integer n
float ff_div(float hi, float lo, float n) {
    const float q = hi / n;
    float p, e;
    two_prod(q, n, p, e);
    precise float r = ((hi - p) - e) + lo;
    precise float c = q + r / n;
    return r == 0.0 ? q : c;
}

// sqrt(a) rounded to nearest (Vulkan's may be off): corrected by the exact residual
float exact_sqrt(float a) {
    const float s = sqrt(a);
    float p, e;
    two_prod(s, s, p, e);
    precise float r = (a - p) - e;
    precise float c = s + r / (2.0 * s);
    return a > 0.0 ? c : s;
}

// (ah + al) * (bh + bl) as a float pair, to about 2^-46
void ff_mul(float ah, float al, float bh, float bl, out float h, out float l) {
    float p, e;
    two_prod(ah, bh, p, e);
    precise float c = e + (ah * bl + al * bh);
    two_sum(p, c, h, l);
}

// (ah + al) / (bh + bl) rounded to float: the quotient corrected by its remainder
float ff_quotient(float ah, float al, float bh, float bl) {
    const float q = ah / bh;
    float p, e;
    two_prod(q, bh, p, e);
    precise float r = (((ah - p) - e) + al) - q * bl;
    precise float c = q + r / bh;
    return r == 0.0 ? q : c;
}

// 1 / k! for k = 0 .. 12 as float pairs (hi, lo), and ln 2 as 16 + 16 bits and a float
const uint EXP_COEF[26] = uint[26](0x3f800000u, 0x00000000u, 0x3f800000u, 0x00000000u, 0x3f000000u, 0x00000000u,
    0x3e2aaaabu, 0xb1aaaaabu, 0x3d2aaaabu, 0xb0aaaaabu, 0x3c088889u, 0xafeeeeefu, 0x3ab60b61u, 0xae13e93fu,
    0x39500d01u, 0xac3fcbfdu, 0x37d00d01u, 0xaabfcbfdu, 0x3638ef1du, 0x292ad8e6u, 0x3493f27eu, 0xa808760au,
    0x32d7322bu, 0x25fea89cu, 0x310f76c7u, 0x24ff8d89u);
#define EXP_LN2_1 0x3f317200u
#define EXP_LN2_2 0x35bfbf00u
#define EXP_LN2_3 0xad630865u
#define EXP_LOG2E 0x3fb8aa3bu

// exp(x) for x <= 0 as a float pair within about 2^-44 of it, as simd/common/ei_exp.h's
// double is within an ulp of it: x = n ln 2 + r (r exact to about 2^-56), exp(r) by Taylor to
// r^12 (|r| <= 0.347: the next term is below 2^-47) in float pairs, times 2^n. Below the
// floats' range (exp(x) < 2^-126) the pair loses bits; 0 below -104.
void exp_pair(float x, out float hi, out float lo) {
    hi = 0.0;
    lo = 0.0;
    if (!(x >= -104.0)) return;
    const float n = roundEven(x * uintBitsToFloat(EXP_LOG2E));
    precise float r0 = x - n * uintBitsToFloat(EXP_LN2_1); // n has 8 bits, ln2_1 16: exact, and so is the difference
    float rh, rl;
    two_sum(r0, -(n * uintBitsToFloat(EXP_LN2_2)), rh, rl);
    precise float rl2 = rl - n * uintBitsToFloat(EXP_LN2_3);
    float ph = uintBitsToFloat(EXP_COEF[24]), pl = uintBitsToFloat(EXP_COEF[25]);
    for (int k = 11; k >= 0; k--) {
        float mh, ml;
        ff_mul(ph, pl, rh, rl2, mh, ml);
        ff_add2(mh, ml, uintBitsToFloat(EXP_COEF[2 * k]), uintBitsToFloat(EXP_COEF[2 * k + 1]));
        two_sum(mh, ml, ph, pl);
    }
    const int e = int(n), e1 = e / 2; // two powers of two: 2^n alone may be subnormal
    hi = ldexp(ldexp(ph, e1), e - e1);
    lo = ldexp(ldexp(pl, e1), e - e1);
}

// tanh(t) rounded to float as the CPU's (float)tanh((double)t): an odd series below 2^-10
// (its next term is 2^-80 of it), else (1 - e^-2|t|) / (1 + e^-2|t|) in float pairs
float exact_tanh(float t) {
    const float a = abs(t);
    if (!(a >= 0.0009765625)) { // and NaN
        float a2h, a2l, ph, pl;
        two_prod(a, a, a2h, a2l);
        ph = -17.0 / 315.0; // the next terms' sizes leave these roundings far below the float's
        pl = 0.0;
        ff_mul(ph, pl, a2h, a2l, ph, pl);
        ff_add2(ph, pl, 2.0 / 15.0, 0.0);
        ff_mul(ph, pl, a2h, a2l, ph, pl);
        ff_add2(ph, pl, -0.3333333432674408, 9.934108e-9); // -1/3 as a float pair
        ff_mul(ph, pl, a2h, a2l, ph, pl);
        ff_add2(ph, pl, 1.0, 0.0);
        ff_mul(ph, pl, t, 0.0, ph, pl);
        return ff_round(ph, pl);
    }
    float wh, wl, nh, nl, dh, dl;
    exp_pair(-2.0 * a, wh, wl);
    two_sum(1.0, -wh, nh, nl);
    two_sum(1.0, wh, dh, dl);
    precise float nl2 = nl - wl, dl2 = dl + wl;
    const float r = ff_quotient(nh, nl2, dh, dl2);
    return t < 0.0 ? -r : r;
}

// SiLU, g / (1 + e^-g), rounded to float as simd/common/silu.h's double: for g < 0 as
// g e^g / (1 + e^g), so that exp_pair's argument is never positive
float exact_silu(float g) {
    float wh, wl, dh, dl;
    if (g >= 0.0) {
        exp_pair(-g, wh, wl);
        two_sum(1.0, wh, dh, dl);
        precise float dl2 = dl + wl;
        return ff_quotient(g, 0.0, dh, dl2);
    }
    exp_pair(g, wh, wl);
    float nh, nl;
    ff_mul(g, 0.0, wh, wl, nh, nl);
    two_sum(1.0, wh, dh, dl);
    precise float dl2 = dl + wl;
    return ff_quotient(nh, nl, dh, dl2);
}
