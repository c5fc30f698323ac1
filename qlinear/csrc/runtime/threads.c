/* A persistent pthread pool: ql_parallel_for(n, max_threads, fn, ctx) runs
 * fn(ctx, task, thread) for task = 0..n-1 on up to min(max_threads, ql_num_threads()) threads,
 * the caller being thread 0 (so `thread` < max_threads: size per-thread scratch by it). Tasks are
 * claimed one at a time from an atomic counter, so a thread slowed by other load on the
 * machine simply takes fewer tasks.
 *
 * Waiting (the workers for a job, the caller for the workers in it) adapts to the calls: see
 * "Spinning" below. Tasks are the callers' own (their results never depend on which thread runs
 * which task), so the split into more tasks than threads is what lets the caller take over
 * the share of a worker that is slow to come (another process holds its CPU).
 *
 * One job at a time: a second caller (another Python thread, the GIL being released, or a
 * task that itself calls ql_parallel_for) finds the pool busy and runs its tasks itself,
 * serially: never a deadlock, never oversubscription. After fork() the child has no workers;
 * the pool is rebuilt on its next use.
 */
#define _GNU_SOURCE
#include "qlinear.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t submit = PTHREAD_MUTEX_INITIALIZER;  /* one job at a time */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_start = PTHREAD_COND_INITIALIZER;
static pthread_cond_t cv_done = PTHREAD_COND_INITIALIZER;

static int want_threads;          /* requested size (0: not yet decided) */
static int n_workers;             /* running workers (pool size - 1) */
static pthread_t *workers;
static atomic_ulong generation;   /* bumped per job (under mu; read without it while spinning) */
static unsigned long start_generation;  /* generation when the current workers were created */
static int stopping;
/* A worker joins the current job only while the caller still runs its tasks (job_closed 0):
 * a worker that wakes after the caller has finished them skips the job, so the caller never
 * waits for a late wake-up (tens of microseconds, more on a loaded machine), only for the
 * workers that took part. job_active counts those (changed under mu, read while spinning). */
static atomic_int job_active;
static int job_closed;
static int sleepers;              /* workers blocked on cv_start */

/* Spinning. Waking a sleeping thread costs tens of microseconds (more on a virtual CPU, far
 * more when another process holds the CPU the thread is woken on), which back-to-back calls
 * would pay every time; spinning costs a CPU for as long as it lasts. So a worker spins after
 * a job for a window that follows the calls: the window (ns) starts at SPIN_MIN_NS; a worker
 * that blocked and was woken by a job after g ns widens it to 2 g (up to SPIN_MAX_NS) when g
 * was within SPIN_MAX_NS: calls that keep coming find the workers awake; a window that runs
 * out (no job came) halves it, so a pool whose calls stopped soon spins no longer than it did
 * (tens of microseconds). The caller, once every task is claimed, waits for the workers still
 * in a task: a worker that runs finishes within about one task's time, which the caller knows
 * from its own tasks; so it spins twice its mean task time (within [SPIN_MIN_NS, SPIN_MAX_NS])
 * and then blocks. Spinning longer would not help a worker that another process preempted:
 * the caller's spinning CPU is the one that worker could move to, and blocking frees it.
 * (Not sched_yield either: the CPU goes to whichever task the scheduler picks, most often the
 * other process, for its whole slice.) */
#define SPIN_MIN_NS 30000L        /* 30 us: the first window, and the floor */
#define SPIN_MAX_NS 1000000L      /* 1 ms: the widest window (beyond: calls too far apart) */
static atomic_long spin_ns = SPIN_MIN_NS;

static inline long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

static inline void cpu_relax(void) {
#if QL_X86 && (defined(__GNUC__) || defined(__clang__))
    __builtin_ia32_pause();
#endif
}
static int atfork_done;

/* Tests only (_qlnative.pool_late_workers): a worker waits this many microseconds after each
 * job is posted before it tries to join, as one whose CPU another process holds; 0 in use. */
static atomic_long late_us;

void ql_pool_set_late_us(long us) { atomic_store_explicit(&late_us, us > 0 ? us : 0, memory_order_relaxed); }

static ql_task_fn job_fn;
static void *job_ctx;
static ptrdiff_t job_n;
static int job_threads;
static atomic_ptrdiff_t job_next;

