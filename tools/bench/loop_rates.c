// Two measurements behind docs/BENCHMARKS.md ("2026-12-05 (midday, later session)"), one
// thread, everything in registers or L1:
//
//   gcc -O3 -o loop_rates tools/bench/loop_rates.c && ./loop_rates     (-O2 keeps the tile's
//                                                                     accumulators in memory)
//
//  1. ns per instruction of a loop of twelve independent 512-bit accumulators, one
//     instruction each per iteration, for vfmadd231ps, vdpbf16ps, vpermw, vpermps,
//     vpmultishiftqb and vpdpwssd (an instruction the CPU lacks ends the program with SIGILL,
//     so the AVX-512 part runs only where avx512f, bf16, vbmi and vnni are all present);
//  2. the AVX2 GEMM's register tile (src/kernels/avx2_gemm.rs: 3 panel rows x 4 vectors, twelve
//     8-lane accumulators, per 8-column step three panel loads, four input loads and twelve
//     FMAs) over a 24-row x 256-column panel and 32 vectors' inputs, as GFMA/s: the tile's own
//     rate, without the GEMM's decoding, packing and bookkeeping around it.
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define BODY(I) I " %%zmm30,%%zmm31,%%zmm0\n" I " %%zmm30,%%zmm31,%%zmm1\n" I " %%zmm30,%%zmm31,%%zmm2\n" \
    I " %%zmm30,%%zmm31,%%zmm3\n" I " %%zmm30,%%zmm31,%%zmm4\n" I " %%zmm30,%%zmm31,%%zmm5\n"         \
    I " %%zmm30,%%zmm31,%%zmm6\n" I " %%zmm30,%%zmm31,%%zmm7\n" I " %%zmm30,%%zmm31,%%zmm8\n"         \
    I " %%zmm30,%%zmm31,%%zmm9\n" I " %%zmm30,%%zmm31,%%zmm10\n" I " %%zmm30,%%zmm31,%%zmm11\n"

#define RATE(NAME, I)                                                                              \
    {                                                                                              \
        long n = N;                                                                                \
        double t = now();                                                                          \
        __asm__ volatile("vpxord %%zmm30,%%zmm30,%%zmm30\n vpxord %%zmm31,%%zmm31,%%zmm31\n1:\n"   \
                         BODY(I) "dec %0\n jnz 1b\n"                                               \
                         : "+r"(n)::"memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5",      \
                           "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm30", "xmm31");    \
        printf("%-16s %.3f ns per instruction\n", NAME, (now() - t) / (N * 12.0) * 1e9);           \
    }

__attribute__((target("avx512f,avx512bw,avx512bf16,avx512vbmi,avx512vnni"))) static void rates(void) {
    const long N = 100000000;
    RATE("vfmadd231ps", "vfmadd231ps")
    RATE("vdpbf16ps", "vdpbf16ps")
    RATE("vpermw", "vpermw")
    RATE("vpermps", "vpermps")
    RATE("vpmultishiftqb", "vpmultishiftqb")
    RATE("vpdpwssd", "vpdpwssd")
}

#define K 256
static float P[24][K] __attribute__((aligned(64)));
static float X[32][K] __attribute__((aligned(64)));

__attribute__((target("avx2,fma"), noinline)) static void tile(const float *p, const float *x, __m256 *acc) {
    __m256 a[3][4];
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 4; t++) a[i][t] = acc[i * 4 + t];
    for (int s = 0; s < K / 8; s++) {
        __m256 w0 = _mm256_load_ps(p + 8 * s), w1 = _mm256_load_ps(p + K + 8 * s), w2 = _mm256_load_ps(p + 2 * K + 8 * s);
        for (int t = 0; t < 4; t++) {
            __m256 xv = _mm256_load_ps(x + t * K + 8 * s);
            a[0][t] = _mm256_fmadd_ps(w0, xv, a[0][t]);
            a[1][t] = _mm256_fmadd_ps(w1, xv, a[1][t]);
            a[2][t] = _mm256_fmadd_ps(w2, xv, a[2][t]);
        }
    }
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 4; t++) acc[i * 4 + t] = a[i][t];
}

int main(void) {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16") &&
        __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vnni"))
        rates();
    else
        printf("instruction rates: skipped (no AVX-512 with BF16, VBMI and VNNI)\n");
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("AVX2 tile: skipped (no AVX2 and FMA)\n");
        return 0;
    }
    static __m256 acc[12 * 64];
    const long reps = 2000000;
    double t = now();
    // Row tiles of the panel in turn, then the next four vectors, as the GEMM sweeps them.
    for (long r = 0; r < reps; r++) tile(&P[(r % 8) * 3][0], &X[((r / 8) % 8) * 4][0], acc + 12 * (r % 64));
    double fmas = (double)reps * (K / 8) * 12;
    printf("AVX2 tile        %.2f GFMA/s (x 8 lanes = %.1f GMAC/s)\n", fmas / (now() - t) / 1e9, 8 * fmas / (now() - t) / 1e9);
    return 0;
}
