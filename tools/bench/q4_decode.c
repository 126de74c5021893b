// The Q4B32 decode tiles' block steps (AVX-512, and with `avx2` the AVX2 one), and variants
// of them, timed on one thread: the program behind "where the AVX-512 Q4B32 decode's time
// goes" (2026-12-05) and "the AVX2 Q4B32 decode step" (2026-12-05, morning) in
// docs/BENCHMARKS.md.
//
//   gcc -O2 -o q4_decode tools/bench/q4_decode.c && ./q4_decode ROWS PASSES [avx2 | spread]
//
// ROWS rows of 2,048 columns (18-byte blocks: a binary16 scale, then 16 bytes of nibbles), eight
// rows per tile against one vector, as the engine's decode tile (src/kernels/avx512.rs) computes
// them; 256 rows (295 KB) stay in L2, 65,536 come from DRAM. Each variant prints its best pass in
// GB/s of weights and one output, so that the variants that compute the same products can be
// seen to agree (c and f compute something else: they only price an instruction).
//   a  the engine's step: scale table (16 levels x scale, one multiply), bytes widened to 32-bit
//      lanes, two vpermps (low nibble, and the lane shifted right by 4), two FMAs
//   b  the 16 bytes broadcast to four lanes and two variable shifts instead of the widening and
//      the shift (the weights come out in another lane order, which the inputs would have to
//      follow; here they do not, so only its speed means anything)
//   c  a without the table's multiply (wrong values: the multiply's cost)
//   d  the levels unscaled, the block's two products summed, then one FMA with the scale
//   f  a with one vpermps (wrong values: a permutation's cost)
//   g  a with the scaled table read from a 4 MiB table of the 16 levels times every binary16
//      scale (one aligned 64-byte load instead of the multiply; the same bits as a)
// With `spread` instead of `avx2`, the blocks' scales take 4,096 values over four binades
// instead of 1,024 in one (g's table lines then compete with the weights for L2).
// With `avx2`: four rows per tile, as src/kernels/avx2.rs's decode tile, inputs in its order
// (by parity within each half of a block):
//   a  the engine's step: each nibble made a float by the exponent trick (xor, subtract),
//      times the scale, then four FMAs into the row's accumulator
//   b  the levels unscaled: the block's four products summed, then one FMA with the scale
//   c  a with two accumulators per row (shorter dependency chains)
//   d  b with the four products summed as two pairs
//   e  b with vcvtdq2ps instead of the exponent trick and no offset (wrong values: its cost)
//   f  e made right: nibbles xor 8 (unsigned levels 0..15), the -8 offset folded into the
//      block's first FMA from -8 x the block's inputs, summed lane-wise once per vector
//   g  f for the even nibbles, b for the odd ones
//   h  a's values made another way (the engine's step since 2026-12-05): the payload broadcast
//      to both lanes, its nibbles flipped in bit 3 and a magic byte blended in, one vpshufb per
//      half putting byte j at bits 15..8 of lane j and the magic at bits 31..24, a mask per
//      nibble (2^15 + u, 2^11 + u as floats), one FMA with the scale against -(2^e + 8) x the
//      scale, here two multiplies per block
//   i  h with the two offsets read from tables indexed by the scale's bits (as the engine)
// a, h and i print the same hash of all the rows' outputs: the same bits.
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COLS 2048
#define BLOCKS (COLS / 32)
#define ROW_BYTES (BLOCKS * 18)
#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

static float f16_to_f32[65536];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

TARGET static inline __m512 scale(const uint8_t *p) {
    uint16_t bits;
    memcpy(&bits, p, 2);
    return _mm512_set1_ps(f16_to_f32[bits]);
}

TARGET static inline __m512 levels(void) {
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
}

