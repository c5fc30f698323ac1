/* A persistent pthread pool: ql_parallel_for(n, max_threads, fn, ctx) runs
 * fn(ctx, task, thread) for task = 0..n-1 on up to min(max_threads, ql_num_threads()) threads,
 * the caller being thread 0 (so `thread` < max_threads: size per-thread scratch by it).
 *
 * Dynamic distribution. The callers split their work into more tasks than threads (4 or more
 * per thread), each task writing its own outputs whole, so a result never depends on which
 * thread ran which task. The threads claim tasks one at a time; the caller claims too, and once
 * every task is claimed it waits only for the workers still inside one. A worker that another
 * process keeps off its CPU simply takes fewer tasks (none, if it comes after the last one is
 * claimed): it costs the call at most the task it is in.
 *
 * The job word. One 64-bit atomic holds the whole state a thread needs to join a job or take a
 * task: the tasks not yet claimed (`rem`), the workers inside the job (`active`), how many
 * workers the job admits (`maxw`) and the job's generation (`gen`, which wraps). A worker joins
 * and takes its first task in one compare-and-swap (rem - 1, active + 1, only while rem > 0 and
 * active < maxw), so a worker is inside a job only while it holds a task: one preempted between
 * seeing a job and joining it holds nothing up. Its slot (the `thread` index) is the active count
 * it joined at, plus one: unique, since nobody joins after a worker has left (it leaves when rem
 * is 0). The job's other fields (fn, ctx, n) are read only after joining, when the caller cannot
 * replace them (it posts the next job only when active is 0). No lock on this path: a thread
 * preempted while holding a lock would stall every other thread of the pool for the rest of
 * its time slice, which is what a busy neighbour does. The mutex and condition variables
 * below serve only to sleep and wake.
 *
 * Waiting (the workers for a job, the caller for the workers in it) adapts to the calls: see
 * "Spinning" below. One job at a time: a second caller (another Python thread, the GIL being
 * released, or a task that itself calls ql_parallel_for) finds the pool busy and runs its tasks
 * itself, serially: never a deadlock, never oversubscription. After fork() the child has no
 * workers; the pool is rebuilt on its next use.
 */
#define _GNU_SOURCE
#include "qlinear.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/syscall.h>
#endif

/* the job word's fields: rem [0, 32), active [32, 43), maxw [43, 54), gen [54, 64). Pools have
 * at most 1024 threads (ql_set_num_threads), so active and maxw fit 11 bits; jobs of more than
 * REM_MAX tasks are run as several jobs. */
#define ACT_SHIFT 32
#define MAXW_SHIFT 43
#define GEN_SHIFT 54
#define REM_MAX 0xffffffffULL
#define ACT_ONE (1ULL << ACT_SHIFT)
#define W_REM(w) ((w) & REM_MAX)
#define W_ACT(w) (((w) >> ACT_SHIFT) & 0x7ffULL)
#define W_MAXW(w) (((w) >> MAXW_SHIFT) & 0x7ffULL)
#define W_GEN(w) ((unsigned)((w) >> GEN_SHIFT))

static _Atomic uint64_t job;
/* the current job's other fields: written by the caller before it stores the job word (release),
 * read by workers after joining (acquire) */
static ql_task_fn job_fn;
static void *job_ctx;
static ptrdiff_t job_n, job_base;
static atomic_int job_cpu;        /* the CPU the caller posted the job from (-1: unknown) */

static pthread_mutex_t submit = PTHREAD_MUTEX_INITIALIZER;  /* one job at a time */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;       /* sleeping and waking only */
static pthread_cond_t cv_start = PTHREAD_COND_INITIALIZER;
static pthread_cond_t cv_done = PTHREAD_COND_INITIALIZER;
static atomic_int sleepers;       /* workers asleep on cv_start (or about to be) */
static atomic_int caller_waiting; /* the caller asleep on cv_done (or about to be) */
static atomic_int stopping;

