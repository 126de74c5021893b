// What a prefill GEMM could reach with its rows side by side in the lanes and integer
// products, against the f32 FMA form: one thread, weights already expanded for a row group
// (their expansion from nibbles is once per row group and block, amortized over the tokens),
// 64 rows x 2,048 columns against 120 vectors, all in the caches. Prints GMAC/s (1e9 multiply-adds
// a second) per form; the docs/BENCHMARKS.md section "2026-12-05 (morning)" quotes it.
//
//   gcc -O3 -funroll-all-loops -o rows_in_lanes tools/bench/rows_in_lanes.c && ./rows_in_lanes 50
//
// AVX-512 (when the CPU has F/BW/VL/VNNI), 16 rows per zmm, 6 vectors per register tile:
//   f32    one FMA per 16 rows x 1 column x 1 vector, the input broadcast (waste's GEMM form)
//   int8   per 32-column block and vector: 8 vpdpbusd (u8 levels + 8 x s8 inputs, 4 columns
//          each), the -8 offset as the accumulator's start, then a conversion, the scale
//          product and an FMA: llama.cpp's int8 accuracy
//   int16  the same with 16 vpdpwssd (i16 levels x i16 inputs, 2 columns each): inputs rounded
//          to 1/65534 of their block's largest, the finer scheme
// AVX2, 8 rows per ymm: f32 as above; int16 with vpmaddwd + vpaddd (weights reloaded per
// vector, then loaded once per register tile: "reuse"), and with AVX-VNNI vpdpwssd where the
// CPU has it; int8 with vpmaddubsw (pairs into int16), vpmaddwd by ones, vpaddd.
// The integer forms' block sums are exact; only the inputs' quantization and the scales round.
// Values are random and the outputs are not checked: this prices the instructions only.
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define K 2048
#define NB (K / 32)
#define RG 4            // row groups of 16 rows
#define T 120           // tokens
#define TT 6            // tokens per register tile
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static float *Wf;        // [RG][K][16] f32 widened (scaled) panel
static uint8_t *W8;      // [RG][NB][8][64] u8 levels+8, 16 rows x 4 cols per zmm
static int16_t *W16;     // [RG][NB][16][32] i16 levels, 16 rows x 2 cols per zmm
static float *Wd;        // [RG][NB][16] weight scales
static float *Xf;        // [T][K]
static int8_t *X8;       // [T][K]
static int16_t *X16;     // [T][K]
static float *Xd;        // [T][NB]
static int32_t *Xoff;    // [T][NB] -8 * sum of the block's int8 inputs
static float *Y;         // [T][RG*16]

TGT static void gemm_f32(void) {
    for (int rg = 0; rg < RG; rg++)
        for (int t0 = 0; t0 < T; t0 += TT) {
            __m512 acc[TT];
            for (int t = 0; t < TT; t++) acc[t] = _mm512_setzero_ps();
            const float *w = Wf + (size_t)rg * K * 16;
            for (int c = 0; c < K; c++) {
                __m512 wc = _mm512_load_ps(w + c * 16);
                for (int t = 0; t < TT; t++) acc[t] = _mm512_fmadd_ps(wc, _mm512_set1_ps(Xf[(t0 + t) * K + c]), acc[t]);
            }
            for (int t = 0; t < TT; t++) _mm512_storeu_ps(Y + (t0 + t) * RG * 16 + rg * 16, acc[t]);
        }
}