// One variant: the body (the last argument) computes acc[i] for block pointer p and inputs xe, xo (positions by parity).
#define VARIANT(NAME, SETUP, ...)                                                           \
    TARGET static void NAME(const uint8_t *w, const float *x, int rows, float *y) {       \
        const __m512 lv = levels();                                                        \
        SETUP                                                                              \
        for (int r = 0; r < rows; r += 8) {                                                \
            __m512 acc[8];                                                                 \
            for (int i = 0; i < 8; i++) acc[i] = _mm512_setzero_ps();                      \
            for (int b = 0; b < BLOCKS; b++) {                                             \
                __m512 xe = _mm512_loadu_ps(x + b * 32), xo = _mm512_loadu_ps(x + b * 32 + 16); \
                for (int i = 0; i < 8; i++) {                                              \
                    const uint8_t *p = w + (size_t)(r + i) * ROW_BYTES + b * 18;           \
                    __VA_ARGS__                                                            \
                }                                                                          \
            }                                                                              \
            for (int i = 0; i < 8; i++) y[r + i] = _mm512_reduce_add_ps(acc[i]);           \
        }                                                                                  \
    }

VARIANT(step_a, , {
    __m512 t = _mm512_mul_ps(lv, scale(p));
    __m512i by = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 2)));
    __m512 e = _mm512_permutexvar_ps(by, t), o = _mm512_permutexvar_ps(_mm512_srli_epi32(by, 4), t);
    acc[i] = _mm512_fmadd_ps(o, xo, _mm512_fmadd_ps(e, xe, acc[i]));
})

VARIANT(step_b,
    const __m512i se = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
    const __m512i so = _mm512_add_epi32(se, _mm512_set1_epi32(4));, {
    __m512 t = _mm512_mul_ps(lv, scale(p));
    __m512i by = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p + 2)));
    __m512 e = _mm512_permutexvar_ps(_mm512_srlv_epi32(by, se), t), o = _mm512_permutexvar_ps(_mm512_srlv_epi32(by, so), t);
    acc[i] = _mm512_fmadd_ps(o, xo, _mm512_fmadd_ps(e, xe, acc[i]));
})

VARIANT(step_c, , {
    __m512i by = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 2)));
    __m512 e = _mm512_permutexvar_ps(by, lv), o = _mm512_permutexvar_ps(_mm512_srli_epi32(by, 4), lv);
    acc[i] = _mm512_fmadd_ps(o, xo, _mm512_fmadd_ps(e, xe, acc[i]));
})

VARIANT(step_d, , {
    __m512i by = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 2)));
    __m512 e = _mm512_permutexvar_ps(by, lv), o = _mm512_permutexvar_ps(_mm512_srli_epi32(by, 4), lv);
    acc[i] = _mm512_fmadd_ps(_mm512_fmadd_ps(o, xo, _mm512_mul_ps(e, xe)), scale(p), acc[i]);
})

VARIANT(step_f, , {
    __m512 t = _mm512_mul_ps(lv, scale(p));
    __m512i by = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 2)));
    __m512 e = _mm512_permutexvar_ps(by, t), o = _mm512_castsi512_ps(_mm512_srli_epi32(by, 4));
    acc[i] = _mm512_fmadd_ps(o, xo, _mm512_fmadd_ps(e, xe, acc[i]));
})

static float *SCALED; // g: 65,536 x 16, the levels times each binary16 scale
VARIANT(step_g, (void)lv;, {
    uint16_t bits;
    memcpy(&bits, p, 2);
    __m512 t = _mm512_load_ps(SCALED + (size_t)bits * 16);
    __m512i by = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 2)));
    __m512 e = _mm512_permutexvar_ps(by, t), o = _mm512_permutexvar_ps(_mm512_srli_epi32(by, 4), t);
    acc[i] = _mm512_fmadd_ps(o, xo, _mm512_fmadd_ps(e, xe, acc[i]));
})

// The AVX2 tile's variants (`avx2`).
#define TARGET2 __attribute__((target("avx2,fma,f16c")))
#define R 4

static float NX[BLOCKS * 8]; // f and g: -8 x the inputs of the lanes' unsigned nibbles, per block

TARGET2 static inline float scale2(const uint8_t *p) {
    uint16_t bits;
    memcpy(&bits, p, 2);
    return f16_to_f32[bits];
}

TARGET2 static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

