// fp32 -> fp16 bits as the CPU's ei_fp32_to_fp16 makes them: rounded to nearest even, NaN
// kept quiet, past 65504 infinite (packHalf2x16 leaves the rounding to the driver)
uint half_bits(float v) {
    const uint b = floatBitsToUint(v), sign = (b >> 16) & 0x8000u, a = b & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00u | ((a >> 13) & 0x3FFu);
    if (a >= 0x477FF000u) return sign | 0x7C00u;
    if (a >= 0x38800000u) {
        const uint r = a - 0x38000000u, rem = r & 0x1FFFu;
        uint h = r >> 13;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h += 1u;
        return sign | h;
    }
    return sign | uint(roundEven(uintBitsToFloat(a) * 16777216.0));
}