static atomic_int want_threads;   /* requested size (0: not yet decided) */
static int n_workers;             /* running workers (pool size - 1); with `submit` held */
static pthread_t *workers;
/* per worker (index 1..n_workers): its thread id, its CPU set when it started, and whether it
 * is inside a job (set when it joins, cleared before it leaves) */
typedef struct {
    atomic_int tid;
    atomic_int in_job;
    /* the caller's fields (`submit` held): it lent the worker its CPU; the worker's CPU time */
    int lent;
    long cpu0;
#ifdef __linux__
    cpu_set_t cpus;
#endif
} worker_info;
static worker_info *winfo;
static unsigned start_gen;        /* the generation when the workers were created */

/* Spinning. Waking a sleeping thread costs tens of microseconds (more on a virtual CPU, far
 * more when another process holds the CPU the thread is woken on), which back-to-back calls
 * would pay every time; spinning costs a CPU for as long as it lasts. So a worker spins after
 * a job for a window that follows the calls: the window (ns) starts at SPIN_MIN_NS; a worker
 * that blocked and was woken by a job after g ns widens it to 2 g (up to SPIN_MAX_NS) when g
 * was within SPIN_MAX_NS: calls that keep coming find the workers awake; a window that runs
 * out (no job came) halves it, so a pool whose calls stopped soon spins no longer than it did
 * (tens of microseconds). The window counts the time the worker spun on its CPU, not time it
 * spent preempted (a gap of more than PREEMPTED_NS between two looks at the clock): a caller
 * and a worker that another process takes turns with would otherwise see every window run out
 * while the caller waits for its turn, and the worker would sleep between most calls.
 *
 * Why the workers should not sleep between calls when another process is busy: a sleeping
 * worker is woken by the caller, and Linux places a woken thread on its waker's CPU when the
 * other CPUs are no less loaded (wake-affine), which with one busy neighbour on two CPUs is
 * the caller's own: the two then take turns on one CPU (the job runs at one thread's speed)
 * and stay there, since moving either would only swap the imbalance. A worker that finds
 * itself on the CPU its caller posted from (or spins there) moves off it (move_off: its
 * affinity without that CPU, then back to what it was; the kernel moves it at the first call
 * and leaves it at the second), to another CPU where it takes turns with the neighbour
 * instead of with its caller.
 *
 * The caller, once every task is claimed, waits for the workers still in a task: a worker that
 * runs finishes within about one task's time, which the caller knows from its own tasks; so it
 * spins twice its mean task time (within [SPIN_MIN_NS, SPIN_MAX_NS]) and then blocks. Spinning
 * longer would not help a worker that another process preempted: the caller's spinning CPU is
 * the one that worker could move to, and blocking frees it. (Not sched_yield either: the CPU
 * goes to whichever task the scheduler picks, most often the other process, for its whole
 * slice.) */
#define SPIN_MIN_NS 30000L        /* 30 us: the first window, and the floor */
#define SPIN_MAX_NS 1000000L      /* 1 ms: the widest window (beyond: calls too far apart) */
#define PREEMPTED_NS 50000L       /* a gap this long between two looks: the thread was preempted */
#define MOVE_EVERY_NS 2000000L    /* a worker moves off its caller's CPU at most this often */
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

static inline int this_cpu(void) {
#ifdef __linux__
    return sched_getcpu();
#else
    return -1;
#endif
}

static int atfork_done;

/* Tests only (_qlnative.pool_late_workers): a worker waits this many microseconds after each
 * job is posted before it tries to join, as one whose CPU another process holds; 0 in use. */
static atomic_long late_us;

void ql_pool_set_late_us(long us) { atomic_store_explicit(&late_us, us > 0 ? us : 0, memory_order_relaxed); }

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

/* Claims a task of the current job for the caller: its index, or -1 when none is left. */
static ptrdiff_t claim(void) {
    uint64_t w = atomic_load_explicit(&job, memory_order_relaxed);
    while (W_REM(w) > 0)
        if (atomic_compare_exchange_weak_explicit(&job, &w, w - 1, memory_order_relaxed, memory_order_relaxed))
            return job_n - (ptrdiff_t)W_REM(w);
    return -1;
}

