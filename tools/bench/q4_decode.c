// The AVX-512 Q4B32 decode tile's block step, and variants of it, timed on one thread: the
// program behind "where the AVX-512 Q4B32 decode's time goes" in docs/BENCHMARKS.md.
//
//   gcc -O2 -o q4_decode tools/bench/q4_decode.c && ./q4_decode ROWS PASSES
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

int main(int argc, char **argv) {
    if (argc != 3 || atoi(argv[1]) <= 0 || atoi(argv[1]) % 8 || atoi(argv[2]) <= 0) {
        fprintf(stderr, "usage: q4_decode ROWS PASSES (ROWS a positive multiple of 8)\n");
        return 2;
    }
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
        fprintf(stderr, "q4_decode: this CPU has no AVX-512 F/BW\n");
        return 2;
    }
    int rows = atoi(argv[1]), passes = atoi(argv[2]);
    for (int i = 0; i < 65536; i++) {
        _Float16 h;
        uint16_t bits = i;
        memcpy(&h, &bits, 2);
        f16_to_f32[i] = (float)h;
    }
    size_t n = (size_t)rows * ROW_BYTES;
    uint8_t *w = aligned_alloc(64, (n + 63) / 64 * 64);
    srand(1);
    for (size_t i = 0; i < n; i++) w[i] = rand();
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < BLOCKS; b++) {
            uint16_t s = 0x2000 + (rand() & 0x3ff); // scales from 2^-7 up: finite, normal
            memcpy(w + (size_t)r * ROW_BYTES + b * 18, &s, 2);
        }
    float *x = aligned_alloc(64, COLS * 4), *y = malloc(rows * 4);
    for (int i = 0; i < COLS; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
    void (*steps[])(const uint8_t *, const float *, int, float *) = {step_a, step_b, step_c, step_d, step_f};
    const char *names = "abcdf";
    for (int round = 0; round < 3; round++)
        for (int v = 0; v < 5; v++) {
            double best = 1e30;
            for (int p = 0; p < passes; p++) {
                double t = now();
                steps[v](w, x, rows, y);
                t = now() - t;
                if (t < best) best = t;
            }
            printf("%c %6.2f GB/s  y[1] = %g\n", names[v], n / best / 1e9, y[1]);
        }
    return 0;
}