// One variant: the body computes acc[i][..] for block pointer p and inputs x0..x3.
#define VARIANT2(NAME, NACC, ...)                                                                   \
    TARGET2 static void NAME(const uint8_t *w, const float *x, int rows, float *y) {                \
        const __m256i m = _mm256_set1_epi32(0x0F), magic = _mm256_set1_epi32(0x4B000008);           \
        const __m256 fm = _mm256_set1_ps(8388616.0f);                                               \
        (void)m; (void)magic; (void)fm;                                                             \
        for (int r = 0; r < rows; r += R) {                                                         \
            __m256 acc[R][NACC];                                                                    \
            for (int i = 0; i < R; i++)                                                             \
                for (int k = 0; k < NACC; k++) acc[i][k] = _mm256_setzero_ps();                     \
            for (int b = 0; b < BLOCKS; b++) {                                                      \
                const float *xb = x + b * 32;                                                       \
                __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);                      \
                __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);                \
                for (int i = 0; i < R; i++) {                                                       \
                    const uint8_t *p = w + (size_t)(r + i) * ROW_BYTES + b * 18;                    \
                    __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2)));   \
                    __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 10)));  \
                    __VA_ARGS__                                                                     \
                }                                                                                   \
            }                                                                                       \
            for (int i = 0; i < R; i++) {                                                           \
                __m256 s = acc[i][0];                                                               \
                for (int k = 1; k < NACC; k++) s = _mm256_add_ps(s, acc[i][k]);                     \
                y[r + i] = hsum8(s);                                                                \
            }                                                                                       \
        }                                                                                           \
    }

#define LEVEL(v) _mm256_sub_ps(_mm256_castsi256_ps(_mm256_xor_si256(v, magic)), fm)
#define EVEN(v) _mm256_and_si256(v, m)
#define ODD(v) _mm256_srli_epi32(v, 4)
#define CVT(v) _mm256_cvtepi32_ps(v)

VARIANT2(avx2_a, 1, {
    __m256 s = _mm256_set1_ps(scale2(p));
    __m256 q0 = _mm256_mul_ps(LEVEL(EVEN(lo)), s), q1 = _mm256_mul_ps(LEVEL(ODD(lo)), s);
    __m256 q2 = _mm256_mul_ps(LEVEL(EVEN(hi)), s), q3 = _mm256_mul_ps(LEVEL(ODD(hi)), s);
    acc[i][0] = _mm256_fmadd_ps(q3, x3, _mm256_fmadd_ps(q2, x2, _mm256_fmadd_ps(q1, x1, _mm256_fmadd_ps(q0, x0, acc[i][0]))));
})

VARIANT2(avx2_b, 1, {
    __m256 t = _mm256_mul_ps(LEVEL(EVEN(lo)), x0);
    t = _mm256_fmadd_ps(LEVEL(ODD(lo)), x1, t);
    t = _mm256_fmadd_ps(LEVEL(EVEN(hi)), x2, t);
    t = _mm256_fmadd_ps(LEVEL(ODD(hi)), x3, t);
    acc[i][0] = _mm256_fmadd_ps(t, _mm256_set1_ps(scale2(p)), acc[i][0]);
})

VARIANT2(avx2_c, 2, {
    __m256 s = _mm256_set1_ps(scale2(p));
    __m256 q0 = _mm256_mul_ps(LEVEL(EVEN(lo)), s), q1 = _mm256_mul_ps(LEVEL(ODD(lo)), s);
    __m256 q2 = _mm256_mul_ps(LEVEL(EVEN(hi)), s), q3 = _mm256_mul_ps(LEVEL(ODD(hi)), s);
    acc[i][0] = _mm256_fmadd_ps(q2, x2, _mm256_fmadd_ps(q0, x0, acc[i][0]));
    acc[i][1] = _mm256_fmadd_ps(q3, x3, _mm256_fmadd_ps(q1, x1, acc[i][1]));
})

VARIANT2(avx2_d, 1, {
    __m256 t0 = _mm256_mul_ps(LEVEL(EVEN(lo)), x0), t1 = _mm256_mul_ps(LEVEL(ODD(lo)), x1);
    t0 = _mm256_fmadd_ps(LEVEL(EVEN(hi)), x2, t0);
    t1 = _mm256_fmadd_ps(LEVEL(ODD(hi)), x3, t1);
    acc[i][0] = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), _mm256_set1_ps(scale2(p)), acc[i][0]);
})