TGT static void gemm_i8(void) {
    for (int rg = 0; rg < RG; rg++)
        for (int t0 = 0; t0 < T; t0 += TT) {
            __m512 acc[TT];
            for (int t = 0; t < TT; t++) acc[t] = _mm512_setzero_ps();
            for (int b = 0; b < NB; b++) {
                const uint8_t *w = W8 + ((size_t)rg * NB + b) * 8 * 64;
                __m512i wv[8];
                for (int j = 0; j < 8; j++) wv[j] = _mm512_load_si512(w + j * 64);
                __m512 wd = _mm512_load_ps(Wd + ((size_t)rg * NB + b) * 16);
                for (int t = 0; t < TT; t++) {
                    const int8_t *x = X8 + (t0 + t) * K + b * 32;
                    __m512i s = _mm512_set1_epi32(Xoff[(t0 + t) * NB + b]), s1 = _mm512_setzero_si512();
                    for (int j = 0; j < 8; j += 2) { s = _mm512_dpbusd_epi32(s, wv[j], _mm512_set1_epi32(*(const int32_t *)(x + 4 * j))); s1 = _mm512_dpbusd_epi32(s1, wv[j + 1], _mm512_set1_epi32(*(const int32_t *)(x + 4 * j + 4))); }
                    s = _mm512_add_epi32(s, s1);
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(wd, _mm512_set1_ps(Xd[(t0 + t) * NB + b])), acc[t]);
                }
            }
            for (int t = 0; t < TT; t++) _mm512_storeu_ps(Y + (t0 + t) * RG * 16 + rg * 16, acc[t]);
        }
}

TGT static void gemm_i16(void) {
    for (int rg = 0; rg < RG; rg++)
        for (int t0 = 0; t0 < T; t0 += TT) {
            __m512 acc[TT];
            for (int t = 0; t < TT; t++) acc[t] = _mm512_setzero_ps();
            for (int b = 0; b < NB; b++) {
                const int16_t *w = W16 + ((size_t)rg * NB + b) * 16 * 32;
                __m512i wv[16];
                for (int j = 0; j < 16; j++) wv[j] = _mm512_load_si512(w + j * 32);
                __m512 wd = _mm512_load_ps(Wd + ((size_t)rg * NB + b) * 16);
                for (int t = 0; t < TT; t++) {
                    const int16_t *x = X16 + (t0 + t) * K + b * 32;
                    __m512i s = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                    for (int j = 0; j < 16; j += 2) { s = _mm512_dpwssd_epi32(s, wv[j], _mm512_set1_epi32(*(const int32_t *)(x + 2 * j))); s1 = _mm512_dpwssd_epi32(s1, wv[j + 1], _mm512_set1_epi32(*(const int32_t *)(x + 2 * j + 2))); }
                    s = _mm512_add_epi32(s, s1);
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(wd, _mm512_set1_ps(Xd[(t0 + t) * NB + b])), acc[t]);
                }
            }
            for (int t = 0; t < TT; t++) _mm512_storeu_ps(Y + (t0 + t) * RG * 16 + rg * 16, acc[t]);
        }
}