/* A worker joins the job in the word (and takes its first task) when it has a task left and
 * room: returns the task index (slot in *slot), or -1. */
static ptrdiff_t join(int *slot, unsigned *gen) {
    uint64_t w = atomic_load_explicit(&job, memory_order_acquire);
    while (W_REM(w) > 0 && W_ACT(w) < W_MAXW(w)) {
        if (atomic_compare_exchange_weak_explicit(&job, &w, w - 1 + ACT_ONE, memory_order_acquire,
                                                  memory_order_acquire)) {
            *slot = (int)W_ACT(w) + 1;
            *gen = W_GEN(w);
            return job_n - (ptrdiff_t)W_REM(w);
        }
    }
    return -1;
}

/* Moves the calling thread off `cpu` (see "Spinning"): 1 if it did. */
static int move_off(int cpu) {
#ifdef __linux__
    cpu_set_t cur, off;
    if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof cur, &cur) != 0) return 0;
    if (!CPU_ISSET(cpu, &cur) || CPU_COUNT(&cur) < 2) return 0;
    off = cur;
    CPU_CLR(cpu, &off);
    if (sched_setaffinity(0, sizeof off, &off) != 0) return 0;
    sched_setaffinity(0, sizeof cur, &cur);
    ql_pool_count(4);
    return 1;
#else
    (void)cpu;
    return 0;
#endif
}

/* spin until the generation moves or the worker has spun `window` ns on its CPU; returns
 * whether it moved. *moved_at: when this worker last moved off its caller's CPU. */
static int spin_for_job(unsigned seen, long window, long *moved_at) {
    long spun = 0, last = now_ns();
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (W_GEN(atomic_load_explicit(&job, memory_order_relaxed)) != seen ||
                atomic_load_explicit(&stopping, memory_order_relaxed))
                return 1;
            cpu_relax();
        }
        long t = now_ns(), d = t - last;
        last = t;
        if (d < PREEMPTED_NS) spun += d;
        if (spun >= window) return W_GEN(atomic_load_explicit(&job, memory_order_acquire)) != seen;
        /* no job for a while, spinning on the CPU the caller last posted from: the caller may
         * be waiting for this CPU (a caller that runs elsewhere posts jobs, and the next one
         * sets job_cpu afresh) */
        if (spun >= SPIN_MIN_NS && t - *moved_at > MOVE_EVERY_NS) {
            int cpu = atomic_load_explicit(&job_cpu, memory_order_relaxed);
            if (cpu >= 0 && this_cpu() == cpu && move_off(cpu)) *moved_at = now_ns();
        }
    }
}

