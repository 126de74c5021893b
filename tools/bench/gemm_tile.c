/* A replica of the AVX-512 prefill GEMM's inner loop (src/kernels/avx512_prefill.rs: 6 x 4
 * register tiles over an 18-row x 512-column f32 panel, 128 vectors, accumulators in a buffer
 * between column chunks), to find what slows it without the rest of the engine: the panel
 * stays fixed, only the inputs' layout, size and alignment change. Not part of the build.
 *
 *   gcc -O3 -mavx512f -mfma -DXS=8192 -DCH=16 -DOFF=0 -o /tmp/gemm_tile tools/bench/gemm_tile.c
 *   chrt -f 10 /tmp/gemm_tile
 *
 * XS: floats between two vectors' inputs (the matrix's columns); CH: 512-column chunks walked
 * (the inputs read are 128 x CH x 2 KiB); OFF: bytes the inputs start past a 64-byte boundary.
 * It prints FMA instructions per second and their share of PEAK (G per second; default 7.68,
 * this host's measured f32 FMA peak: 2 ports x 3.84 GHz). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define K 512
#define RG 18
#define TG 128
#ifndef XS
#define XS 2048
#endif
#ifndef CH
#define CH (XS / K)
#endif
#ifndef OFF
#define OFF 0
#endif
#ifndef PEAK
#define PEAK 7.68
#endif
static float P[RG * K] __attribute__((aligned(64)));
static __m512 ACC[RG][TG];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline __attribute__((always_inline)) void tile(const float *p, const float *x, int rq, int tq, int first) {
    __m512 a[6][4];
    for (int i = 0; i < 6; i++)
        for (int t = 0; t < 4; t++) a[i][t] = first ? _mm512_setzero_ps() : ACC[rq + i][tq + t];
    for (int s = 0; s < K / 16; s++) {
        __m512 xv[4];
        for (int t = 0; t < 4; t++) xv[t] = _mm512_loadu_ps(x + t * XS + s * 16);
        for (int i = 0; i < 6; i++) {
            __m512 w = _mm512_load_ps(p + i * K + s * 16);
            for (int t = 0; t < 4; t++) a[i][t] = _mm512_fmadd_ps(w, xv[t], a[i][t]);
        }
    }
    for (int i = 0; i < 6; i++)
        for (int t = 0; t < 4; t++) ACC[rq + i][tq + t] = a[i][t];
}

int main(void) {
    char *raw = aligned_alloc(64, (size_t)TG * XS * 4 + 64);
    float *x = (float *)(raw + OFF);
    for (long i = 0; i < (long)TG * XS; i++) x[i] = 1e-3f * (i % 5);
    for (int i = 0; i < RG * K; i++) P[i] = 1e-3f * (i % 7);
    long passes = 1600 / CH;
    double t0 = now();
    for (long n = 0; n < passes; n++)
        for (int c = 0; c < CH; c++)
            for (int tq = 0; tq < TG; tq += 4)
                for (int rq = 0; rq < RG; rq += 6) tile(P, x + (long)tq * XS + c * K, rq, tq, c == 0);
    double secs = now() - t0, fmas = (double)passes * CH * TG * RG * (K / 16);
    printf("XS=%d CH=%d OFF=%d: %.2f G FMA/s (%.0f%% of %.2f)\n", XS, CH, OFF, fmas / secs / 1e9,
           100 * fmas / secs / 1e9 / PEAK, PEAK);
    float sum = 0;
    for (int i = 0; i < RG; i++) sum += _mm512_reduce_add_ps(ACC[i][0]);
    printf("checksum %g\n", sum);
    return 0;
}
