/* core/runtime/dist.c — data-parallel training over processes launched by mpirun (core/runtime/dist.h).
 *
 * The CPU backend all-reduces with MPI on the arena's host memory; the CUDA backend with NCCL
 * on the device (kernels/cuda/cuda_nccl.cu), its unique id broadcast over MPI. Every MPI call
 * returns its error (MPI_ERRORS_RETURN) and is checked: a failure names the rank and the
 * call. A process that dies is mpirun's to report: it ends the whole job. */
#include "../base/knobs.h"
#include "dist.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef TT_HAVE_MPI
#define OMPI_SKIP_MPICXX 1 /* the C bindings only, also when compiled as C++ (nvcc -x cu) */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#include "../tinytrain.h"
#ifdef TT_HAVE_CUDA
#include "../../kernels/cuda/tt_cuda.h"
#endif

typedef struct dist_state {
  int inited, mpi;           /* tt_dist_init ran; MPI was initialised by it */
  int rank, size, local_rank, local_size;
  double allreduce_seconds;  /* in tt_dist_allreduce_grads */
} dist_state;

/* Process-wide, like MPI itself. */
static dist_state dist_g = {0, 0, 0, 1, 0, 1, 0.0};

/* ---- the watchdog: no collective waits forever ----
 * Every collective this file enters on the host is non-blocking and polled (dist_poll). On
 * entering one, a rank tells every other rank, point to point, how many it has entered (its
 * arrival), and while it waits it repeats that every DIST_BEAT seconds (its heartbeat); a rank
 * that has waited longer than TINYTRAIN_DIST_TIMEOUT seconds (default 300; 0 turns it off)
 * prints a line naming itself, the collective and the rank(s) that did not answer — those that
 * have not arrived at it, or that arrived but have been silent for over DIST_SILENT seconds
 * (stopped inside it) — and ends this process: mpirun then ends the job. A thread started with
 * MPI is the backstop (should MPI itself block): DIST_BACKSTOP seconds after the limit it ends
 * the process with a line that cannot name the rank. It never calls MPI (MPI_THREAD_FUNNELED). */
static double dist_wait_since;       /* tt_now() when the collective in progress began; 0 none */
static const char *dist_wait_what;   /* its name */
static double dist_timeout = 300.0;
#define DIST_BACKSTOP 5.0 /* s: the thread's margin over the limit */
#define DIST_BEAT 0.25    /* s between a waiting rank's heartbeats */
#define DIST_SILENT 1.0   /* s without a word from a rank that arrived: it stopped inside */

static void dist_wait_begin(const char *what) {
  __atomic_store_n(&dist_wait_what, what, __ATOMIC_RELAXED);
  double t = tt_now();
  __atomic_store(&dist_wait_since, &t, __ATOMIC_RELEASE);
}

static void dist_wait_end(void) {
  double z = 0.0;
  __atomic_store(&dist_wait_since, &z, __ATOMIC_RELEASE);
}

double tt_dist_timeout(void) { return tt_knobs_get()->dist_timeout; }

static void *dist_watchdog(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    double since;
    __atomic_load(&dist_wait_since, &since, __ATOMIC_ACQUIRE);
    if (since <= 0.0 || tt_now() - since < dist_timeout + DIST_BACKSTOP) continue;
    const char *what = __atomic_load_n(&dist_wait_what, __ATOMIC_RELAXED);
    char who[64];
    if (dist_g.size == 2) snprintf(who, sizeof who, "rank %d", 1 - dist_g.rank);
    else snprintf(who, sizeof who, "one of the other %d ranks", dist_g.size - 1);
    fprintf(stderr, "tinytrain: rank %d of %d: %s has waited %.0f s for %s, which stopped answering (hung, stopped "
            "or on another path); ending the job. TINYTRAIN_DIST_TIMEOUT=%g sets the limit in seconds (0: none)\n",
            dist_g.rank, dist_g.size, what ? what : "a collective", tt_now() - since, who, dist_timeout);
    fflush(stderr);
    _exit(1);
  }
  return NULL;
}