static void *worker(void *arg) {
    int idx = (int)(intptr_t)arg;   /* 1.. */
    worker_info *me = &winfo[idx];
    unsigned seen = start_gen;
    long moved_at = 0;
#ifdef __linux__
    /* the CPU set first, then the thread id (seq_cst): the caller reads the set only after
     * finding the id (lend_cpu, take_back_cpu) */
    if (sched_getaffinity(0, sizeof me->cpus, &me->cpus) == 0) atomic_store(&me->tid, (int)syscall(SYS_gettid));
#endif
    for (;;) {
        long window = atomic_load_explicit(&spin_ns, memory_order_relaxed);
        if (!spin_for_job(seen, window, &moved_at)) {
            if (window > SPIN_MIN_NS)   /* no call came in the window: narrow it */
                atomic_store_explicit(&spin_ns, window / 2 > SPIN_MIN_NS ? window / 2 : SPIN_MIN_NS,
                                      memory_order_relaxed);
            pthread_mutex_lock(&mu);
            atomic_fetch_add(&sleepers, 1);   /* seq_cst: the caller reads it after storing the word */
            long slept = now_ns();
            int slept_once = 0;
            while (W_GEN(atomic_load(&job)) == seen && !atomic_load(&stopping)) {
                if (!slept_once) ql_pool_count(2);
                slept_once = 1;
                pthread_cond_wait(&cv_start, &mu);
            }
            atomic_fetch_sub(&sleepers, 1);
            pthread_mutex_unlock(&mu);
            /* woken by a job g ns after the window ran out: a window of 2 (g + window) would have
             * caught it, as long as calls come that often */
            long gap = now_ns() - slept + window;
            if (slept_once && gap < SPIN_MAX_NS)
                atomic_store_explicit(&spin_ns, 2 * gap < SPIN_MAX_NS ? 2 * gap : SPIN_MAX_NS, memory_order_relaxed);
        }
        if (atomic_load(&stopping)) break;
        seen = W_GEN(atomic_load_explicit(&job, memory_order_relaxed));
        for (long late; (late = atomic_load_explicit(&late_us, memory_order_relaxed)) > 0;) {
            /* tests: late for this job, and again for each job posted meanwhile */
            struct timespec ts = {late / 1000000, (late % 1000000) * 1000};
            nanosleep(&ts, NULL);
            unsigned g = W_GEN(atomic_load_explicit(&job, memory_order_relaxed));
            if (g == seen || atomic_load(&stopping)) break;
            seen = g;
        }
        int slot;
        unsigned g;
        ptrdiff_t t = join(&slot, &g);
        if (t < 0) continue;
        seen = g;
        atomic_store_explicit(&me->in_job, 1, memory_order_relaxed);
        /* on the CPU the caller posted from: the caller is off it (this thread runs there) */
        int cpu = atomic_load_explicit(&job_cpu, memory_order_relaxed);
        if (cpu >= 0 && this_cpu() == cpu && now_ns() - moved_at > MOVE_EVERY_NS && move_off(cpu)) moved_at = now_ns();
        ql_task_fn fn = job_fn;
        void *ctx = job_ctx;
        ptrdiff_t n = job_n, base = job_base, ran = 0;
        uint64_t w = atomic_load_explicit(&job, memory_order_relaxed);
        for (;;) {
            fn(ctx, base + t, slot);
            ran++;
            /* the next task, or leave (the release publishes this worker's outputs to the caller) */
            t = -1;
            while (W_REM(w) > 0)
                if (atomic_compare_exchange_weak_explicit(&job, &w, w - 1, memory_order_relaxed, memory_order_relaxed)) {
                    t = n - (ptrdiff_t)W_REM(w);
                    break;
                }
            if (t < 0) break;
        }
        ql_pool_worker_tasks_add(ran);
        atomic_store_explicit(&me->in_job, 0, memory_order_relaxed);
        uint64_t old = atomic_fetch_sub(&job, ACT_ONE);   /* seq_cst: then reads caller_waiting */
        if (W_ACT(old) == 1 && atomic_load(&caller_waiting)) {
            pthread_mutex_lock(&mu);
            pthread_cond_signal(&cv_done);
            pthread_mutex_unlock(&mu);
        }
    }
    return NULL;
}

static void stop_workers(void) {
    pthread_mutex_lock(&mu);
    atomic_store(&stopping, 1);
    pthread_cond_broadcast(&cv_start);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n_workers; i++) pthread_join(workers[i], NULL);
    free(workers);
    free(winfo);
    workers = NULL;
    winfo = NULL;
    n_workers = 0;
    atomic_store(&stopping, 0);
}

static void after_fork_child(void) {
    /* the workers do not exist in the child: forget them (their memory is leaked) */
    pthread_mutex_init(&submit, NULL);
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&cv_start, NULL);
    pthread_cond_init(&cv_done, NULL);
    workers = NULL;
    winfo = NULL;
    n_workers = 0;
    atomic_store(&stopping, 0);
    atomic_store(&sleepers, 0);
    atomic_store(&caller_waiting, 0);
    /* no task left, no worker inside: the state between jobs */
    atomic_store(&job, atomic_load(&job) & ~(REM_MAX | (0x7ffULL << ACT_SHIFT)));
}

