/* Two processes on shared memory: where an allreduce's owner should store its reduction.
 *
 * A model of one segment of the compiled engine's shared-memory allreduce at 2 ranks (float32 sum,
 * in place): each rank copies the half the peer owns into its region, a barrier, each reduces its own
 * half, a barrier, each copies the peer's reduced half out. The designs differ in where the owner's
 * reduction goes:
 *   slot      into the result slot the peer reads, and into the output in the same pass
 *   whole     into the output, then copied into the slot whole
 *   blocks:N  into the output and copied into the slot N bytes at a time (the engine's way)
 * and the probe says what state the machine's two CPUs are in (bench/README.md, "Slow spells"): two
 * processes' private copies at once, and a cache line's round trip between them.
 *
 *   cc -O3 -o /tmp/owner_store bench/owner_store.c
 *   /tmp/owner_store probe
 *   /tmp/owner_store 1048576 slot whole blocks:4096 blocks:32768
 *
 * The designs are interleaved, 10 calls each a round, 60 rounds: each design's median and its
 * time over the first design's in the same round. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { ROUNDS = 60, CALLS = 10, MOST_DESIGNS = 8 };

typedef struct {
    _Alignas(128) atomic_long value;
} Flag;

static Flag *flags;      /* [0], [1]: each rank's barrier count */
static float *region;    /* [2 turns][2 ranks][count] */
static float *x;         /* this rank's input and output */
static long count, barriers, block;
static int rank, turn;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void barrier(void) {
    barriers++;
    atomic_store_explicit(&flags[rank].value, barriers, memory_order_release);
    while (atomic_load_explicit(&flags[1 - rank].value, memory_order_acquire) < barriers) {
    }
}

static void add(float *restrict out, const float *a, const float *b, long n) {
    for (long i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void add_twice(float *restrict out, float *restrict copy, const float *a, const float *b, long n) {
    for (long i = 0; i < n; i++) copy[i] = out[i] = a[i] + b[i];
}

/* one call; block 0 stores in the same pass (slot), block < 0 copies whole */
static void allreduce(void) {
    long half = count / 2, own = rank ? half : 0, peers = rank ? 0 : half;
    float *mine = region + ((long)turn * 2 + rank) * count, *theirs = region + ((long)turn * 2 + 1 - rank) * count;
    memcpy(mine + peers, x + peers, half * sizeof(float));
    barrier();
    const float *first = rank == 0 ? x + own : theirs + own, *second = rank == 0 ? theirs + own : x + own;
    if (block == 0)
        add_twice(x + own, mine + own, first, second, half);
    else {
        long step = block < 0 ? half : block;
        for (long at = 0; at < half; at += step) {
            long n = at + step < half ? step : half - at;
            add(x + own + at, first + at, second + at, n);
            memcpy(mine + own + at, x + own + at, n * sizeof(float));
        }
    }
    barrier();
    memcpy(x + peers, theirs + peers, half * sizeof(float));
    turn ^= 1;
}

static long block_of(const char *design) {
    if (!strcmp(design, "slot")) return 0;
    if (!strcmp(design, "whole")) return -1;
    if (!strncmp(design, "blocks:", 7) && atol(design + 7) >= 4) return atol(design + 7) / (long)sizeof(float);
    fprintf(stderr, "unknown design %s (slot, whole, blocks:BYTES)\n", design);
    exit(2);
}

static int by_value(const void *a, const void *b) {
    double p = *(const double *)a, q = *(const double *)b;
    return p < q ? -1 : p > q;
}

static void probe(void) {
    long bytes = 1 << 19, trips = 200000;
    char *from = aligned_alloc(64, bytes), *to = aligned_alloc(64, bytes);
    memset(from, 1, bytes);
    memset(to, 2, bytes);
    barrier();
    double t = now();
    for (int i = 0; i < 4000; i++) {
        memcpy(to, from, bytes);
        from[i & 1023]++;
        __asm__ volatile("" ::: "memory");
    }
    double copy = (now() - t) / 4000;
    barrier();
    atomic_long *ball = &flags[2].value;
    t = now();
    for (long i = 0; i < trips; i++) {
        if (rank == 0) {
            atomic_store(ball, 2 * i + 1);
            while (atomic_load(ball) != 2 * i + 2) {
            }
        } else {
            while (atomic_load(ball) != 2 * i + 1) {
            }
            atomic_store(ball, 2 * i + 2);
        }
    }
    double trip = (now() - t) / trips;
    if (rank == 0) printf("two copies of 512 KiB at once: %.1f GB/s each; a cache line's round trip: %.0f ns\n",
                          bytes / copy / 1e9, trip * 1e9);
}

int main(int argc, char **argv) {
    int probing = argc == 2 && !strcmp(argv[1], "probe");
    if (!probing && (argc < 3 || argc - 2 > MOST_DESIGNS || atol(argv[1]) < 64)) {
        fprintf(stderr, "usage: %s probe | %s BYTES DESIGN... (at most %d)\n", argv[0], argv[0], MOST_DESIGNS);
        return 2;
    }
    int designs = probing ? 0 : argc - 2;
    long blocks[MOST_DESIGNS];
    for (int d = 0; d < designs; d++) blocks[d] = block_of(argv[2 + d]);
    count = probing ? 2 : atol(argv[1]) / (long)sizeof(float) / 2 * 2;
    flags = mmap(0, 4 * sizeof(Flag), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    region = mmap(0, 4 * count * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (flags == MAP_FAILED || region == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(region, 0, 4 * count * sizeof(float));
    rank = fork() == 0;
    if (probing) {
        probe();
        if (rank == 0) wait(NULL);
        return 0;
    }
    x = aligned_alloc(64, count * sizeof(float) + 64);
    for (long i = 0; i < count; i++) x[i] = 1;
    static double took[MOST_DESIGNS][ROUNDS];
    for (int round = 0; round < ROUNDS; round++)
        for (int d = 0; d < designs; d++) {
            block = blocks[d];
            for (int i = 0; i < 3; i++) allreduce();
            barrier();
            double t = now();
            for (int i = 0; i < CALLS; i++) allreduce();
            took[d][round] = (now() - t) / CALLS * 1e6;
        }
    barrier();
    if (rank == 1) return 0;
    for (int d = 0; d < designs; d++) {
        double times[ROUNDS], ratios[ROUNDS];
        for (int round = 0; round < ROUNDS; round++) {
            times[round] = took[d][round];
            ratios[round] = took[d][round] / took[0][round];
        }
        qsort(times, ROUNDS, sizeof(double), by_value);
        qsort(ratios, ROUNDS, sizeof(double), by_value);
        printf("%-14s median %8.1f us (quartiles %.1f-%.1f)   over %s in the same round: %.2f\n", argv[2 + d],
               times[ROUNDS / 2], times[ROUNDS / 4], times[3 * ROUNDS / 4], argv[2], ratios[ROUNDS / 2]);
    }
    wait(NULL);
    return 0;
}