int tt_dist_rank(void) { return dist_g.rank; }
int tt_dist_size(void) { return dist_g.size; }
int tt_dist_local_rank(void) { return dist_g.local_rank; }
int tt_dist_local_size(void) { return dist_g.local_size; }
double tt_dist_allreduce_seconds(void) { return dist_g.allreduce_seconds; }

/* The number of processes the launcher says it started, 0 when none did (no mpirun). */
static long dist_launched(void) {
  const char *v = getenv("OMPI_COMM_WORLD_SIZE");
  if (!v || !*v) v = getenv("PMI_SIZE");
  if (!v || !*v) return 0;
  long n = strtol(v, NULL, 10);
  return n > 0 ? n : 0;
}

#ifdef TT_HAVE_MPI
static int dist_mpi_fail(tt_err *err, int rc, const char *call) {
  char s[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) len = 0;
  s[len] = 0;
  return tt_fail(err, "rank %d of %d: %s failed: %s (another process of the job may have died: see mpirun's message)",
                 dist_g.rank, dist_g.size, call, len ? s : "unknown MPI error");
}
#define DIST_MPI(err, call)                                        \
  do {                                                             \
    int dist_rc_ = (call);                                         \
    if (dist_rc_ != MPI_SUCCESS) return dist_mpi_fail((err), dist_rc_, #call); \
  } while (0)

/* ---- arrivals and heartbeats (the watchdog's knowledge of who is missing) ---- */
#define DIST_TAG 7474 /* point to point, on MPI_COMM_WORLD, never a collective's */
#define DIST_RING 16  /* send buffers in turn: one is reused only after its sends completed */
static int dist_seq;              /* collectives this rank has entered */
static int *dist_seen;            /* [size]: the latest count heard from each rank */
static double *dist_heard;        /* [size]: tt_now() when each rank was heard from last */
static int *dist_inbox;           /* [size]: the receive posted from each rank */
static MPI_Request *dist_rreq;    /* [size] */
static int dist_out[DIST_RING];   /* what was sent, by slot */
static MPI_Request *dist_sreq;    /* [DIST_RING][size] */
static int dist_slot;

static int dist_arrivals_init(tt_err *err) {
  int n = dist_g.size;
  dist_seen = (int *)tt_calloc((size_t)n, sizeof(int), "rank arrivals", err);
  dist_heard = (double *)tt_calloc((size_t)n, sizeof(double), "rank arrivals", err);
  dist_inbox = (int *)tt_calloc((size_t)n, sizeof(int), "rank arrivals", err);
  dist_rreq = (MPI_Request *)tt_calloc((size_t)n, sizeof(MPI_Request), "rank arrivals", err);
  dist_sreq = (MPI_Request *)tt_calloc((size_t)n * DIST_RING, sizeof(MPI_Request), "rank arrivals", err);
  if (!dist_seen || !dist_heard || !dist_inbox || !dist_rreq || !dist_sreq) return -1;
  for (int i = 0; i < n * DIST_RING; i++) dist_sreq[i] = MPI_REQUEST_NULL;
  double now = tt_now();
  for (int r = 0; r < n; r++) {
    dist_heard[r] = now;
    dist_rreq[r] = MPI_REQUEST_NULL;
    if (r != dist_g.rank) DIST_MPI(err, MPI_Irecv(&dist_inbox[r], 1, MPI_INT, r, DIST_TAG, MPI_COMM_WORLD, &dist_rreq[r]));
  }
  return 0;
}

/* What the other ranks said so far: each one's latest count, and when. */
static int dist_drain(tt_err *err) {
  for (int r = 0; r < dist_g.size; r++) {
    int flag = 1;
    while (r != dist_g.rank && dist_rreq[r] != MPI_REQUEST_NULL) {
      DIST_MPI(err, MPI_Test(&dist_rreq[r], &flag, MPI_STATUS_IGNORE));
      if (!flag) break;
      if (dist_inbox[r] > dist_seen[r]) dist_seen[r] = dist_inbox[r];
      dist_heard[r] = tt_now();
      DIST_MPI(err, MPI_Irecv(&dist_inbox[r], 1, MPI_INT, r, DIST_TAG, MPI_COMM_WORLD, &dist_rreq[r]));
    }
  }
  return 0;
}

/* This rank's count to every other rank. beat: a heartbeat, skipped while the slot's earlier
 * sends are still in flight (an arrival waits for them: they complete as soon as delivered). */
static int dist_tell(int beat, tt_err *err) {
  MPI_Request *q = dist_sreq + (size_t)dist_slot * (size_t)dist_g.size;
  int done = 1;
  if (beat) {
    DIST_MPI(err, MPI_Testall(dist_g.size, q, &done, MPI_STATUSES_IGNORE));
    if (!done) return 0;
  } else {
    DIST_MPI(err, MPI_Waitall(dist_g.size, q, MPI_STATUSES_IGNORE));
  }
  dist_out[dist_slot] = dist_seq;
  for (int r = 0; r < dist_g.size; r++)
    if (r != dist_g.rank) DIST_MPI(err, MPI_Isend(&dist_out[dist_slot], 1, MPI_INT, r, DIST_TAG, MPI_COMM_WORLD, &q[r]));
  dist_slot = (dist_slot + 1) % DIST_RING;
  return 0;
}

/* Entering a collective: under the backstop's clock, counted and told. */
static int dist_arrive(const char *what, tt_err *err) {
  dist_wait_begin(what);
  dist_seq++;
  if (dist_tell(0, err) || dist_drain(err)) return dist_wait_end(), -1;
  return 0;
}

/* The ranks the waiting one lacks, as "rank 2" or "ranks 1, 2", from what they said. */
static void dist_missing(char *who, size_t size) {
  double now = tt_now();
  int k = 0, n = 0;
  for (int r = 0; r < dist_g.size; r++)
    if (r != dist_g.rank && (dist_seen[r] < dist_seq || now - dist_heard[r] > DIST_SILENT)) n++;
  if (n == 0) {
    snprintf(who, size, "one of the other %d ranks", dist_g.size - 1);
    return;
  }
  k = snprintf(who, size, "rank%s", n > 1 ? "s" : "");
  for (int r = 0, i = 0; r < dist_g.size && k > 0 && (size_t)k < size; r++)
    if (r != dist_g.rank && (dist_seen[r] < dist_seq || now - dist_heard[r] > DIST_SILENT))
      k += snprintf(who + k, size - (size_t)k, "%s %d", i++ ? "," : "", r);
}

/* Waits for n requests of the collective just entered, polling: heartbeats out, arrivals in,
 * and past the limit a line naming the ranks that did not answer, then the end of this process. */
static int dist_poll(MPI_Request *req, int n, const char *what, tt_err *err) {
  double t0 = tt_now(), beat = t0;
  long spins = 0;
  for (;;) {
    int done = 0;
    int rc = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return dist_wait_end(), dist_mpi_fail(err, rc, what);
    if (done) break;
    if (++spins < 1000) continue; /* a collective about to complete: no clock, no sleep */
    double now = tt_now();
    if (now - beat >= DIST_BEAT) {
      if (dist_tell(1, err) || dist_drain(err)) return dist_wait_end(), -1;
      beat = now;
    }
    if (dist_timeout > 0 && now - t0 >= dist_timeout) {
      char who[256];
      if (dist_drain(err)) return dist_wait_end(), -1;
      dist_missing(who, sizeof who);
      fprintf(stderr, "tinytrain: rank %d of %d: %s has waited %.0f s for %s, which stopped answering (hung, stopped "
              "or on another path); ending the job. TINYTRAIN_DIST_TIMEOUT=%g sets the limit in seconds (0: none)\n",
              dist_g.rank, dist_g.size, what, now - t0, who, dist_timeout);
      fflush(stderr);
      _exit(1);
    }
    struct timespec ts = {0, 50000}; /* 50 us: the wait costs no core */
    nanosleep(&ts, NULL);
  }
  dist_wait_end();
  return 0;
}

/* Before MPI_Finalize: the sends delivered, the receives withdrawn. */
static void dist_arrivals_end(void) {
  if (!dist_rreq) return;
  MPI_Waitall(dist_g.size * DIST_RING, dist_sreq, MPI_STATUSES_IGNORE);
  for (int r = 0; r < dist_g.size; r++)
    if (dist_rreq[r] != MPI_REQUEST_NULL) {
      MPI_Cancel(&dist_rreq[r]);
      MPI_Wait(&dist_rreq[r], MPI_STATUS_IGNORE);
    }
  free(dist_seen), free(dist_heard), free(dist_inbox), free(dist_rreq), free(dist_sreq);
  dist_seen = NULL, dist_heard = NULL, dist_inbox = NULL, dist_rreq = NULL, dist_sreq = NULL;
}

static int dist_mpi_init(tt_err *err) {
  int flag = 0, provided = 0;
  DIST_MPI(err, MPI_Initialized(&flag));
  if (!flag) DIST_MPI(err, MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided));
  dist_g.mpi = 1;
  DIST_MPI(err, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  DIST_MPI(err, MPI_Comm_rank(MPI_COMM_WORLD, &dist_g.rank));
  DIST_MPI(err, MPI_Comm_size(MPI_COMM_WORLD, &dist_g.size));
  MPI_Comm local;
  DIST_MPI(err, MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, dist_g.rank, MPI_INFO_NULL, &local));
  DIST_MPI(err, MPI_Comm_rank(local, &dist_g.local_rank));
  DIST_MPI(err, MPI_Comm_size(local, &dist_g.local_size));
  DIST_MPI(err, MPI_Comm_free(&local));
  /* TINYTRAIN_DIST_TIMEOUT: read (and refused when malformed) with the other knobs when the
   * command started (main.c) or the session opened; not read again here */
  dist_timeout = tt_dist_timeout();
  if (dist_g.size > 1 && dist_arrivals_init(err)) return -1;
  if (dist_g.size > 1 && dist_timeout > 0) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &a, dist_watchdog, NULL);
    pthread_attr_destroy(&a);
    if (rc) return tt_fail(err, "rank %d: cannot start the collective watchdog thread", dist_g.rank);
  }
  return 0;
}