VARIANT2(avx2_e, 1, {
    __m256 t = _mm256_mul_ps(CVT(EVEN(lo)), x0);
    t = _mm256_fmadd_ps(CVT(ODD(lo)), x1, t);
    t = _mm256_fmadd_ps(CVT(EVEN(hi)), x2, t);
    t = _mm256_fmadd_ps(CVT(ODD(hi)), x3, t);
    acc[i][0] = _mm256_fmadd_ps(t, _mm256_set1_ps(scale2(p)), acc[i][0]);
})

VARIANT2(avx2_f, 1, {
    const __m256i flip = _mm256_set1_epi32(0x88);
    lo = _mm256_xor_si256(lo, flip);
    hi = _mm256_xor_si256(hi, flip);
    __m256 t = _mm256_fmadd_ps(CVT(EVEN(lo)), x0, _mm256_loadu_ps(NX + b * 8));
    t = _mm256_fmadd_ps(CVT(ODD(lo)), x1, t);
    t = _mm256_fmadd_ps(CVT(EVEN(hi)), x2, t);
    t = _mm256_fmadd_ps(CVT(ODD(hi)), x3, t);
    acc[i][0] = _mm256_fmadd_ps(t, _mm256_set1_ps(scale2(p)), acc[i][0]);
})

VARIANT2(avx2_g, 1, {
    const __m256i eight = _mm256_set1_epi32(8);
    __m256 t = _mm256_fmadd_ps(CVT(EVEN(_mm256_xor_si256(lo, eight))), x0, _mm256_loadu_ps(NX + b * 8));
    t = _mm256_fmadd_ps(LEVEL(ODD(lo)), x1, t);
    t = _mm256_fmadd_ps(CVT(EVEN(_mm256_xor_si256(hi, eight))), x2, t);
    t = _mm256_fmadd_ps(LEVEL(ODD(hi)), x3, t);
    acc[i][0] = _mm256_fmadd_ps(t, _mm256_set1_ps(scale2(p)), acc[i][0]);
})

static float CLO[65536], CHI[65536];

#define SHUFFLE_SETUP \
    const __m256i flip = _mm256_set1_epi8((char)0x88), magicd = _mm256_set1_epi32(0x47474747 ^ 0x88888888); \
    const __m256i ia = _mm256_setr_epi8(-128, 0, -128, 4, -128, 1, -128, 4, -128, 2, -128, 4, -128, 3, -128, 4, \
                                        -128, 4, -128, 0, -128, 5, -128, 0, -128, 6, -128, 0, -128, 7, -128, 0); \
    const __m256i ib = _mm256_setr_epi8(-128, 8, -128, 4, -128, 9, -128, 4, -128, 10, -128, 4, -128, 11, -128, 4, \
                                        -128, 12, -128, 0, -128, 13, -128, 0, -128, 14, -128, 0, -128, 15, -128, 0); \
    const __m256i mlo = _mm256_set1_epi32((int)0xFF000F00), mhi = _mm256_set1_epi32((int)0xFD00F000);
#define SHUFFLE_LEVELS(CLO_, CHI_) \
    __m256 s = _mm256_set1_ps(scale2(p)); \
    __m256i src = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 2))); \
    src = _mm256_xor_si256(_mm256_blend_epi32(src, magicd, 0x12), flip); \
    __m256i sa = _mm256_shuffle_epi8(src, ia), sb = _mm256_shuffle_epi8(src, ib); \
    __m256 clo = CLO_, chi = CHI_; \
    __m256 q0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(sa, mlo)), s, clo); \
    __m256 q1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(sa, mhi)), s, chi); \
    __m256 q2 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(sb, mlo)), s, clo); \
    __m256 q3 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(sb, mhi)), s, chi); \
    acc[i][0] = _mm256_fmadd_ps(q3, x3, _mm256_fmadd_ps(q2, x2, _mm256_fmadd_ps(q1, x1, _mm256_fmadd_ps(q0, x0, acc[i][0]))));

VARIANT2(avx2_h, 1, {
    SHUFFLE_SETUP
    (void)lo; (void)hi;
    SHUFFLE_LEVELS(_mm256_mul_ps(s, _mm256_set1_ps(-32776.0f)), _mm256_mul_ps(s, _mm256_set1_ps(-2056.0f)))
})