// AVX2: rows in the 8 lanes of a ymm.
#define TG2 __attribute__((target("avx2,fma")))
static float *Wf2;      // [RG*2][K][8]
static uint8_t *W8b;    // [RG*2][NB][8][32] u8 levels+8, 8 rows x 4 cols per ymm
static int16_t *W16b;   // [RG*2][NB][16][16] i16, 8 rows x 2 cols per ymm
static float *Wd2;      // [RG*2][NB][8]
TG2 static void gemm2_f32(void) {
    for (int rg = 0; rg < RG * 2; rg++)
        for (int t0 = 0; t0 < T; t0 += TT) {
            __m256 acc[TT];
            for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
            const float *w = Wf2 + (size_t)rg * K * 8;
            for (int c = 0; c < K; c++) {
                __m256 wc = _mm256_load_ps(w + c * 8);
                for (int t = 0; t < TT; t++) acc[t] = _mm256_fmadd_ps(wc, _mm256_set1_ps(Xf[(t0 + t) * K + c]), acc[t]);
            }
            for (int t = 0; t < TT; t++) _mm256_storeu_ps(Y + (t0 + t) * RG * 16 + rg * 8, acc[t]);
        }
}
TG2 static void gemm2_i16(void) {
    for (int rg = 0; rg < RG * 2; rg++)
        for (int t0 = 0; t0 < T; t0 += TT) {
            __m256 acc[TT];
            for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
            for (int b = 0; b < NB; b++) {
                const int16_t *w = W16b + ((size_t)rg * NB + b) * 16 * 16;
                __m256 wd = _mm256_load_ps(Wd2 + ((size_t)rg * NB + b) * 8);
                for (int t = 0; t < TT; t++) {
                    const int16_t *x = X16 + (t0 + t) * K + b * 32;
                    __m256i s = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
                    for (int j = 0; j < 16; j += 2) {
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(w + j * 16)), _mm256_set1_epi32(*(const int32_t *)(x + 2 * j))));
                        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(w + j * 16 + 16)), _mm256_set1_epi32(*(const int32_t *)(x + 2 * j + 2))));
                    }
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s, s1)), _mm256_mul_ps(wd, _mm256_set1_ps(Xd[(t0 + t) * NB + b])), acc[t]);
                }
            }
            for (int t = 0; t < TT; t++) _mm256_storeu_ps(Y + (t0 + t) * RG * 16 + rg * 8, acc[t]);
        }
}
// int16 as above, each weight register loaded once for the tile's vectors (as the engine's
// AVX2 int16 GEMM does): the form above reloads it per vector and is bound by the loads.
TG2 static void gemm2_i16r(void) {
    for (int rg = 0; rg < RG * 2; rg++)
        for (int t0 = 0; t0 < T; t0 += TT) {
            __m256 acc[TT];
            for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
            for (int b = 0; b < NB; b++) {
                const int16_t *w = W16b + ((size_t)rg * NB + b) * 16 * 16;
                __m256 wd = _mm256_load_ps(Wd2 + ((size_t)rg * NB + b) * 8);
                __m256i s[TT];
                for (int t = 0; t < TT; t++) s[t] = _mm256_setzero_si256();
                for (int j = 0; j < 16; j++) {
                    __m256i wj = _mm256_load_si256((const __m256i *)(w + j * 16));
                    for (int t = 0; t < TT; t++)
                        s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(wj, _mm256_set1_epi32(*(const int32_t *)(X16 + (t0 + t) * K + b * 32 + 2 * j))));
                }
                for (int t = 0; t < TT; t++)
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(wd, _mm256_set1_ps(Xd[(t0 + t) * NB + b])), acc[t]);
            }
            for (int t = 0; t < TT; t++) _mm256_storeu_ps(Y + (t0 + t) * RG * 16 + rg * 8, acc[t]);
        }
}
// gemm2_i16r with AVX-VNNI `vpdpwssd` on 256-bit registers (Intel since Alder Lake).
__attribute__((target("avx2,fma,avxvnni"))) static void gemm2_vnni(void) {
    for (int rg = 0; rg < RG * 2; rg++)
        for (int t0 = 0; t0 < T; t0 += TT) {
            __m256 acc[TT];
            for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
            for (int b = 0; b < NB; b++) {
                const int16_t *w = W16b + ((size_t)rg * NB + b) * 16 * 16;
                __m256 wd = _mm256_load_ps(Wd2 + ((size_t)rg * NB + b) * 8);
                __m256i s[TT];
                for (int t = 0; t < TT; t++) s[t] = _mm256_setzero_si256();
                for (int j = 0; j < 16; j++) {
                    __m256i wj = _mm256_load_si256((const __m256i *)(w + j * 16));
                    for (int t = 0; t < TT; t++)
                        s[t] = _mm256_dpwssd_avx_epi32(s[t], wj, _mm256_set1_epi32(*(const int32_t *)(X16 + (t0 + t) * K + b * 32 + 2 * j)));
                }
                for (int t = 0; t < TT; t++)
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(wd, _mm256_set1_ps(Xd[(t0 + t) * NB + b])), acc[t]);
            }
            for (int t = 0; t < TT; t++) _mm256_storeu_ps(Y + (t0 + t) * RG * 16 + rg * 8, acc[t]);
        }
}
TG2 static void gemm2_i8(void) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int rg = 0; rg < RG * 2; rg++)
        for (int t0 = 0; t0 < T; t0 += TT) {
            __m256 acc[TT];
            for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
            for (int b = 0; b < NB; b++) {
                const uint8_t *w = W8b + ((size_t)rg * NB + b) * 8 * 32;
                __m256 wd = _mm256_load_ps(Wd2 + ((size_t)rg * NB + b) * 8);
                for (int t = 0; t < TT; t++) {
                    const int8_t *x = X8 + (t0 + t) * K + b * 32;
                    __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
                    for (int j = 0; j < 8; j += 2) {
                        // u8 weights x s8 inputs, pairs summed in int16 (|2 x 15 x 127| fits), then pairs of those in int32
                        p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(w + j * 32)), _mm256_set1_epi32(*(const int32_t *)(x + 4 * j))));
                        p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(w + j * 32 + 32)), _mm256_set1_epi32(*(const int32_t *)(x + 4 * j + 4))));
                    }
                    __m256i s = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
                    s = _mm256_add_epi32(s, _mm256_set1_epi32(Xoff[(t0 + t) * NB + b]));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(wd, _mm256_set1_ps(Xd[(t0 + t) * NB + b])), acc[t]);
                }
            }
            for (int t = 0; t < TT; t++) _mm256_storeu_ps(Y + (t0 + t) * RG * 16 + rg * 8, acc[t]);
        }
}