/* A collective under the watchdog: call is its non-blocking form, started on the request
 * dist_req_, then polled (dist_poll). */
#define DIST_MPI_WAIT(err, what, call)                                                  \
  do {                                                                                  \
    MPI_Request dist_req_ = MPI_REQUEST_NULL;                                           \
    if (dist_arrive(what, (err))) return -1;                                            \
    int dist_wrc_ = (call);                                                             \
    if (dist_wrc_ != MPI_SUCCESS) return dist_wait_end(), dist_mpi_fail((err), dist_wrc_, #call); \
    if (dist_poll(&dist_req_, 1, what, (err))) return -1;                               \
  } while (0)
#endif

int tt_dist_init(tt_err *err) {
  if (dist_g.inited) return 0;
  long n = dist_launched();
#ifdef TT_HAVE_MPI
  if (n > 0 && dist_mpi_init(err)) return -1;
#else
  if (n > 1)
    return tt_fail(err, "started by mpirun as one of %ld processes, but this tinytrain was built without MPI; install "
                   "openmpi-bin and libopenmpi-dev (./configure.py --deps), rerun ./configure.py and ninja", n);
#endif
  dist_g.inited = 1;
  return 0;
}

void tt_dist_end(int failed) {
#ifdef TT_HAVE_MPI
  if (!dist_g.mpi) return;
  dist_g.mpi = 0;
  if (failed && dist_g.size > 1) {
    MPI_Abort(MPI_COMM_WORLD, 1); /* the others may wait in a collective */
    return;
  }
  dist_arrivals_end();
  if (MPI_Finalize() != MPI_SUCCESS) fprintf(stderr, "tinytrain: rank %d: MPI_Finalize failed\n", dist_g.rank);
#else
  (void)failed;
#endif
}

int tt_dist_threads(void) {
#ifdef _OPENMP
  int cores = omp_get_num_procs();
#else
  int cores = 1;
#endif
  int t = cores / (dist_g.local_size > 0 ? dist_g.local_size : 1);
  return t < 1 ? 1 : t;
}

int tt_dist_per_rank_batch(tt_model *model, int ranks, tt_err *err) {
  int b = model->train.batch;
  model->train.ranks = ranks > 1 ? ranks : 1;
  if (ranks <= 1) return 0;
  if (b % ranks)
    return tt_fail(err, "%s: [train] batch %d does not divide among %d ranks; the recipe's batch is the global batch "
                   "(micro-batch x accumulation x ranks): make it a multiple of %d or change the process count",
                   model->path, b, ranks, ranks);
  model->train.batch = b / ranks;
  return 0;
}

static int dist_on_cuda(const tt_exec *x) { return !strcmp(x->be->name, "cuda"); }

size_t tt_dist_grad_bytes(const tt_program *p) {
  size_t n = 0;
  for (int k = 0; p && k < p->nparams; k++)
    if (p->grad_buf[k] >= 0) n += p->bufs[p->grad_buf[k]].bytes;
  return n;
}

/* Broadcasts an fp32 buffer of the arena from rank 0, in place. */
static int dist_bcast(tt_exec *x, const tt_program *p, int buf, tt_err *err) {
  float *ptr = (float *)tt_exec_ptr(x, p, buf);
  size_t count = p->bufs[buf].bytes / sizeof(float);
#ifdef TT_HAVE_CUDA
  if (dist_on_cuda(x)) {
    if (tt_cuda_nccl_broadcast(x->be, ptr, count, 0))
      return tt_fail(err, "rank %d: broadcast of '%s' failed: %s", dist_g.rank, p->bufs[buf].name, x->be->last_error(x->be));
    return 0;
  }
#endif
#ifdef TT_HAVE_MPI
  DIST_MPI_WAIT(err, "the broadcast of the parameters", MPI_Ibcast(ptr, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD, &dist_req_));
  return 0;
#else
  (void)ptr, (void)count;
  return tt_fail(err, "internal error: a broadcast without MPI");
#endif
}

/* Rank 0's parameter buffers to every rank: the work queued on the device first (the CPU
 * backend's arena is read by MPI directly), NCCL's calls grouped. which: 1 every parameter,
 * 2 batch-norm running statistics. */
static int dist_params(tt_exec *x, int which, tt_err *err) {
  const tt_program *p = x->train ? x->train : x->eval;
  int cuda = dist_on_cuda(x);
  if (!cuda && x->be->sync(x->be)) return tt_fail(err, "rank %d: %s: %s", dist_g.rank, x->be->name, x->be->last_error(x->be));
#ifdef TT_HAVE_CUDA
  if (cuda && tt_cuda_nccl_group(x->be, 0)) return tt_fail(err, "rank %d: %s", dist_g.rank, x->be->last_error(x->be));
#endif
  for (int k = 0; k < p->nparams; k++) {
    tt_param_role role = x->g->params[k].role;
    int buf = p->param_buf[k];
    if (buf < 0 || (which == 2 && role != TT_PR_BN_MEAN && role != TT_PR_BN_VAR)) continue;
    if (p->bufs[buf].host) /* offload 2 (core/compile/offload.h): the search plans it for one process only */
      return tt_fail(err, "rank %d: the fp32 master '%s' is planned in pinned host memory, which multi-process training does "
                     "not broadcast; plan without master offload (--host-mem 0)", dist_g.rank, p->bufs[buf].name);
    if (dist_bcast(x, p, buf, err)) return -1;
  }
#ifdef TT_HAVE_CUDA
  if (cuda && tt_cuda_nccl_group(x->be, 1)) return tt_fail(err, "rank %d: %s", dist_g.rank, x->be->last_error(x->be));
#endif
  return 0;
}

int tt_dist_broadcast_params(tt_exec *x, int stats_only, tt_err *err) {
  if (dist_g.size <= 1) return 0;
  return dist_params(x, stats_only ? 2 : 1, err);
}

int tt_dist_sum(double *v, int n, tt_err *err) {
  if (dist_g.size <= 1) return 0;
#ifdef TT_HAVE_MPI
  DIST_MPI_WAIT(err, "the sum of the loss and accuracy (MPI_Allreduce)", MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &dist_req_));
#endif
  return 0;
}