VARIANT2(avx2_i, 1, {
    SHUFFLE_SETUP
    (void)lo; (void)hi;
    uint16_t bits;
    memcpy(&bits, p, 2);
    SHUFFLE_LEVELS(_mm256_set1_ps(CLO[bits]), _mm256_set1_ps(CHI[bits]))
})

// NX for f (all four parts unsigned) or g (parts 0 and 2).
static void offsets(const float *x, int all) {
    for (int b = 0; b < BLOCKS; b++)
        for (int l = 0; l < 8; l++) {
            const float *xb = x + b * 32;
            NX[b * 8 + l] = -8.0f * (all ? xb[l] + xb[8 + l] + xb[16 + l] + xb[24 + l] : xb[l] + xb[16 + l]);
        }
}

int main(int argc, char **argv) {
    int avx2 = argc == 4 && strcmp(argv[3], "avx2") == 0;
    int spread = argc == 4 && strcmp(argv[3], "spread") == 0;
    if ((argc != 3 && !avx2 && !spread) || atoi(argv[1]) <= 0 || atoi(argv[1]) % 8 || atoi(argv[2]) <= 0) {
        fprintf(stderr, "usage: q4_decode ROWS PASSES [avx2 | spread] (ROWS a positive multiple of 8)\n");
        return 2;
    }
    if (avx2 ? !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")
             : !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
        fprintf(stderr, "q4_decode: this CPU has no %s\n", avx2 ? "AVX2 and FMA" : "AVX-512 F/BW");
        return 2;
    }
    int rows = atoi(argv[1]), passes = atoi(argv[2]);
    for (int i = 0; i < 65536; i++) {
        _Float16 h;
        uint16_t bits = i;
        memcpy(&h, &bits, 2);
        f16_to_f32[i] = (float)h;
        CLO[i] = -32776.0f * (float)h;
        CHI[i] = -2056.0f * (float)h;
    }
    SCALED = aligned_alloc(64, 65536 * 16 * sizeof(float));
    for (int i = 0; i < 65536; i++)
        for (int l = 0; l < 16; l++) SCALED[i * 16 + l] = (float)(l < 8 ? l : l - 16) * f16_to_f32[i];
    size_t n = (size_t)rows * ROW_BYTES;
    uint8_t *w = aligned_alloc(64, (n + 63) / 64 * 64);
    srand(1);
    for (size_t i = 0; i < n; i++) w[i] = rand();
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < BLOCKS; b++) {
            // Scales from 2^-7 up (from 2^-9 with `spread`): finite, normal.
            uint16_t s = spread ? 0x1800 + (rand() & 0xfff) : 0x2000 + (rand() & 0x3ff);
            memcpy(w + (size_t)r * ROW_BYTES + b * 18, &s, 2);
        }
    float *x = aligned_alloc(64, COLS * 4), *y = malloc(rows * 4);
    for (int i = 0; i < COLS; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
    void (*wide[])(const uint8_t *, const float *, int, float *) = {step_a, step_b, step_c, step_d, step_f, step_g};
    void (*narrow[])(const uint8_t *, const float *, int, float *) = {avx2_a, avx2_b, avx2_c, avx2_d, avx2_e, avx2_f, avx2_g, avx2_h, avx2_i};
    void (**steps)(const uint8_t *, const float *, int, float *) = avx2 ? narrow : wide;
    const char *names = avx2 ? "abcdefghi" : "abcdfg";
    for (int round = 0; round < 3; round++)
        for (int v = 0; names[v]; v++) {
            if (avx2 && (v == 5 || v == 6)) offsets(x, v == 5);
            double best = 1e30;
            for (int p = 0; p < passes; p++) {
                double t = now();
                steps[v](w, x, rows, y);
                t = now() - t;
                if (t < best) best = t;
            }
            uint64_t hash = 0;
            for (int r = 0; r < rows; r++) {
                uint32_t u;
                memcpy(&u, &y[r], 4);
                hash = hash * 1000003 + u;
            }
            printf("%c %6.2f GB/s  y[1] = %.9g  hash %016llx\n", names[v], n / best / 1e9, y[1], (unsigned long long)hash);
        }
    return 0;
}
