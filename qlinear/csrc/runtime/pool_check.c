/* The pool's self-check (tests only, _qlnative.pool_check): jobs of counting tasks that prove,
 * independently of any kernel, that ql_parallel_for runs every task exactly once, hands out
 * thread indices below max_threads, returns only after every task is done, runs nested calls
 * (a task that calls ql_parallel_for) and concurrent calls (two Python threads), and survives a
 * worker that is off its CPU in the middle of a task (a task that sleeps, on a worker). */
#define _GNU_SOURCE
#include "qlinear.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    atomic_int *hits;        /* per outer task; nested: per inner task, after the outer ones */
    ptrdiff_t n, nested;
    int max_threads;
    long busy_ns, worker_sleep_ns;
    atomic_int bad_thread;   /* thread indices out of range */
    atomic_int max_thread;
    atomic_int outer_done;   /* outer tasks finished (checked against n when the call returns) */
} check_ctx;

typedef struct { check_ctx *c; ptrdiff_t outer; int thread; } inner_ctx;

static long mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

static void note_thread(check_ctx *c, int thread, int limit) {
    if (thread < 0 || thread >= (limit > 1 ? limit : 1)) atomic_fetch_add(&c->bad_thread, 1);
    int m = atomic_load(&c->max_thread);
    while (thread > m && !atomic_compare_exchange_weak(&c->max_thread, &m, thread)) {}
}

static void inner_task(void *vctx, ptrdiff_t t, int thread) {
    inner_ctx *ic = (inner_ctx *)vctx;
    /* a nested call runs on the thread that made it: index 0 of its own call */
    note_thread(ic->c, thread, ic->c->max_threads);
    atomic_fetch_add(&ic->c->hits[ic->c->n + ic->outer * ic->c->nested + t], 1);
}

static void check_task(void *vctx, ptrdiff_t t, int thread) {
    check_ctx *c = (check_ctx *)vctx;
    note_thread(c, thread, c->max_threads);
    if (c->busy_ns) {
        long end = mono_ns() + c->busy_ns;
        while (mono_ns() < end) {}
    }
    if (c->worker_sleep_ns && thread != 0) {   /* a worker off its CPU in the middle of a task */
        struct timespec ts = {c->worker_sleep_ns / 1000000000L, c->worker_sleep_ns % 1000000000L};
        nanosleep(&ts, NULL);
    }
    if (c->nested) {
        inner_ctx ic = {c, t, thread};
        ql_parallel_for(c->nested, c->max_threads, inner_task, &ic);
    }
    atomic_fetch_add(&c->hits[t], 1);
    atomic_fetch_add(&c->outer_done, 1);
}

long ql_pool_check(ptrdiff_t n, int max_threads, int repeat, ptrdiff_t nested, long busy_us, long worker_sleep_us,
                   int *max_thread)
{
    check_ctx c;
    size_t total = (size_t)n + (size_t)n * (size_t)nested;
    c.hits = (atomic_int *)calloc(total ? total : 1, sizeof *c.hits);
    if (!c.hits) return -1;
    c.n = n;
    c.nested = nested;
    c.max_threads = max_threads;
    c.busy_ns = busy_us * 1000L;
    c.worker_sleep_ns = worker_sleep_us * 1000L;
    atomic_init(&c.bad_thread, 0);
    atomic_init(&c.max_thread, 0);
    long bad = 0;
    for (int r = 0; r < repeat; r++) {
        atomic_store(&c.outer_done, 0);
        ql_parallel_for(n, max_threads, check_task, &c);
        /* every task done when the call returns (not merely claimed) */
        if (atomic_load(&c.outer_done) != n) bad++;
    }
    for (size_t i = 0; i < total; i++) bad += atomic_load(&c.hits[i]) != repeat;
    bad += atomic_load(&c.bad_thread);
    *max_thread = atomic_load(&c.max_thread);
    free(c.hits);
    return bad;
}