int tt_dist_agree(const tt_dist_field *f, int n, tt_err *err) {
  if (dist_g.size <= 1 || n <= 0) return 0;
#ifdef TT_HAVE_MPI
  unsigned long long *all = (unsigned long long *)tt_malloc(sizeof *all * (size_t)n * (size_t)dist_g.size, "rank check", err);
  unsigned long long *mine = (unsigned long long *)tt_malloc(sizeof *mine * (size_t)n, "rank check", err);
  if (!all || !mine) return free(all), free(mine), -1;
  for (int i = 0; i < n; i++) mine[i] = f[i].value;
  const char *what = "the check that the ranks agree (MPI_Allgather)";
  MPI_Request req = MPI_REQUEST_NULL;
  if (dist_arrive(what, err)) return free(all), free(mine), -1;
  int rc = MPI_Iallgather(mine, n, MPI_UNSIGNED_LONG_LONG, all, n, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return dist_wait_end(), free(all), free(mine), dist_mpi_fail(err, rc, "MPI_Iallgather");
  rc = dist_poll(&req, 1, what, err);
  free(mine);
  if (rc) return free(all), -1;
  for (int r = 1; r < dist_g.size; r++)
    for (int i = 0; i < n; i++) {
      unsigned long long a = all[i], b = all[(size_t)r * (size_t)n + (size_t)i];
      if (a == b) continue;
      free(all);
      if (f[i].hash)
        return tt_fail(err, "rank %d of %d: %s differs from rank 0's (%s); every rank must be started with the same "
                       "recipe, options and data", r, dist_g.size, f[i].name, f[i].hash);
      return tt_fail(err, "rank %d of %d: %s is %lld but %lld on rank 0; every rank must be started with the same "
                     "recipe, options and data", r, dist_g.size, f[i].name, (long long)b, (long long)a);
    }
  free(all);
#else
  (void)f, (void)err;
#endif
  return 0;
}

int tt_dist_max(int *v, tt_err *err) {
  if (dist_g.size <= 1) return 0;
#ifdef TT_HAVE_MPI
  DIST_MPI_WAIT(err, "the step-end exchange (MPI_Allreduce)", MPI_Iallreduce(MPI_IN_PLACE, v, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &dist_req_));
#endif
  return 0;
}

#ifdef TT_HAVE_CUDA
/* Between the CUDA backend's creation and the schedule: the NCCL communicator (rank 0's unique
 * id broadcast over MPI), and the device memory it took added to the reserve the plan keeps. */
int tt_dist_cuda_attach(tt_backend *be, size_t *reserve, tt_err *err) {
  if (dist_g.size <= 1) return 0;
  unsigned char id[TT_CUDA_NCCL_ID_BYTES];
  size_t taken = 0;
  memset(id, 0, sizeof id);
  if (dist_g.rank == 0 && tt_cuda_nccl_id(be, id)) return tt_fail(err, "rank 0: %s", be->last_error(be));
#ifdef TT_HAVE_MPI
  DIST_MPI_WAIT(err, "the NCCL id broadcast", MPI_Ibcast(id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD, &dist_req_));
#endif
  if (tt_cuda_nccl_init(be, id, dist_g.size, dist_g.rank, &taken))
    return tt_fail(err, "rank %d: %s", dist_g.rank, be->last_error(be));
  *reserve += taken;
  return 0;
}

int tt_dist_cuda_select(tt_err *err) {
  if (dist_g.size <= 1) return 0;
  if (tt_cuda_select_device(dist_g.local_rank, err ? err->msg : NULL, err ? sizeof err->msg : 0)) return -1;
  return 0;
}
#endif

/* ---- the gradient all-reduce in buckets, overlapping backward ---- */

typedef struct dist_bucket {
  size_t off, bytes; /* a run of gradients end to end in the arena (with their alignment padding) */
  int ready;         /* the step of the micro-step after which backward no longer writes any of them */
} dist_bucket;

struct tt_dist_buckets {
  tt_exec *x;
  int n, next;       /* buckets (in the order they become ready); the next one to start */
  int cuda;
  dist_bucket *b;
#ifdef TT_HAVE_MPI
  MPI_Request *req;  /* [n] */
#endif
};

/* A bucket closes once it holds a quarter of the gradients, at least 256 KiB and at most 25 MiB
 * (PyTorch DDP's default): a few buckets for a small model, 25 MiB messages for a large one.
 * TINYTRAIN_DIST_BUCKET=BYTES sets it (tests: many buckets on a small model). */
static size_t dist_bucket_cap(size_t total) {
  size_t cap = total / 4, lo = (size_t)256 << 10, hi = (size_t)25 << 20;
  if (tt_knobs_get()->dist_bucket) return tt_knobs_get()->dist_bucket;
  return cap < lo ? lo : cap > hi ? hi : cap;
}

/* For each parameter, the last step of the micro-step that writes its gradient. */
static int *dist_ready_steps(const tt_program *p, tt_err *err) {
  int *ready = (int *)tt_malloc(sizeof(int) * (size_t)(p->nparams + 1), "bucket plan", err);
  if (!ready) return NULL;
  for (int k = 0; k < p->nparams; k++) ready[k] = -1;
  for (int i = 0; i < p->micro_end; i++)
    for (int j = 0; j < p->steps[i].nout; j++) {
      int o = p->steps[i].out[j];
      if (o >= 0 && p->bufs[o].cls == TT_BC_GRADS && p->bufs[o].param >= 0 && p->bufs[o].param < p->nparams)
        ready[p->bufs[o].param] = i;
    }
  return ready;
}

/* The buckets of p from the last parameter back (the order backward finishes them, roughly),
 * ordered by the step they are ready after; b NULL: only counted. Returns their number. */
static int dist_plan_buckets(const tt_program *p, dist_bucket *b, tt_err *err) {
  int *ready = dist_ready_steps(p, err);
  if (!ready) return -1;
  size_t cap = dist_bucket_cap(tt_dist_grad_bytes(p)), end = 0;
  dist_bucket cur;
  int n = 0, open = 0;
  memset(&cur, 0, sizeof cur);
  for (int k = p->nparams - 1; k >= 0; k--) {
    const tt_buf *g = p->grad_buf[k] >= 0 ? &p->bufs[p->grad_buf[k]] : NULL;
    if (!g) continue;
    if (!g->persistent) { /* lower.c keeps them persistent when train.ranks > 1 */
      free(ready);
      return tt_fail(err, "internal error: the gradient of '%s' is transient, not in the region the all-reduce sums",
                     g->name);
    }
    if (open && g->offset + g->bytes > cur.off) {
      free(ready);
      return tt_fail(err, "internal error: the gradient of '%s' does not lie before the next one in the arena", g->name);
    }
    if (!open) end = g->offset + g->bytes, cur.ready = -1, open = 1;
    cur.off = g->offset;
    if (ready[k] > cur.ready) cur.ready = ready[k];
    if (end - cur.off >= cap) {
      cur.bytes = end - cur.off, open = 0;
      if (b) b[n] = cur;
      n++;
    }
  }
  if (open) {
    cur.bytes = end - cur.off;
    if (b) b[n] = cur;
    n++;
  }
  free(ready);
  for (int i = 1; b && i < n; i++) /* by ready step, stable: every rank starts them in the same order */
    for (int j = i; j > 0 && b[j - 1].ready > b[j].ready; j--) {
      dist_bucket t = b[j];
      b[j] = b[j - 1], b[j - 1] = t;
    }
  return n;
}

int tt_dist_bucket_count(const tt_program *p) { return dist_plan_buckets(p, NULL, NULL); }

void tt_dist_buckets_destroy(tt_dist_buckets *d) {
  if (!d) return;
  if (d->x && d->x->after_step_ud == d) d->x->after_step = NULL, d->x->after_step_ud = NULL;
  free(d->b);
#ifdef TT_HAVE_MPI
  free(d->req);
#endif
  free(d);
}

int tt_dist_buckets_create(tt_dist_buckets **out, tt_exec *x, tt_err *err) {
  *out = NULL;
  if (dist_g.size <= 1) return 0;
  tt_dist_buckets *d = (tt_dist_buckets *)tt_calloc(1, sizeof *d, "all-reduce buckets", err);
  if (!d) return -1;
  d->x = x, d->cuda = dist_on_cuda(x);
  d->n = dist_plan_buckets(x->train, NULL, err);
  d->b = d->n > 0 ? (dist_bucket *)tt_calloc((size_t)d->n, sizeof(dist_bucket), "all-reduce buckets", err) : NULL;
#ifdef TT_HAVE_MPI
  d->req = d->n > 0 ? (MPI_Request *)tt_calloc((size_t)d->n, sizeof(MPI_Request), "all-reduce requests", err) : NULL;
  if (d->n > 0 && !d->req) d->n = -1;
#endif
  if (d->n < 0 || (d->n > 0 && (!d->b || dist_plan_buckets(x->train, d->b, err) != d->n))) {
    tt_dist_buckets_destroy(d);
    return -1;
  }
  *out = d;
  return 0;
}

/* Starts bucket k's in-place sum: NCCL on its own stream after the compute stream's work so
 * far, or a non-blocking MPI all-reduce on the CPU backend's (synchronous) arena. */
static int dist_bucket_start(tt_dist_buckets *d, int k, tt_err *err) {
  tt_exec *x = d->x;
  float *ptr = (float *)(x->base + d->b[k].off);
  size_t count = d->b[k].bytes / sizeof(float);
#ifdef TT_HAVE_CUDA
  if (d->cuda) {
    if (tt_cuda_nccl_allreduce_async(x->be, ptr, count))
      return tt_fail(err, "rank %d: the all-reduce of gradient bucket %d failed: %s", dist_g.rank, k, x->be->last_error(x->be));
    return 0;
  }
#endif
  if (x->be->sync(x->be)) return tt_fail(err, "rank %d: %s: %s", dist_g.rank, x->be->name, x->be->last_error(x->be));
#ifdef TT_HAVE_MPI
  DIST_MPI(err, MPI_Iallreduce(MPI_IN_PLACE, ptr, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &d->req[k]));
  return 0;
#else
  (void)ptr, (void)count;
  return tt_fail(err, "internal error: an all-reduce without MPI");
#endif
}

/* exec's after_step during the last micro-step: the buckets ready by now start; on the CPU,
 * MPI is entered so that the ones in flight progress (it has no progress thread). */
static int dist_after_step(void *ud, int step, tt_err *err) {
  tt_dist_buckets *d = (tt_dist_buckets *)ud;
  double t0 = tt_now();
  while (d->next < d->n && d->b[d->next].ready <= step)
    if (dist_bucket_start(d, d->next++, err)) return -1;
#ifdef TT_HAVE_MPI
  int done = 0;
  if (!d->cuda && d->next > 0) DIST_MPI(err, MPI_Testall(d->next, d->req, &done, MPI_STATUSES_IGNORE));
#endif
  dist_g.allreduce_seconds += tt_now() - t0;
  return 0;
}

void tt_dist_allreduce_begin(tt_dist_buckets *d) {
  if (!d) return;
  d->next = 0;
#ifdef TT_HAVE_MPI
  for (int k = 0; k < d->n; k++) d->req[k] = MPI_REQUEST_NULL;
#endif
  d->x->after_step = dist_after_step, d->x->after_step_ud = d;
}

int tt_dist_allreduce_end(tt_dist_buckets *d, tt_err *err) {
  if (!d) return 0;
  double t0 = tt_now();
  d->x->after_step = NULL, d->x->after_step_ud = NULL;
  while (d->next < d->n)
    if (dist_bucket_start(d, d->next++, err)) return -1;
#ifdef TT_HAVE_CUDA
  if (d->cuda && tt_cuda_nccl_join(d->x->be))
    return tt_fail(err, "rank %d: the gradient all-reduce failed: %s", dist_g.rank, d->x->be->last_error(d->x->be));
#endif
#ifdef TT_HAVE_MPI
  if (!d->cuda && d->n > 0 && (dist_arrive("the gradient all-reduce", err) || dist_poll(d->req, d->n, "the gradient all-reduce", err)))
    return -1;
#endif
  dist_g.allreduce_seconds += tt_now() - t0;
  return 0;
}