static int default_threads(void) {
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* runs tasks until none is left; returns how many it ran */
static ptrdiff_t run_tasks(int thread) {
    ptrdiff_t ran = 0;
    for (;; ran++) {
        ptrdiff_t t = atomic_fetch_add_explicit(&job_next, 1, memory_order_relaxed);
        if (t >= job_n) break;
        job_fn(job_ctx, t, thread);
    }
    return ran;
}

/* spin until the generation moves or `window` ns pass; returns whether it moved */
static int spin_for_job(unsigned long seen, long window) {
    long end = now_ns() + window;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (atomic_load_explicit(&generation, memory_order_acquire) != seen) return 1;
            cpu_relax();
        }
        if (now_ns() >= end) return atomic_load_explicit(&generation, memory_order_acquire) != seen;
    }
}

static void *worker(void *arg) {
    int idx = (int)(intptr_t)arg;  /* 1.. */
    pthread_mutex_lock(&mu);
    unsigned long seen = start_generation;  /* not `generation`: a job may already be posted */
    for (;;) {
        long window = 0;   /* spun before blocking (ns) */
        if (generation == seen && !stopping) {
            pthread_mutex_unlock(&mu);
            window = atomic_load_explicit(&spin_ns, memory_order_relaxed);
            int came = spin_for_job(seen, window);
            if (!came && window > SPIN_MIN_NS)   /* no call came in the window: narrow it */
                atomic_store_explicit(&spin_ns, window / 2 > SPIN_MIN_NS ? window / 2 : SPIN_MIN_NS,
                                      memory_order_relaxed);
            pthread_mutex_lock(&mu);
        }
        if (generation == seen && !stopping) {
            ql_pool_count(2);
            long slept = now_ns();
            while (generation == seen && !stopping) {
                sleepers++;
                pthread_cond_wait(&cv_start, &mu);
                sleepers--;
            }
            /* woken by a job g ns after the window ran out: a window of 2 (g + window) would have
             * caught it, as long as calls come that often */
            long gap = now_ns() - slept + window;
            if (!stopping && gap < SPIN_MAX_NS)
                atomic_store_explicit(&spin_ns, 2 * gap < SPIN_MAX_NS ? 2 * gap : SPIN_MAX_NS, memory_order_relaxed);
        }
        if (stopping) break;
        seen = generation;
        for (long late; !stopping && (late = atomic_load_explicit(&late_us, memory_order_relaxed)) > 0;) {
            /* tests: late for this job, and again for each job posted meanwhile */
            pthread_mutex_unlock(&mu);
            struct timespec ts = {late / 1000000, (late % 1000000) * 1000};
            nanosleep(&ts, NULL);
            pthread_mutex_lock(&mu);
            if (generation == seen) break;
            seen = generation;
        }
        if (stopping) break;
        if (idx >= job_threads || job_closed) continue;   /* not in this job (mu still held) */
        atomic_fetch_add_explicit(&job_active, 1, memory_order_relaxed);
        pthread_mutex_unlock(&mu);
        ql_pool_worker_tasks_add(run_tasks(idx));
        pthread_mutex_lock(&mu);
        if (atomic_fetch_sub_explicit(&job_active, 1, memory_order_release) == 1 && job_closed)
            pthread_cond_signal(&cv_done);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

static void stop_workers(void) {
    pthread_mutex_lock(&mu);
    stopping = 1;
    generation++;  /* wakes spinning workers too */
    pthread_cond_broadcast(&cv_start);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n_workers; i++) pthread_join(workers[i], NULL);
    free(workers);
    workers = NULL;
    n_workers = 0;
    stopping = 0;
}

static void after_fork_child(void) {
    /* the workers do not exist in the child: forget them (their memory is leaked) */
    pthread_mutex_init(&submit, NULL);
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&cv_start, NULL);
    pthread_cond_init(&cv_done, NULL);
    workers = NULL;
    n_workers = 0;
    stopping = 0;
    job_active = 0;
    job_closed = 0;
    sleepers = 0;
}

/* with `submit` held: make the pool have want_threads - 1 workers */
static void ensure_workers(void) {
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, after_fork_child);
        atfork_done = 1;
    }
    if (want_threads <= 0) want_threads = default_threads();
    int need = want_threads - 1;
    if (n_workers == need) return;
    if (n_workers) stop_workers();
    if (need <= 0) return;
    workers = calloc((size_t)need, sizeof *workers);
    if (!workers) return;
    pthread_mutex_lock(&mu);
    start_generation = generation;
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < need; i++) {
        if (pthread_create(&workers[i], NULL, worker, (void *)(intptr_t)(i + 1)) != 0) break;
        n_workers++;
    }
}