static void *al(size_t n) { void *p = aligned_alloc(64, (n + 63) / 64 * 64); memset(p, 0, (n + 63) / 64 * 64); return p; }

int main(int argc, char **argv) {
    int passes = argc > 1 ? atoi(argv[1]) : 50;
    int wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        fprintf(stderr, "rows_in_lanes: this CPU has no AVX2 and FMA\n");
        return 2;
    }
    Wf = al((size_t)RG * K * 16 * 4); W8 = al((size_t)RG * NB * 8 * 64); W16 = al((size_t)RG * NB * 16 * 64);
    Wd = al((size_t)RG * NB * 16 * 4); Xf = al((size_t)T * K * 4); X8 = al((size_t)T * K); X16 = al((size_t)T * K * 2);
    Xd = al((size_t)T * NB * 4); Xoff = al((size_t)T * NB * 4); Y = al((size_t)T * RG * 16 * 4);
    Wf2 = al((size_t)RG * 2 * K * 8 * 4); W8b = al((size_t)RG * 2 * NB * 8 * 32); W16b = al((size_t)RG * 2 * NB * 16 * 32);
    Wd2 = al((size_t)RG * 2 * NB * 8 * 4);
    srand(1);
    for (size_t i = 0; i < (size_t)RG * K * 16; i++) Wf[i] = Wf2[i] = (rand() % 16 - 8) * 0.01f;
    for (size_t i = 0; i < (size_t)RG * NB * 8 * 64; i++) W8[i] = W8b[i] = rand() % 16;
    for (size_t i = 0; i < (size_t)RG * NB * 16 * 32; i++) W16[i] = W16b[i] = rand() % 16 - 8;
    for (size_t i = 0; i < (size_t)RG * NB * 16; i++) Wd[i] = Wd2[i] = 0.01f;
    for (size_t i = 0; i < (size_t)T * K; i++) {
        Xf[i] = rand() / (float)RAND_MAX - 0.5f;
        X8[i] = rand() % 255 - 127;
        X16[i] = rand() % 65535 - 32767;
    }
    for (size_t i = 0; i < (size_t)T * NB; i++) {
        Xd[i] = 1e-3f;
        Xoff[i] = 0;
    }
    const double macs = (double)RG * 16 * K * T;
    void (*k[])(void) = {gemm_f32, gemm_i8, gemm_i16, gemm2_f32, gemm2_i8, gemm2_i16, gemm2_i16r, gemm2_vnni};
    const char *name[] = {"AVX-512 f32 FMA", "AVX-512 int8 vpdpbusd", "AVX-512 int16 vpdpwssd",
                          "AVX2 f32 FMA", "AVX2 int8 vpmaddubsw", "AVX2 int16 vpmaddwd",
                          "AVX2 int16 vpmaddwd, reuse", "AVX-VNNI int16 vpdpwssd"};
    for (int round = 0; round < 3; round++)
        for (int v = wide ? 0 : 3; v < 8; v++) {
            if (v == 7 && !__builtin_cpu_supports("avxvnni")) continue;
            double best = 1e30;
            for (int p = 0; p < passes; p++) {
                double t = now();
                k[v]();
                t = now() - t;
                if (t < best) best = t;
            }
            printf("%-24s %6.1f GMAC/s\n", name[v], macs / best / 1e9);
        }
    return 0;
}
