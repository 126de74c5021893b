/* What touching a page costs, for the expert cache's slots (docs/BENCHMARKS.md, 2026-12-04
 * night): the first touch of fresh anonymous memory (the kernel zeroes each page, and a VM's
 * host may have to back it), and a touch after MADV_FREE (what taking a purgeable slot back
 * does: src/sys/mod.rs, Slot::keep_pages). Not part of the build.
 *
 *   gcc -O2 -o /tmp/page_touch tools/bench/page_touch.c
 *   /tmp/page_touch first 3000 1      # MiB of fresh memory, with MADV_HUGEPAGE (1) or not (0)
 *   /tmp/page_touch free 1000 1       # regions of a Qwen3-30B-A3B record, MADV_FREE'd, then
 *                                     # touched as Slot::keep_pages does (1: MADV_HUGEPAGE)
 *   /tmp/page_touch populate 1000 1   # the same, taken back with MADV_POPULATE_WRITE instead
 *
 * "first" prints the first touch's rate and a second pass's; the others print per region the
 * madvise's time and the time per 4 KiB page of the taking back (three rounds, untouched
 * regions first for the baseline). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define PAGE 4096UL
#define RECORD 2658304UL /* one Q4B32 expert record of the Qwen3-30B-A3B shape, page-rounded */
#define HUGE (2UL << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static char *map(size_t bytes, int huge) {
    char *p = mmap(0, bytes + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    p = (char *)(((unsigned long)p + HUGE - 1) & ~(HUGE - 1)); /* as SlotArena aligns */
    if (huge)
        madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

/* Writes each page's first byte back and checks the rest of its first line, as keep_pages. */
static long keep_pages(char *q, int populate) {
    long lost = 0;
    if (populate && madvise(q, RECORD, MADV_POPULATE_WRITE)) {
        perror("MADV_POPULATE_WRITE");
        exit(1);
    }
    for (size_t i = 0; i < RECORD; i += PAGE) {
        volatile char *b = q + i;
        if (!populate)
            *b = *b;
        lost += b[1] == 0;
    }
    return lost;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s first|free|populate COUNT HUGE\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    size_t count = strtoul(argv[2], 0, 10);
    int huge = atoi(argv[3]);
    if (!strcmp(mode, "first")) {
        size_t bytes = count << 20;
        char *p = map(bytes, huge);
        double t = now();
        for (size_t i = 0; i < bytes; i += PAGE)
            p[i] = 1;
        double first = now() - t;
        t = now();
        memset(p, 2, bytes);
        printf("%zu MiB, huge pages %d: first touch %.2f GB/s, second %.2f GB/s\n", count, huge,
               bytes / first / 1e9, bytes / (now() - t) / 1e9);
        return 0;
    }
    int populate = !strcmp(mode, "populate");
    if (!populate && strcmp(mode, "free")) {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    char *p = map(RECORD * count, huge);
    memset(p, 1, RECORD * count);
    for (int round = 0; round < 4; round++) {
        int offer = round > 0; /* round 0: untouched regions, the baseline */
        double advise = 0, touch = 0;
        long lost = 0;
        for (size_t s = 0; s < count; s++) {
            char *q = p + s * RECORD;
            double t = now();
            if (offer)
                madvise(q, RECORD, MADV_FREE);
            advise += now() - t;
            t = now();
            lost += offer ? keep_pages(q, populate) : keep_pages(q, 0);
            touch += now() - t;
        }
        printf("%s: madvise %.1f us a region, taking back %.0f ns a page (%ld pages lost)\n",
               offer ? (populate ? "MADV_FREE, then MADV_POPULATE_WRITE" : "MADV_FREE, then a write a page") : "untouched",
               advise / count * 1e6, touch / count / (RECORD / PAGE) * 1e9, lost);
    }
    return 0;
}