void ql_parallel_for(ptrdiff_t n_tasks, int max_threads, ql_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (n_tasks == 1 || max_threads <= 1 || pthread_mutex_trylock(&submit) != 0) {
        ql_pool_count(1);
        for (ptrdiff_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    ensure_workers();
    if (n_workers == 0) {
        pthread_mutex_unlock(&submit);
        ql_pool_count(1);
        for (ptrdiff_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    ql_pool_count(0);
    pthread_mutex_lock(&mu);
    job_fn = fn;
    job_ctx = ctx;
    job_n = n_tasks;
    job_threads = n_tasks < n_workers + 1 ? (int)n_tasks : n_workers + 1;
    if (job_threads > max_threads) job_threads = max_threads;
    atomic_store(&job_next, 0);
    job_closed = 0;
    generation++;
    if (sleepers) pthread_cond_broadcast(&cv_start);
    pthread_mutex_unlock(&mu);
    long t0 = now_ns();
    ptrdiff_t ran = run_tasks(0);
    /* every task is claimed: close the job to late workers, then wait for those in it */
    pthread_mutex_lock(&mu);
    job_closed = 1;
    pthread_mutex_unlock(&mu);
    if (atomic_load_explicit(&job_active, memory_order_acquire) > 0) {
        long t1 = now_ns(), spin = ran ? 2 * (t1 - t0) / ran : SPIN_MAX_NS;
        if (spin < SPIN_MIN_NS) spin = SPIN_MIN_NS;
        if (spin > SPIN_MAX_NS) spin = SPIN_MAX_NS;
        for (int i = 0; atomic_load_explicit(&job_active, memory_order_acquire) > 0; i++) {
            if ((i & 63) == 0 && now_ns() - t1 > spin) break;
            cpu_relax();
        }
    }
    pthread_mutex_lock(&mu);
    if (atomic_load_explicit(&job_active, memory_order_acquire) > 0) ql_pool_count(3);
    while (atomic_load_explicit(&job_active, memory_order_acquire) > 0) pthread_cond_wait(&cv_done, &mu);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&submit);
}

int ql_num_threads(void) {
    if (want_threads <= 0) want_threads = default_threads();
    return want_threads;
}

int ql_set_num_threads(int n) {
    if (n < 1 || n > 1024) return -1;
    pthread_mutex_lock(&submit);
    want_threads = n;
    pthread_mutex_unlock(&submit);
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Scratch kept between calls (qlinear.h says why)
 * ------------------------------------------------------------------------------------- */
struct ql_scratch_cache {
    pthread_mutex_t mu;
    size_t max;          /* larger requests are never kept */
    char *block;
    size_t bytes;
};

ql_scratch_cache ql_conv_scratch = {PTHREAD_MUTEX_INITIALIZER, (size_t)8 << 20, NULL, 0};
ql_scratch_cache ql_plain_scratch = {PTHREAD_MUTEX_INITIALIZER, (size_t)32 << 20, NULL, 0};

char *ql_scratch_get(ql_scratch_cache *c, size_t n, int *cached)
{
    *cached = 0;
#if !defined(__SANITIZE_ADDRESS__)
    if (n <= c->max && pthread_mutex_trylock(&c->mu) == 0) {
        if (c->bytes < n) {
            free(c->block);
            c->block = (char *)malloc(n);
            c->bytes = c->block ? n : 0;
        }
        if (c->block) {
            *cached = 1;
            return c->block;
        }
        pthread_mutex_unlock(&c->mu);
    }
#endif
    return (char *)malloc(n);
}

void ql_scratch_put(ql_scratch_cache *c, char *s, int cached)
{
    if (cached) pthread_mutex_unlock(&c->mu);
    else free(s);
}

/* The convolutions' scratch (the depthwise paths, the implicit GEMM's padded copy): kept between
 * calls in ql_conv_scratch, with 64 bytes of slack past the last buffer. */
char *ql_conv_scratch_get(size_t n, int *cached)
{
    return ql_scratch_get(&ql_conv_scratch, n + 64, cached);
}

void ql_conv_scratch_put(char *s, int cached)
{
    ql_scratch_put(&ql_conv_scratch, s, cached);
}