/* with `submit` held: make the pool have want_threads - 1 workers */
static void ensure_workers(void) {
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, after_fork_child);
        atfork_done = 1;
    }
    int need = ql_num_threads() - 1;
    if (n_workers == need) return;
    if (n_workers) stop_workers();
    if (need <= 0) return;
    workers = calloc((size_t)need, sizeof *workers);
    winfo = calloc((size_t)need + 1, sizeof *winfo);
    if (!workers || !winfo) {
        free(workers);
        free(winfo);
        workers = NULL;
        winfo = NULL;
        return;
    }
    start_gen = W_GEN(atomic_load(&job));
    for (int i = 0; i < need; i++) {
        if (pthread_create(&workers[i], NULL, worker, (void *)(intptr_t)(i + 1)) != 0) break;
        n_workers++;
    }
}

/* spins until no worker is in the job (1) or `ns` pass (0) */
static int spin_workers(long ns) {
    long t = now_ns();
    for (int i = 0;; i++) {
        if (W_ACT(atomic_load_explicit(&job, memory_order_acquire)) == 0) return 1;
        if ((i & 63) == 0 && now_ns() - t > ns) return 0;
        cpu_relax();
    }
}

/* CPU time worker i has run (ns), or -1 */
static long worker_cputime(int i) {
    clockid_t cid;
    struct timespec ts;
    if (pthread_getcpuclockid(workers[i - 1], &cid) != 0 || clock_gettime(cid, &ts) != 0) return -1;
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* The caller, about to block for workers still in a task, lends its CPU to those that are not
 * running: a worker that another process preempted waits for that process's time slice to end
 * (milliseconds) while the caller's CPU would stand idle, and Linux does not move a thread that
 * ran a moment ago (it counts as cache-hot) to an idle CPU. A worker is taken as not running
 * when its CPU time advanced by less than half the wall time over PROBE_NS (one that runs keeps
 * its CPU and its caches). The caller sets each such worker's CPU set to its own CPU alone (the
 * kernel moves it there at once), blocks, and afterwards moves it off again (take_back_cpu:
 * the worker's own set without the caller's CPU, then its own set, as move_off). Returns how
 * many it lent its CPU to, or -1 when every worker left meanwhile. */
#define PROBE_NS 20000L
static int lend_cpu(int cpu) {
    int lent = 0;
#ifdef __linux__
    if (cpu < 0 || cpu >= CPU_SETSIZE) return 0;
    long t0 = now_ns();
    for (int i = 1; i <= n_workers; i++)
        winfo[i].cpu0 = atomic_load(&winfo[i].in_job) ? worker_cputime(i) : -1;
    if (spin_workers(PROBE_NS)) return -1;
    long wall = now_ns() - t0;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    for (int i = 1; i <= n_workers; i++) {
        int tid = atomic_load(&winfo[i].tid);
        if (tid <= 0 || winfo[i].cpu0 < 0 || !atomic_load(&winfo[i].in_job) || !CPU_ISSET(cpu, &winfo[i].cpus)) continue;
        long ran = worker_cputime(i) - winfo[i].cpu0;
        if (ran < 0 || 2 * ran >= wall) continue;   /* running: leave it where its caches are */
        if (sched_setaffinity(tid, sizeof one, &one) == 0) {
            winfo[i].lent = 1;
            lent++;
        }
    }
    if (lent) ql_pool_count(5);
#else
    (void)cpu;
#endif
    return lent;
}

static void take_back_cpu(int cpu) {
#ifdef __linux__
    for (int i = 1; i <= n_workers; i++) {
        int tid = atomic_load(&winfo[i].tid);
        if (!winfo[i].lent) continue;
        winfo[i].lent = 0;
        cpu_set_t off = winfo[i].cpus;
        CPU_CLR(cpu, &off);
        if (CPU_COUNT(&off) > 0) sched_setaffinity(tid, sizeof off, &off);
        sched_setaffinity(tid, sizeof winfo[i].cpus, &winfo[i].cpus);
    }
#else
    (void)cpu;
#endif
}

/* Every task is claimed: waits for the workers still in one (the acquire loads see their
 * outputs). The caller ran `ran` tasks in `took` ns. */
static void wait_workers(ptrdiff_t ran, long took) {
    if (W_ACT(atomic_load_explicit(&job, memory_order_acquire)) == 0) return;
    long spin = ran ? 2 * took / ran : SPIN_MAX_NS;
    if (spin < SPIN_MIN_NS) spin = SPIN_MIN_NS;
    if (spin > SPIN_MAX_NS) spin = SPIN_MAX_NS;
    if (spin_workers(spin)) return;
    int cpu = this_cpu(), lent = cpu >= 0 ? lend_cpu(cpu) : 0;
    if (lent < 0) return;
    ql_pool_count(3);
    pthread_mutex_lock(&mu);
    atomic_store(&caller_waiting, 1);   /* seq_cst: then reads the word */
    while (W_ACT(atomic_load(&job)) > 0) pthread_cond_wait(&cv_done, &mu);
    atomic_store(&caller_waiting, 0);
    pthread_mutex_unlock(&mu);
    if (lent) take_back_cpu(cpu);
}

/* Runs tasks [base, base + n) as one job (n <= REM_MAX), `submit` held and workers running. */
static void run_job(ptrdiff_t base, ptrdiff_t n, int threads, ql_task_fn fn, void *ctx) {
    ql_pool_count(0);
    job_fn = fn;
    job_ctx = ctx;
    job_n = n;
    job_base = base;
    atomic_store_explicit(&job_cpu, this_cpu(), memory_order_relaxed);
    uint64_t maxw = (uint64_t)(threads - 1);
    uint64_t w = atomic_load_explicit(&job, memory_order_relaxed);
    w = ((uint64_t)(W_GEN(w) + 1) << GEN_SHIFT) | (maxw << MAXW_SHIFT) | (uint64_t)n;
    atomic_store(&job, w);   /* seq_cst: then reads sleepers */
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&mu);
        pthread_cond_broadcast(&cv_start);
        pthread_mutex_unlock(&mu);
    }
    long t0 = now_ns();
    ptrdiff_t ran = 0;
    for (ptrdiff_t t; (t = claim()) >= 0; ran++) fn(ctx, base + t, 0);
    wait_workers(ran, now_ns() - t0);
}

static void run_inline(ptrdiff_t n_tasks, ql_task_fn fn, void *ctx) {
    ql_pool_count(1);
    for (ptrdiff_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
}

void ql_parallel_for(ptrdiff_t n_tasks, int max_threads, ql_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (n_tasks == 1 || max_threads <= 1 || pthread_mutex_trylock(&submit) != 0) {
        run_inline(n_tasks, fn, ctx);
        return;
    }
    ensure_workers();
    if (n_workers == 0) {
        pthread_mutex_unlock(&submit);
        run_inline(n_tasks, fn, ctx);
        return;
    }
    int threads = max_threads < n_workers + 1 ? max_threads : n_workers + 1;
    for (ptrdiff_t base = 0; base < n_tasks; base += (ptrdiff_t)REM_MAX) {
        ptrdiff_t n = n_tasks - base < (ptrdiff_t)REM_MAX ? n_tasks - base : (ptrdiff_t)REM_MAX;
        run_job(base, n, n < threads ? (int)n : threads, fn, ctx);
    }
    pthread_mutex_unlock(&submit);
}

int ql_pool_worker_tids(int *tids, int n) {
    pthread_mutex_lock(&submit);
    int k = 0;
    for (int i = 1; i <= n_workers && k < n; i++) {
        int tid = atomic_load(&winfo[i].tid);
        if (tid > 0) tids[k++] = tid;
    }
    pthread_mutex_unlock(&submit);
    return k;
}

int ql_num_threads(void) {
    int n = atomic_load_explicit(&want_threads, memory_order_relaxed);
    if (n <= 0) {
        n = default_threads();
        int zero = 0;
        if (!atomic_compare_exchange_strong(&want_threads, &zero, n)) n = zero;
    }
    return n;
}

int ql_set_num_threads(int n) {
    if (n < 1 || n > 1024) return -1;
    pthread_mutex_lock(&submit);
    atomic_store(&want_threads, n);
    /* the old workers stop now (a pool of 1 thread never calls ensure_workers); the new ones
     * start with the next parallel call */
    if (n_workers && n_workers != n - 1) stop_workers();
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
