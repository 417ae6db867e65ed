/* The compiled engine: a repeated small allreduce's node-local steps in one call.
 *
 * collectives.lean runs a repeated allreduce whose inputs fit the shared window's
 * small regions as: copy this rank's input into its region, post the call's
 * sequence number beside its signature, arrive at the barrier, wait for the
 * others, compare their posted signatures, reduce every rank's region in rank
 * order. In Python those are a dozen interpreter calls; here they are one.
 *
 * Only what gives the same bits as numpy's ufuncs is done here: sums and
 * products of float32 and float64 (IEEE arithmetic, one rounding a step, the
 * same order as collectives.execute_shared.SharedExecutor.reduce), and integer
 * sums, products, min, max and bit operations (wrapping as numpy's do); and the
 * reproducible sum of every rank's raw float32 or float64 contribution (ops
 * repro_sum and repro_avg, which combine all ranks' at once, not two at a time:
 * the arithmetic of repro_sum_rows below). Anything else stays on the Python path
 * (collectives.engine.kernel says which).
 *
 * The barrier numbers are the shared control window's: a rank's own number is
 * stored with release order after its data and its posted sequence number, and
 * the peers' are loaded with acquire order, so a peer that sees the number sees
 * the data, on any processor (C11 atomics rather than x86's store order alone).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum { DONE = 0, LATE = 1, MISMATCH = 2 };
/* A barrier's spin before it yields the core, adapted to how late the peers come: a yield where another
 * process wants the core costs a time slice (milliseconds), so a barrier spins up to SPIN_MOST_S while
 * its peers come within the spin; where they come later (a peer shares its core with another process),
 * the spin halves down to SPIN_LEAST_S, so that the core goes to the peer soon. */
#define SPIN_MOST_S 20e-6
#define SPIN_LEAST_S 1e-6
enum { MAX_RANKS = 64 };

typedef enum { F32, F64, I8, U8, I16, U16, I32, U32, I64, U64 } Kind;
typedef enum { SUM, PROD, MIN, MAX, BAND, BOR, BXOR, REPRO_SUM, REPRO_AVG } Op;

/* A node's shared-memory barrier as the Python one keeps it (MPISharedMemory): every rank's number in
 * the control window, this rank's state (arrived at, passed, digest posted by parity), the posted
 * signatures; and how long to spin before the caller waits on in Python. */
typedef struct {
    int64_t *numbers;           /* the control window, as int64 words */
    int64_t *state;             /* the barrier's state: arrived at, passed, digest posted by parity */
    Py_buffer control, state_buffer;
    int size, rank;
    Py_ssize_t own_slot;
    Py_ssize_t peer_slots[MAX_RANKS];
    Py_ssize_t own_words[2];                /* this rank's posted sequence number, by parity */
    Py_ssize_t peer_words[2][MAX_RANKS];    /* the peers', by parity */
    Py_ssize_t digest_offset;               /* from a posted sequence number to its digest */
    Py_ssize_t message_bytes;               /* a posted signature's room */
    long spin_polls;
    double spin_seconds;
    double spin_budget; /* how long the next wait spins before it yields (adapted: meeting_pass) */
} Meeting;

typedef struct {
    PyObject_HEAD
    Meeting m;
    Py_buffer regions[2][MAX_RANKS]; /* by turn, every rank's small region */
    Py_ssize_t nbytes, count;
    Kind kind;
    Op op;
    int mode;                      /* what follows the barrier: see the modes below */
    int root;                      /* a broadcast's or reduce's root */
    Py_ssize_t lo, out_count;      /* a reduce-scatter's share: elements lo to lo + out_count */
    Py_ssize_t out_nbytes;         /* the output's bytes */
    long long runs; /* calls that arrived at a barrier (for tests and benchmarks) */
} SmallAllreduce;

/* What a small call does after its barrier: every rank's region reduced (allreduce), one share of them
 * reduced (reduce-scatter, read from the regions alone, so an output over the input is safe), every
 * rank's region copied out in rank order (all-gather, of bytes whatever the dtype; of none, a barrier),
 * the root's region copied out (broadcast, of bytes; only the root copies in), or, at the root alone,
 * every rank's region reduced (reduce; the others' output is not written). */
enum { SMALL_ALLREDUCE, SMALL_REDUCE_SCATTER, SMALL_ALLGATHER, SMALL_BROADCAST, SMALL_REDUCE };

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* a NaN with its quiet bit set: what an arithmetic instruction makes of a NaN operand */
static inline float quiet_float(float a) {
    uint32_t u;
    memcpy(&u, &a, sizeof u);
    u |= UINT32_C(0x00400000);
    memcpy(&a, &u, sizeof u);
    return a;
}
static inline double quiet_double(double a) {
    uint64_t u;
    memcpy(&u, &a, sizeof u);
    u |= UINT64_C(0x0008000000000000);
    memcpy(&a, &u, sizeof u);
    return a;
}

/* the loops over many elements, built also for the x86-64 levels with wide vectors where the compiler
 * can (GCC on Linux), the processor's chosen at load: the same arithmetic, so the same bits */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && __GNUC__ >= 11
#define WIDE_LOOP __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define WIDE_LOOP
#endif

/* out = a op b, elementwise, one rounding per element, as numpy's loops. Where a is NaN the result
 * is a (quieted), as the processor gives for numpy's a + b: said outright, as the compiler may swap
 * the operands of a commutative + or * and so hand back b's. Eight lanes at a time through vector
 * types (loads before the store, so out may be a or b), the choice of a NaN as a mask. */
#define FLOAT_LOOP(T, BITS, QUIET)                                                                  \
    typedef T T##_lanes __attribute__((vector_size(8 * sizeof(T))));                                \
    typedef BITS T##_masks __attribute__((vector_size(8 * sizeof(T))));                             \
    WIDE_LOOP static void reduce_##T(T *out, const T *a, const T *b, Py_ssize_t n, Op op) {         \
        Py_ssize_t i = 0;                                                                           \
        const T##_masks quiet = {QUIET, QUIET, QUIET, QUIET, QUIET, QUIET, QUIET, QUIET};           \
        for (; i + 8 <= n; i += 8) {                                                                \
            T##_lanes x, y, z;                                                                      \
            memcpy(&x, a + i, sizeof x);                                                            \
            memcpy(&y, b + i, sizeof y);                                                            \
            z = op == SUM ? x + y : x * y;                                                          \
            T##_masks nan = x != x;                                                                 \
            T##_masks r = (nan & ((T##_masks)x | quiet)) | (~nan & (T##_masks)z);                   \
            memcpy(out + i, &r, sizeof r);                                                          \
        }                                                                                           \
        for (; i < n; i++) {                                                                        \
            out[i] = a[i] != a[i] ? quiet_##T(a[i]) : op == SUM ? a[i] + b[i] : a[i] * b[i];        \
        }                                                                                           \
    }
FLOAT_LOOP(float, int32_t, INT32_C(0x00400000))
FLOAT_LOOP(double, int64_t, INT64_C(0x0008000000000000))

/* integers add and multiply as unsigned words: numpy wraps, and signed overflow is undefined in C */
#define INT_LOOP(NAME, T, U)                                                                   \
    WIDE_LOOP static void reduce_##NAME(T *out, const T *a, const T *b, Py_ssize_t n, Op op) { \
        switch (op) {                                                                          \
        case SUM: for (Py_ssize_t i = 0; i < n; i++) out[i] = (T)((U)a[i] + (U)b[i]); break;   \
        case PROD: for (Py_ssize_t i = 0; i < n; i++) out[i] = (T)((U)a[i] * (U)b[i]); break;  \
        case MIN: for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] < b[i] ? a[i] : b[i]; break; \
        case MAX: for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] > b[i] ? a[i] : b[i]; break; \
        case BAND: for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] & b[i]; break;             \
        case BOR: for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] | b[i]; break;              \
        case BXOR: for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] ^ b[i]; break;             \
        default: break; /* the pair ops take floats only */                                    \
        }                                                                                      \
    }
INT_LOOP(i8, int8_t, uint8_t)
INT_LOOP(u8, uint8_t, uint8_t)
INT_LOOP(i16, int16_t, uint16_t)
INT_LOOP(u16, uint16_t, uint16_t)
INT_LOOP(i32, int32_t, uint32_t)
INT_LOOP(u32, uint32_t, uint32_t)
INT_LOOP(i64, int64_t, uint64_t)
INT_LOOP(u64, uint64_t, uint64_t)

static void repro_rows_all(Kind kind, const void *const *rows, Py_ssize_t size, void *out, Py_ssize_t n, double by);

/* whether op combines every rank's contribution at once (its calls pass them all: reduce_rows) */
static inline int whole_op(Op op) { return op == REPRO_SUM || op == REPRO_AVG; }

/* out = every one of `size` rows combined at once by a whole op (repro_avg: divided by size) */
static void reduce_rows(Kind kind, Op op, void *out, const void *const *rows, int size, Py_ssize_t n) {
    repro_rows_all(kind, rows, size, out, n, op == REPRO_AVG ? (double)size : 1.0);
}

static void reduce_pair(Kind kind, Op op, void *out, const void *a, const void *b, Py_ssize_t n) {
    if (whole_op(op)) { /* two rows are all there are */
        const void *rows[2] = {a, b};
        reduce_rows(kind, op, out, rows, 2, n);
        return;
    }
    switch (kind) {
    case F32: reduce_float(out, a, b, n, op); break;
    case F64: reduce_double(out, a, b, n, op); break;
    case I8: reduce_i8(out, a, b, n, op); break;
    case U8: reduce_u8(out, a, b, n, op); break;
    case I16: reduce_i16(out, a, b, n, op); break;
    case U16: reduce_u16(out, a, b, n, op); break;
    case I32: reduce_i32(out, a, b, n, op); break;
    case U32: reduce_u32(out, a, b, n, op); break;
    case I64: reduce_i64(out, a, b, n, op); break;
    case U64: reduce_u64(out, a, b, n, op); break;
    }
}

/* out = region[0] op region[1] op ... in rank order, as SharedExecutor.reduce: the same bits. `own`:
 * this rank's input where it is still at hand (else NULL), read in place of its region's copy: the
 * input is hot in this core's cache, while the copy is the line the peers read at the same time
 * (measured at 2 ranks: the copy read too made the reduction 2.2x slower at 64 and 256 KiB). */
static void reduce_regions(SmallAllreduce *self, int turn, void *out, const void *own) {
    Py_buffer *regions = self->regions[turn];
    int rank = self->m.rank;
    if (own && !whole_op(self->op) && self->m.size > 1 && (rank < 2 || own != out)) {
        /* (from rank 2 on, an input that is the output is overwritten by the first pair) */
        const void *first = rank == 0 ? own : regions[0].buf, *second = rank == 1 ? own : regions[1].buf;
        reduce_pair(self->kind, self->op, out, first, second, self->count);
        for (int r = 2; r < self->m.size; r++)
            reduce_pair(self->kind, self->op, out, out, r == rank ? own : regions[r].buf, self->count);
        return;
    }
    if (self->m.size == 1) {
        memmove(out, regions[0].buf, (size_t)self->nbytes);
        return;
    }
    if (whole_op(self->op)) {
        const void *rows[MAX_RANKS];
        for (int r = 0; r < self->m.size; r++) rows[r] = regions[r].buf;
        reduce_rows(self->kind, self->op, out, rows, self->m.size, self->count);
        return;
    }
    reduce_pair(self->kind, self->op, out, regions[0].buf, regions[1].buf, self->count);
    for (int r = 2; r < self->m.size; r++) reduce_pair(self->kind, self->op, out, out, regions[r].buf, self->count);
}

static int parse_kind(const char *dtype, Kind *kind) {
    static const struct { const char *name; Kind kind; } kinds[] = {
        {"float32", F32}, {"float64", F64}, {"int8", I8}, {"uint8", U8}, {"int16", I16},
        {"uint16", U16}, {"int32", I32}, {"uint32", U32}, {"int64", I64}, {"uint64", U64},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(dtype, kinds[i].name) == 0) {
            *kind = kinds[i].kind;
            return 1;
        }
    return 0;
}

static int parse_op(const char *name, Kind kind, Op *op) {
    enum { INTEGERS, ALL, FLOATS }; /* the kinds an op takes */
    static const struct { const char *name; Op op; int kinds; } ops[] = {
        {"sum", SUM, ALL}, {"prod", PROD, ALL}, {"min", MIN, INTEGERS}, {"max", MAX, INTEGERS},
        {"band", BAND, INTEGERS}, {"bor", BOR, INTEGERS}, {"bxor", BXOR, INTEGERS},
        {"repro_sum", REPRO_SUM, FLOATS}, {"repro_avg", REPRO_AVG, FLOATS},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(name, ops[i].name) == 0) {
            int floating = kind == F32 || kind == F64;
            if ((ops[i].kinds == INTEGERS && floating) || (ops[i].kinds == FLOATS && !floating)) return 0;
            *op = ops[i].op;
            return 1;
        }
    return 0;
}

static int reduces(PyObject *module, PyObject *const *args, Py_ssize_t nargs, int *answer) {
    (void)module;
    const char *dtype, *op_name;
    if (nargs != 2 || !(dtype = PyUnicode_AsUTF8(args[0])) || !(op_name = PyUnicode_AsUTF8(args[1]))) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "reduces(dtype: str, op: str)");
        return -1;
    }
    Kind kind;
    Op op;
    *answer = parse_kind(dtype, &kind) && parse_op(op_name, kind, &op);
    return 0;
}

static PyObject *engine_reduces(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    int answer;
    if (reduces(module, args, nargs, &answer) < 0) return NULL;
    return PyBool_FromLong(answer);
}

static void meeting_release(Meeting *m) {
    if (m->control.obj) PyBuffer_Release(&m->control);
    if (m->state_buffer.obj) PyBuffer_Release(&m->state_buffer);
}

/* every rank's region by half, as buffers: regions_take fills them (each at least `least` bytes) */
static void regions_release(Py_buffer regions[2][MAX_RANKS]) {
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < MAX_RANKS; r++)
            if (regions[h][r].obj) PyBuffer_Release(&regions[h][r]);
    memset(regions, 0, 2 * MAX_RANKS * sizeof(Py_buffer));
}

static int regions_take(Py_buffer regions[2][MAX_RANKS], PyObject *by_half, int size, Py_ssize_t least,
                        const char *short_message) {
    for (int h = 0; h < 2; h++) {
        PyObject *by_rank = PySequence_GetItem(by_half, h);
        if (!by_rank) return -1;
        for (int r = 0; r < size; r++) {
            PyObject *region = PySequence_GetItem(by_rank, r);
            int failed = !region || PyObject_GetBuffer(region, &regions[h][r], PyBUF_WRITABLE) < 0;
            Py_XDECREF(region);
            if (failed || regions[h][r].len < least) {
                Py_DECREF(by_rank);
                if (!failed) PyErr_SetString(PyExc_ValueError, short_message);
                return -1;
            }
        }
        Py_DECREF(by_rank);
    }
    return 0;
}

static void release_all(SmallAllreduce *self) {
    meeting_release(&self->m);
    regions_release(self->regions);
}

static void small_dealloc(SmallAllreduce *self) {
    release_all(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t index_at(PyObject *sequence, Py_ssize_t i) {
    PyObject *item = PySequence_GetItem(sequence, i);
    if (!item) return -1;
    Py_ssize_t value = PyNumber_AsSsize_t(item, PyExc_OverflowError);
    Py_DECREF(item);
    return value;
}

/* The barrier's words: `slots` every rank's number, `words` by parity every rank's posted sequence
 * number (its digest `digest_offset` words on), all indices of the int64 control window. */
static int meeting_init(Meeting *m, PyObject *control, PyObject *state, PyObject *slots, PyObject *words,
                        Py_ssize_t digest_offset, Py_ssize_t message_bytes, int rank, long spin_polls,
                        double spin_seconds) {
    meeting_release(m);
    memset(&m->control, 0, sizeof m->control);
    memset(&m->state_buffer, 0, sizeof m->state_buffer);
    Py_ssize_t size = PySequence_Size(slots);
    if (size < 1 || size > MAX_RANKS || rank < 0 || rank >= size) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "the compiled engine takes 1 to %d ranks, and a rank among them", MAX_RANKS);
        return -1;
    }
    m->size = (int)size;
    m->rank = rank;
    m->spin_polls = spin_polls;
    m->spin_seconds = spin_seconds;
    m->spin_budget = SPIN_MOST_S;
    m->digest_offset = digest_offset;
    if (PyObject_GetBuffer(control, &m->control, PyBUF_WRITABLE) < 0) return -1;
    Py_ssize_t words_in_control = m->control.len / 8;
    if (((uintptr_t)m->control.buf) % 8) {
        PyErr_SetString(PyExc_ValueError, "the control window is not aligned to 8 bytes");
        return -1;
    }
    m->numbers = m->control.buf;
    if (PyObject_GetBuffer(state, &m->state_buffer, PyBUF_WRITABLE) < 0) return -1;
    if (m->state_buffer.len != 4 * 8 || ((uintptr_t)m->state_buffer.buf) % 8) {
        PyErr_SetString(PyExc_ValueError, "the barrier's state is four aligned int64 words");
        return -1;
    }
    m->state = m->state_buffer.buf;
    if (message_bytes < 8 || message_bytes > digest_offset * 8) {
        PyErr_SetString(PyExc_ValueError, "a posted signature's room ends before its digest");
        return -1;
    }
    m->message_bytes = message_bytes;
    int peer = 0;
    for (Py_ssize_t r = 0; r < size; r++) {
        Py_ssize_t slot = index_at(slots, r);
        if (slot < 0 || slot >= words_in_control) goto out_of_window;
        if (r == rank) m->own_slot = slot;
        else m->peer_slots[peer] = slot;
        for (int parity = 0; parity < 2; parity++) {
            PyObject *by_rank = PySequence_GetItem(words, parity);
            if (!by_rank) return -1;
            Py_ssize_t word = index_at(by_rank, r);
            Py_DECREF(by_rank);
            if (word < 0 || word + digest_offset >= words_in_control) goto out_of_window;
            if (r == rank) m->own_words[parity] = word;
            else m->peer_words[parity][peer] = word;
        }
        if (r != rank) peer++;
    }
    return 0;
out_of_window:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a word lies outside the control window");
    return -1;
}

/* The barrier and the reduction from `meeting`: (control, state, slots, words, digest_offset,
 * message_bytes, rank, dtype, op, spin_polls, spin_seconds), as MPISharedMemory gives them. */
static int meeting_parse(Meeting *m, PyObject *meeting, Kind *kind, Op *op) {
    PyObject *control, *state, *slots, *words;
    const char *dtype, *op_name;
    Py_ssize_t digest_offset, message_bytes;
    int rank;
    long spin_polls;
    double spin_seconds;
    if (!PyTuple_Check(meeting) ||
        !PyArg_ParseTuple(meeting, "OOOOnnissld", &control, &state, &slots, &words, &digest_offset, &message_bytes,
                          &rank, &dtype, &op_name, &spin_polls, &spin_seconds)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "meeting is a tuple of the barrier's words and settings");
        return -1;
    }
    if (meeting_init(m, control, state, slots, words, digest_offset, message_bytes, rank, spin_polls,
                     spin_seconds) < 0)
        return -1;
    if (!parse_kind(dtype, kind) || !parse_op(op_name, *kind, op)) {
        PyErr_Format(PyExc_ValueError, "the compiled engine does not reduce %s with %s", dtype, op_name);
        return -1;
    }
    return 0;
}

static Py_ssize_t item_size(Kind kind) {
    return (kind == F64 || kind == I64 || kind == U64) ? 8
           : (kind == F32 || kind == I32 || kind == U32) ? 4
           : (kind == I16 || kind == U16) ? 2 : 1;
}

static int small_init(SmallAllreduce *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"meeting", "regions", "count", "mode", "lo", "hi", "root", NULL};
    PyObject *meeting, *regions;
    Py_ssize_t count, lo = 0, hi = -1;
    int mode = SMALL_ALLREDUCE, root = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOn|inni", names, &meeting, &regions, &count, &mode, &lo, &hi,
                                     &root))
        return -1;
    release_all(self);
    if (meeting_parse(&self->m, meeting, &self->kind, &self->op) < 0) return -1;
    if (hi < 0) hi = count;
    if (count < 0 || mode < SMALL_ALLREDUCE || mode > SMALL_REDUCE || lo < 0 || lo > hi || hi > count ||
        (mode != SMALL_REDUCE_SCATTER && (lo != 0 || hi != count)) || root < 0 || root >= self->m.size) {
        PyErr_SetString(PyExc_ValueError,
                        "a small call's mode is 0 to 4, its share lo:hi lies in its count, and its root is a rank");
        return -1;
    }
    self->mode = mode;
    self->root = root;
    self->count = count;
    self->nbytes = count * item_size(self->kind);
    self->lo = lo;
    self->out_count = mode == SMALL_ALLGATHER ? count * self->m.size : hi - lo;
    self->out_nbytes = self->out_count * item_size(self->kind);
    return regions_take(self->regions, regions, self->m.size, self->nbytes,
                        "a small region is shorter than the call's input");
}

static int get_buffers_of(Py_ssize_t out_nbytes, Py_ssize_t nbytes, PyObject *work, PyObject *source,
                          Py_buffer *out, Py_buffer *in, int writes);

static int get_buffers(Py_ssize_t nbytes, PyObject *work, PyObject *source, Py_buffer *out, Py_buffer *in) {
    return get_buffers_of(nbytes, nbytes, work, source, out, in, 1);
}

/* work (out_nbytes, writable where `writes`) and source (nbytes; may be work), C-contiguous */
static int get_buffers_of(Py_ssize_t out_nbytes, Py_ssize_t nbytes, PyObject *work, PyObject *source,
                          Py_buffer *out, Py_buffer *in, int writes) {
    if (PyObject_GetBuffer(work, out, (writes ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (source == work) {
        *in = *out;
        in->obj = NULL;
    } else if (PyObject_GetBuffer(source, in, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(out);
        return -1;
    }
    if (out->len != out_nbytes || in->len != nbytes) {
        PyErr_Format(PyExc_ValueError, "the compiled call was made for %zd and %zd bytes, not %zd and %zd",
                     out_nbytes, nbytes, out->len, in->len);
        PyBuffer_Release(out);
        if (in->obj) PyBuffer_Release(in);
        return -1;
    }
    return 0;
}

/* The next barrier's number, checked: the previous one was passed. */
static int64_t meeting_next(Meeting *m) {
    int64_t number = m->state[0];
    if (m->state[1] != number) {
        PyErr_SetString(PyExc_RuntimeError, "arrive called before the previous barrier was passed");
        return -1;
    }
    return number + 1;
}

/* Post the call's signature for barrier `number` (digest 0: none): its sequence number stamped into
 * `packed`, the message written only where the digest changed (repeats post it once). */
static int meeting_sign(Meeting *m, int64_t number, long long sequence, PyObject *packed_object, long long digest) {
    if (!digest) return 0;
    if (!packed_object || !PyByteArray_CheckExact(packed_object) || PyByteArray_GET_SIZE(packed_object) < 8 ||
        PyByteArray_GET_SIZE(packed_object) > m->message_bytes) {
        PyErr_SetString(PyExc_TypeError, "a checked call's packed signature is a bytearray that fits a message");
        return -1;
    }
    int parity = (int)(number & 1);
    Py_ssize_t own = m->own_words[parity];
    char *packed = PyByteArray_AS_STRING(packed_object);
    int64_t stamped = (int64_t)sequence;
    memcpy(packed, &stamped, sizeof stamped); /* its sequence number, as the guard's stamp writes it */
    if (m->state[2 + parity] != digest) {      /* the rest of the signature: posted once for repeats */
        memcpy(&m->numbers[own], packed, (size_t)PyByteArray_GET_SIZE(packed_object));
        m->numbers[own + m->digest_offset] = digest;
        m->state[2 + parity] = digest;
    }
    return 0;
}

/* Arrive at barrier `number`, then spin for the peers: DONE passed, LATE still missing after the spin
 * (the caller waits on in Python, whose wait marks it passed). */
static int meeting_pass(Meeting *m, int64_t number) {
    __atomic_store_n(&m->numbers[m->own_slot], number, __ATOMIC_RELEASE);
    m->state[0] = number;
    long polls = 0;
    int yielding = m->spin_polls == 0; /* an oversubscribed node's ranks yield at once */
    double began = 0.0;
    for (int p = 0; p < m->size - 1; p++) {
        while (__atomic_load_n(&m->numbers[m->peer_slots[p]], __ATOMIC_ACQUIRE) < number) {
            polls++;
            if (yielding) { /* the core to a late peer, the interpreter to other threads */
                Py_BEGIN_ALLOW_THREADS
                sched_yield();
                Py_END_ALLOW_THREADS
            }
            if (yielding || (polls & 63) == 0) {
                double t = now_s();
                if (began == 0.0) began = t;
                else if (t - began >= m->spin_seconds) return LATE;
                else if (!yielding && polls > m->spin_polls && t - began >= m->spin_budget) {
                    yielding = 1; /* the peer is slower than the spin: spin less next time */
                    m->spin_budget = m->spin_budget / 2 > SPIN_LEAST_S ? m->spin_budget / 2 : SPIN_LEAST_S;
                }
            }
        }
    }
    if (!yielding && polls) /* passed while spinning: spin a little longer next time, up to the most */
        m->spin_budget = m->spin_budget * 1.25 < SPIN_MOST_S ? m->spin_budget * 1.25 : SPIN_MOST_S;
    m->state[1] = number;
    return DONE;
}

/* Whether every peer posted the same signature for barrier `number` (after passing it). */
static int meeting_signed_alike(Meeting *m, int64_t number, long long sequence, long long digest) {
    int parity = (int)(number & 1);
    for (int p = 0; p < m->size - 1; p++) {
        Py_ssize_t at = m->peer_words[parity][p];
        if (m->numbers[at] != sequence || m->numbers[at + m->digest_offset] != digest) return 0;
    }
    return 1;
}

/* After the barrier: the call's output from every rank's region of `turn` (`own`: this rank's input, or
 * NULL to read its copy), as its mode says. */
static void small_finish(SmallAllreduce *self, int turn, void *out, const void *own) {
    if (self->mode == SMALL_ALLREDUCE) {
        reduce_regions(self, turn, out, own);
        return;
    }
    Py_buffer *regions = self->regions[turn];
    int size = self->m.size;
    if (self->mode == SMALL_ALLGATHER) { /* this rank's part from its input, not its copy (none in place) */
        for (int r = 0; r < size; r++) {
            char *into = (char *)out + r * self->nbytes;
            if (r != self->m.rank || !own) memcpy(into, regions[r].buf, (size_t)self->nbytes);
            else if (into != (const char *)own) memmove(into, own, (size_t)self->nbytes);
        }
        return;
    }
    if (self->mode == SMALL_BROADCAST) { /* the root's own output too: its copy holds its input's bytes */
        memmove(out, regions[self->root].buf, (size_t)self->nbytes);
        return;
    }
    if (self->mode == SMALL_REDUCE) {
        if (self->m.rank == self->root) reduce_regions(self, turn, out, NULL); /* its own part: its copy */
        return;
    }
    Py_ssize_t offset = self->lo * item_size(self->kind), n = self->out_count;
    const char *rows[MAX_RANKS] = {0};
    for (int r = 0; r < size; r++) rows[r] = (const char *)regions[r].buf + offset;
    if (size == 1) memmove(out, rows[0], (size_t)self->out_nbytes);
    else if (whole_op(self->op)) reduce_rows(self->kind, self->op, out, (const void *const *)rows, size, n);
    else {
        reduce_pair(self->kind, self->op, out, rows[0], rows[1], n);
        for (int r = 2; r < size; r++) reduce_pair(self->kind, self->op, out, out, rows[r], n);
    }
}

/* The call of run(): status 0 done, 1 a rank is late, 2 signatures differ; -1 with an exception set. */
static int small_call(SmallAllreduce *self, long turn, PyObject *work, PyObject *source, long long sequence,
                      PyObject *packed_object, long long digest) {
    if (turn != 0 && turn != 1) {
        PyErr_SetString(PyExc_ValueError, "turn is 0 or 1");
        return -1;
    }
    Meeting *m = &self->m;
    int64_t number = meeting_next(m);
    if (number < 0 || meeting_sign(m, number, sequence, packed_object, digest) < 0) return -1;
    Py_buffer out, in;
    int reads_only = self->mode == SMALL_REDUCE && m->rank != self->root; /* its output is not written */
    if (get_buffers_of(self->out_nbytes, self->nbytes, work, source, &out, &in, !reads_only) < 0) return -1;
    if (self->mode != SMALL_BROADCAST || m->rank == self->root)
        memcpy(self->regions[turn][m->rank].buf, in.buf, (size_t)self->nbytes);
    if (digest) m->numbers[m->own_words[number & 1]] = sequence;
    self->runs++;
    int status = meeting_pass(m, number);
    if (status == DONE && digest && !meeting_signed_alike(m, number, sequence, digest)) status = MISMATCH;
    if (status == DONE) small_finish(self, (int)turn, out.buf, in.buf);
    if (in.obj) PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return status;
}

/* work /= the world size, for an average of floats: one correctly rounded division an element, as
 * numpy's true_divide of the array by the size gives it (the Python path's LeanAllreduce._end) */
static int small_divide(SmallAllreduce *self, PyObject *work) {
    Py_buffer out, in;
    if (get_buffers(self->out_nbytes, work, work, &out, &in) < 0) return -1;
    if (self->kind == F32) {
        float *x = out.buf, by = (float)self->m.size;
        for (Py_ssize_t i = 0; i < self->out_count; i++) x[i] /= by;
    } else {
        double *x = out.buf, by = (double)self->m.size;
        for (Py_ssize_t i = 0; i < self->out_count; i++) x[i] /= by;
    }
    PyBuffer_Release(&out);
    return 0;
}

/* run(turn, work, source, sequence, packed, digest) -> 0 done, 1 a rank is late, 2 signatures differ
 *
 * work = the reduction of every rank's source (work may be source), through the next barrier
 * with the signature `packed` (its digest `digest`, its sequence number `sequence`, written into
 * it first) posted; digest 0: the call is not checked (no signature posted or compared). Late:
 * this rank arrived and the caller waits on (the barrier's wait), then calls reduce; differ: the
 * barrier was passed and nothing reduced. */
static PyObject *small_run(SmallAllreduce *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "run(turn, work, source, sequence, packed, digest)");
        return NULL;
    }
    long turn = PyLong_AsLong(args[0]);
    long long sequence = PyLong_AsLongLong(args[3]);
    long long digest = PyLong_AsLongLong(args[5]);
    if ((turn == -1 || sequence == -1 || digest == -1) && PyErr_Occurred()) return NULL;
    int status = small_call(self, turn, args[1], args[2], sequence, args[4], digest);
    return status < 0 ? NULL : PyLong_FromLong(status);
}

/* reduce(turn, work): work = every rank's region of the turn reduced in rank order (after a late barrier) */
static PyObject *small_reduce(SmallAllreduce *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "reduce(turn, work)");
        return NULL;
    }
    long turn = PyLong_AsLong(args[0]);
    if (turn != 0 && turn != 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "turn is 0 or 1");
        return NULL;
    }
    Py_buffer out;
    int reads_only = self->mode == SMALL_REDUCE && self->m.rank != self->root; /* its output is not written */
    if (PyObject_GetBuffer(args[1], &out, (reads_only ? 0 : PyBUF_WRITABLE) | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (out.len != self->out_nbytes) {
        PyErr_Format(PyExc_ValueError, "the compiled call was made for %zd bytes, not %zd", self->out_nbytes, out.len);
        PyBuffer_Release(&out);
        return NULL;
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    small_finish(self, (int)turn, out.buf, NULL); /* the input is not at hand here: its copy */
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* combine(dtype, op, out, a, b): out = a op b, elementwise, the engine's loop (for tests of its bits) */
static PyObject *engine_combine(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    const char *dtype, *op_name;
    if (nargs != 5 || !(dtype = PyUnicode_AsUTF8(args[0])) || !(op_name = PyUnicode_AsUTF8(args[1]))) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "combine(dtype, op, out, a, b)");
        return NULL;
    }
    Kind kind;
    Op op;
    if (!parse_kind(dtype, &kind) || !parse_op(op_name, kind, &op)) {
        PyErr_Format(PyExc_ValueError, "the compiled engine does not reduce %s with %s", dtype, op_name);
        return NULL;
    }
    Py_buffer out, a, b;
    if (PyObject_GetBuffer(args[2], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[3], &a, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    if (PyObject_GetBuffer(args[4], &b, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&a);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t itemsize = (kind == F64 || kind == I64 || kind == U64) ? 8
                          : (kind == F32 || kind == I32 || kind == U32) ? 4
                          : (kind == I16 || kind == U16) ? 2 : 1;
    if (a.len != out.len || b.len != out.len || out.len % itemsize)
        PyErr_SetString(PyExc_ValueError, "combine takes three buffers of one length");
    else {
        reduce_pair(kind, op, out.buf, a.buf, b.buf, out.len / itemsize);
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return result;
}

static PyMethodDef small_methods[] = {
    {"run", (PyCFunction)(void (*)(void))small_run, METH_FASTCALL,
     "run(turn, work, source, sequence, packed, digest) -> 0 done, 1 late, 2 signatures differ"},
    {"reduce", (PyCFunction)(void (*)(void))small_reduce, METH_FASTCALL,
     "reduce(turn, work): every rank's region of the turn, reduced in rank order (or gathered), into work"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef small_members[] = {
    {"runs", T_LONGLONG, offsetof(SmallAllreduce, runs), READONLY, "calls that arrived at a barrier"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SmallAllreduceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectives._engine.SmallAllreduce",
    .tp_doc = "A repeated small allreduce's copy-in, barrier, signature check and reduction, in one call.",
    .tp_basicsize = sizeof(SmallAllreduce),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)small_init,
    .tp_dealloc = (destructor)small_dealloc,
    .tp_methods = small_methods,
    .tp_members = small_members,
};

/* ---- SignedBarrier: the shared memory's barrier that carries a call's signature, in one call ----
 *
 * MPISharedMemory.pass_signed's twin (the lean paths' signed barrier of the collectives the engine does
 * not run whole: barrier, broadcast, reduce, all-gather, reduce-scatter): post the signature, arrive,
 * spin for the peers (LATE: the caller waits on in Python, whose wait marks the barrier passed) and
 * compare their signatures, on the same words as the Python path. */
typedef struct {
    PyObject_HEAD
    Meeting m;
} SignedBarrier;

static int signed_init(SignedBarrier *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"meeting", NULL};
    PyObject *meeting;
    Kind kind;
    Op op;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O", names, &meeting)) return -1;
    meeting_release(&self->m);
    return meeting_parse(&self->m, meeting, &kind, &op); /* (its dtype and op unused) */
}

static void signed_dealloc(SignedBarrier *self) {
    meeting_release(&self->m);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* pass_signed(packed, digest, sequence) -> True signed alike, False not, None a rank is late */
static PyObject *signed_pass(SignedBarrier *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pass_signed(packed, digest, sequence)");
        return NULL;
    }
    long long digest = PyLong_AsLongLong(args[1]), sequence = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    if (!digest) {
        PyErr_SetString(PyExc_ValueError, "a signed barrier's digest is not 0");
        return NULL;
    }
    Meeting *m = &self->m;
    int64_t number = meeting_next(m);
    if (number < 0 || meeting_sign(m, number, sequence, args[0], digest) < 0) return NULL;
    m->numbers[m->own_words[number & 1]] = sequence;
    if (meeting_pass(m, number) == LATE) Py_RETURN_NONE;
    return PyBool_FromLong(meeting_signed_alike(m, number, sequence, digest));
}

static PyMethodDef signed_methods[] = {
    {"pass_signed", (PyCFunction)(void (*)(void))signed_pass, METH_FASTCALL,
     "pass_signed(packed, digest, sequence) -> True signed alike, False not, None a rank is late"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SignedBarrierType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectives._engine.SignedBarrier",
    .tp_doc = "The shared memory's barrier carrying a call's signature: posted, passed and compared in one call.",
    .tp_basicsize = sizeof(SignedBarrier),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)signed_init,
    .tp_dealloc = (destructor)signed_dealloc,
    .tp_methods = signed_methods,
};

/* ---- SegmentedAllreduce: a repeated allreduce through the window's halves, segment by segment ----
 *
 * The compiled twin of SharedExecutor.allreduce's window path (collectives/execute_shared.py), step for
 * step and barrier for barrier, so that a rank on the Python path and one here meet at the same
 * barriers: per segment of `slot` elements of every share, copy into this rank's region the other
 * owners' parts, pass a barrier (the call's first carries the signature and the note "through the
 * window"), reduce this rank's part in rank order (its own input read where it lies) into its output
 * and copy it into its result slot, pass a barrier, copy every other owner's result out. Segments
 * alternate between the halves. A late barrier hands the wait to Python (status LATE); resume() goes
 * on from where the call stopped. */
enum { MODES = 4 }; /* the first barrier's notes differ: some rank runs the zero-copy path */
/* An owner reduces its part into its output and copies it into its result slot this many bytes at a time.
 * Stored into the slot by the reduction itself (the lines a peer read last) the step ran 2-3x slower in
 * the machine's slow spells (bench/README.md): at 1 MiB and 2 ranks a C model took 127 us, against 53
 * reduced into the output and copied whole, and 69, 59 and 56 by blocks of 4, 16 and 32 KiB; outside
 * spells 30, 33, and 30, 31 and 31: the copy of a block reads it from the nearest cache. */
#ifndef OWNER_BLOCK_BYTES
#define OWNER_BLOCK_BYTES 32768
#endif
enum { SEGMENT_IDLE, SEGMENT_FIRST_WAIT, SEGMENT_SECOND_WAIT };

typedef struct {
    PyObject_HEAD
    Meeting m;
    Py_buffer halves[2][MAX_RANKS]; /* every rank's half of its region, by half */
    Py_ssize_t notes[2][MAX_RANKS];  /* where each rank's note of a barrier lies, by parity */
    Py_ssize_t note_ints;
    Py_ssize_t bounds[MAX_RANKS + 1]; /* where each owner's share starts, then the count */
    Py_ssize_t count, slot, itemsize;
    Kind kind;
    Op op;
    /* the call under way */
    int stage, half, turn;
    Py_ssize_t start;
    int64_t number;
    long long sequence, digest;
    long long passed, runs;
} SegmentedAllreduce;

static void segmented_release(SegmentedAllreduce *self) {
    meeting_release(&self->m);
    regions_release(self->halves);
}

static void segmented_dealloc(SegmentedAllreduce *self) {
    segmented_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int segmented_init(SegmentedAllreduce *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"meeting", "notes", "note_ints", "halves", "bounds", "slot", NULL};
    PyObject *meeting, *notes, *halves, *bounds;
    Py_ssize_t note_ints, slot;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOnOOn", names, &meeting, &notes, &note_ints, &halves, &bounds,
                                     &slot))
        return -1;
    segmented_release(self);
    self->stage = SEGMENT_IDLE;
    if (meeting_parse(&self->m, meeting, &self->kind, &self->op) < 0) return -1;
    int size = self->m.size;
    self->itemsize = item_size(self->kind);
    self->slot = slot;
    self->note_ints = note_ints;
    if (PySequence_Size(bounds) != size + 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bounds: where each share starts, then the count");
        return -1;
    }
    for (int r = 0; r <= size; r++) {
        self->bounds[r] = index_at(bounds, r);
        if (self->bounds[r] < 0 || (r && self->bounds[r] < self->bounds[r - 1])) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bounds must not decrease");
            return -1;
        }
    }
    self->count = self->bounds[size];
    Py_ssize_t words_in_control = self->m.control.len / 8;
    for (int parity = 0; parity < 2; parity++) {
        PyObject *by_rank = PySequence_GetItem(notes, parity);
        if (!by_rank) return -1;
        for (int r = 0; r < size; r++) {
            self->notes[parity][r] = index_at(by_rank, r);
            if (self->notes[parity][r] < 0 || self->notes[parity][r] + note_ints > words_in_control) {
                Py_DECREF(by_rank);
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a note lies outside the control window");
                return -1;
            }
        }
        Py_DECREF(by_rank);
    }
    return regions_take(self->halves, halves, size, (size + 1) * slot * self->itemsize,
                        "a half of a region is shorter than its slots");
}

/* the part of owner r's share that the segment at `start` takes: [*lo, *hi) */
static void segment_cut(SegmentedAllreduce *self, int r, Py_ssize_t start, Py_ssize_t *lo, Py_ssize_t *hi) {
    Py_ssize_t end = self->bounds[r + 1];
    *lo = self->bounds[r] + start < end ? self->bounds[r] + start : end;
    *hi = *lo + self->slot < end ? *lo + self->slot : end;
}

static inline char *slot_at(SegmentedAllreduce *self, int half, int r, Py_ssize_t which) {
    return (char *)self->halves[half][r].buf + which * self->slot * self->itemsize;
}

/* Go on with the call from its stage; -1 with an exception set, else a status. */
static int segmented_go(SegmentedAllreduce *self, char *out, const char *in) {
    Meeting *m = &self->m;
    int size = m->size, rank = m->rank;
    Py_ssize_t item = self->itemsize, largest = self->bounds[1] - self->bounds[0], lo, hi;
    for (;;) {
        if (self->stage == SEGMENT_IDLE) {
            if (self->start >= largest) return DONE;
            int half = self->half = self->turn;
            self->turn ^= 1;
            char *mine = slot_at(self, half, rank, 0);
            for (int r = 0; r < size; r++) {
                segment_cut(self, r, self->start, &lo, &hi);
                if (r != rank && lo < hi) memcpy(mine + r * self->slot * item, in + lo * item, (size_t)((hi - lo) * item));
            }
            int64_t number = self->number = meeting_next(m);
            if (number < 0) return -1;
            if (self->start == 0) { /* the first barrier: the note "through the window", and the signature */
                int64_t *note = &m->numbers[self->notes[number & 1][rank]];
                for (Py_ssize_t i = 0; i < self->note_ints; i++) note[i] = 0;
                if (self->digest) m->numbers[m->own_words[number & 1]] = self->sequence;
            }
            self->stage = SEGMENT_FIRST_WAIT;
            self->passed++;
            if (meeting_pass(m, number) == LATE) return LATE;
        }
        if (self->stage == SEGMENT_FIRST_WAIT) {
            int half = self->half;
            if (self->start == 0) {
                int64_t number = self->number;
                if (self->digest && !meeting_signed_alike(m, number, self->sequence, self->digest)) return MISMATCH;
                for (int r = 0; r < size; r++)
                    if (m->numbers[self->notes[number & 1][r]] != 0) return MODES;
            }
            segment_cut(self, rank, self->start, &lo, &hi);
            if (lo < hi) {
                char *target = slot_at(self, half, rank, size), *result = out + lo * item;
                const char *own = in + lo * item;
                Py_ssize_t n = hi - lo;
                if (size == 1)
                    memmove(target, own, (size_t)(n * item));
                else {
                    /* into this rank's output (in rank order, or every rank's part at once), then copied
                     * into its result slot, block by block (see OWNER_BLOCK_BYTES) */
                    int rows_at_once = whole_op(self->op);
                    if (own == result && (rank >= 2 || rows_at_once)) { /* a store would overwrite the input
                                                                         * before it is read: read its copy */
                        memcpy(slot_at(self, half, rank, rank), own, (size_t)(n * item));
                        own = slot_at(self, half, rank, rank);
                    }
                    const char *parts[MAX_RANKS];
                    for (int r = 0; r < size; r++) parts[r] = r == rank ? own : slot_at(self, half, r, rank);
                    Py_ssize_t block = OWNER_BLOCK_BYTES / item;
                    for (Py_ssize_t at = 0; at < n; at += block) {
                        Py_ssize_t k = at + block < n ? block : n - at, offset = at * item;
                        char *into = result + offset;
                        if (rows_at_once) {
                            const void *rows[MAX_RANKS];
                            for (int r = 0; r < size; r++) rows[r] = parts[r] + offset;
                            reduce_rows(self->kind, self->op, into, rows, size, k);
                        }
                        for (int r = 1; r < size && !rows_at_once; r++)
                            reduce_pair(self->kind, self->op, into, r == 1 ? parts[0] + offset : into, parts[r] + offset, k);
                        memcpy(target + offset, into, (size_t)(k * item));
                    }
                }
            }
            int64_t number = self->number = meeting_next(m);
            if (number < 0) return -1;
            self->stage = SEGMENT_SECOND_WAIT;
            self->passed++;
            if (meeting_pass(m, number) == LATE) return LATE;
        }
        /* SEGMENT_SECOND_WAIT, passed: every other owner's result out (this rank's is there) */
        for (int r = 0; r < size; r++) {
            if (r == rank && size > 1) continue;
            segment_cut(self, r, self->start, &lo, &hi);
            if (lo < hi) memcpy(out + lo * item, slot_at(self, self->half, r, size), (size_t)((hi - lo) * item));
        }
        self->start += self->slot;
        self->stage = SEGMENT_IDLE;
    }
}

static PyObject *segmented_step(SegmentedAllreduce *self, PyObject *work, PyObject *source) {
    Py_buffer out, in;
    if (get_buffers(self->count * self->itemsize, work, source, &out, &in) < 0) return NULL;
    int status = segmented_go(self, out.buf, in.buf); /* DONE leaves the stage idle */
    if (in.obj) PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return status < 0 ? NULL : PyLong_FromLong(status);
}

/* run(turn, work, source, sequence, packed, digest) -> 0 done, 1 a rank is late (wait on, then resume),
 * 2 signatures differ, 4 notes differ (both at the first barrier, passed) */
static PyObject *segmented_run(SegmentedAllreduce *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "run(turn, work, source, sequence, packed, digest)");
        return NULL;
    }
    long turn = PyLong_AsLong(args[0]);
    long long sequence = PyLong_AsLongLong(args[3]);
    long long digest = PyLong_AsLongLong(args[5]);
    if ((turn == -1 || sequence == -1 || digest == -1) && PyErr_Occurred()) return NULL;
    if (turn != 0 && turn != 1) {
        PyErr_SetString(PyExc_ValueError, "turn is 0 or 1");
        return NULL;
    }
    int64_t number = meeting_next(&self->m);
    if (number < 0 || meeting_sign(&self->m, number, sequence, args[4], digest) < 0) return NULL;
    self->turn = (int)turn;
    self->start = 0;
    self->stage = SEGMENT_IDLE;
    self->sequence = sequence;
    self->digest = digest;
    self->passed = 0;
    self->runs++;
    return segmented_step(self, args[1], args[2]);
}

/* resume(work, source): on with the call after Python waited out its late barrier, or compared in full
 * the signatures whose digests differed (a rank on the Python path may post its signature whole) */
static PyObject *segmented_resume(SegmentedAllreduce *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "resume(work, source)");
        return NULL;
    }
    if (self->stage == SEGMENT_IDLE || self->m.state[1] != self->number) {
        PyErr_SetString(PyExc_RuntimeError, "resume called with no late barrier passed");
        return NULL;
    }
    if (self->stage == SEGMENT_FIRST_WAIT) self->digest = 0; /* Python compared the signatures in full */
    return segmented_step(self, args[0], args[1]);
}

static PyMethodDef segmented_methods[] = {
    {"run", (PyCFunction)(void (*)(void))segmented_run, METH_FASTCALL,
     "run(turn, work, source, sequence, packed, digest) -> 0 done, 1 late, 2 signatures differ, 4 notes differ"},
    {"resume", (PyCFunction)(void (*)(void))segmented_resume, METH_FASTCALL,
     "resume(work, source) -> the same statuses: on after a late barrier passed or signatures compared"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef segmented_members[] = {
    {"turn", T_INT, offsetof(SegmentedAllreduce, turn), READONLY, "the half the next segment would take"},
    {"passed", T_LONGLONG, offsetof(SegmentedAllreduce, passed), READONLY, "barriers arrived at in this call"},
    {"runs", T_LONGLONG, offsetof(SegmentedAllreduce, runs), READONLY, "calls run"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SegmentedAllreduceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectives._engine.SegmentedAllreduce",
    .tp_doc = "A repeated allreduce through the window's halves, segment by segment, as SharedExecutor's.",
    .tp_basicsize = sizeof(SegmentedAllreduce),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)segmented_init,
    .tp_dealloc = (destructor)segmented_dealloc,
    .tp_methods = segmented_methods,
    .tp_members = segmented_members,
};

/* ---- WatchdogCore: the per-call state of a communicator the lean path reads and writes each call ----
 *
 * The base of collectives.watchdog.Watchdog where the engine was built: the fields a repeated call
 * reads and writes (its sequence number, the claim's holder, when the last call began, the late
 * check's interval, whether it broke, whether calls are checked, the tag, the flight recorder) as
 * members, so LeanCore.start reaches them in the struct while Python reads and writes them as ever. */
typedef struct {
    PyObject_HEAD
    int claimed; /* the claim of the communicator: taken by compare-and-swap, with or without the GIL */
    long long sequence;
    unsigned long long claimed_by;
    double last_began, late_after;
    PyObject *broken, *check, *tag, *recorder;
} WatchdogCore;

static int watchdog_traverse(WatchdogCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->broken);
    Py_VISIT(self->check);
    Py_VISIT(self->tag);
    Py_VISIT(self->recorder);
    return 0;
}

static int watchdog_clear(WatchdogCore *self) {
    Py_CLEAR(self->broken);
    Py_CLEAR(self->check);
    Py_CLEAR(self->tag);
    Py_CLEAR(self->recorder);
    return 0;
}

static void watchdog_dealloc(WatchdogCore *self) {
    PyObject_GC_UnTrack(self);
    watchdog_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline int claim_take(WatchdogCore *self) {
    int free = 0;
    return __atomic_compare_exchange_n(&self->claimed, &free, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

static inline void claim_give(WatchdogCore *self) { __atomic_store_n(&self->claimed, 0, __ATOMIC_RELEASE); }

static PyObject *watchdog_take_claim(WatchdogCore *self, PyObject *unused) {
    return PyBool_FromLong(claim_take(self));
}

static PyObject *watchdog_give_claim(WatchdogCore *self, PyObject *unused) {
    if (!__atomic_load_n(&self->claimed, __ATOMIC_ACQUIRE)) {
        PyErr_SetString(PyExc_RuntimeError, "the claim was given back but not held");
        return NULL;
    }
    claim_give(self);
    Py_RETURN_NONE;
}

static PyObject *watchdog_claim_held(WatchdogCore *self, PyObject *unused) {
    return PyBool_FromLong(__atomic_load_n(&self->claimed, __ATOMIC_ACQUIRE));
}

static PyMethodDef watchdog_methods[] = {
    {"take_claim", (PyCFunction)watchdog_take_claim, METH_NOARGS,
     "take_claim() -> whether this call took the communicator's claim (never waits)"},
    {"give_claim", (PyCFunction)watchdog_give_claim, METH_NOARGS, "give_claim(): give the claim back"},
    {"claim_held", (PyCFunction)watchdog_claim_held, METH_NOARGS, "claim_held() -> whether some call holds it"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef watchdog_members[] = {
    {"sequence", T_LONGLONG, offsetof(WatchdogCore, sequence), 0, "the next call's sequence number"},
    {"claimed_by", T_ULONGLONG, offsetof(WatchdogCore, claimed_by), 0, "the thread holding the claim (0: none)"},
    {"last_began", T_DOUBLE, offsetof(WatchdogCore, last_began), 0, "when the last call began (time.monotonic)"},
    {"late_after", T_DOUBLE, offsetof(WatchdogCore, late_after), 0, "the time between calls that asks the late check"},
    {"broken", T_OBJECT, offsetof(WatchdogCore, broken), 0, "why the communicator broke, or None"},
    {"check", T_OBJECT, offsetof(WatchdogCore, check), 0, "whether calls' signatures are checked"},
    {"tag", T_OBJECT, offsetof(WatchdogCore, tag), 0, "what the next calls are of, in every signature"},
    {"recorder", T_OBJECT, offsetof(WatchdogCore, recorder), 0, "the flight recorder"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject WatchdogCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectives._engine.WatchdogCore",
    .tp_doc = "The per-call state of a communicator, in a struct the compiled calls read and write.",
    .tp_basicsize = sizeof(WatchdogCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)watchdog_traverse,
    .tp_clear = (inquiry)watchdog_clear,
    .tp_dealloc = (destructor)watchdog_dealloc,
    .tp_methods = watchdog_methods,
    .tp_members = watchdog_members,
};

/* ---- LeanCore: a repeated small allreduce's bookkeeping and its compiled call, in one call ----
 *
 * The base of collectives.lean.LeanAllreduce where the engine runs: its start() is the compiled twin
 * of LeanAllreduce's Python path for a call the engine takes: the communicator's claim, the call's
 * sequence number, the flight recorder's count of calls in a row, the signature stamped with the
 * watchdog's tag, the turn of the window, the engine's call (small_call), the claim given back and
 * the late check, all on the objects' public attributes (the watchdog's, the executor's, the
 * recorder entry's, the tracer's record) and on this object's own fields. Whatever is not as usual
 * (a broken or claimed communicator before the claim; a late rank, differing signatures, a late
 * check due or an average after it) is handed back to the Python path by the status. */
enum { NOT_TAKEN = -1, FINISH = 3 };

typedef struct {
    PyObject_HEAD
    PyObject *kernel;   /* _kernel: the SmallAllreduce, or None */
    PyObject *watchdog; /* watchdog */
    PyObject *executor; /* executor */
    PyObject *guard;    /* guard: the packed signature */
    PyObject *check;    /* _check: the call's check (None: the watchdog's) */
    PyObject *entry;    /* _entry: the flight-recorder entry counting the calls in a row */
    PyObject *tag;      /* _tag: the watchdog's tag the signature was stamped with */
    PyObject *call;     /* _call: the Call made where a call waits or fails */
    PyObject *tracer;   /* _tracer: its "on" says whether calls are traced */
    long long sequence; /* _sequence */
    long long posted;   /* _posted: the digest the last compiled call posted (0: unchecked) */
    double began;       /* _began */
    int barriers;       /* _barriers */
    int turn;           /* _turn */
    char averages;      /* averages */
    PyObject *packed;   /* the guard's packed signature: a bytearray the stamp writes in place */
} LeanCore;

static PyObject *s_record, *s_turn, *s_stamp, *s_digest, *s_packed, *s_last, *s_starts, *s_on, *s_new_entry;
static PyObject *s_shape, *s_dtype, *s_lean, *s_debug, *s_in_place, *s_new, *s_out, *s_failed, *s_barrier;

static int get_long(PyObject *object, PyObject *name, long long *value) {
    PyObject *got = PyObject_GetAttr(object, name);
    if (!got) return -1;
    *value = PyLong_AsLongLong(got);
    Py_DECREF(got);
    return (*value == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_long(PyObject *object, PyObject *name, long long value) {
    PyObject *number = PyLong_FromLongLong(value);
    if (!number) return -1;
    int result = PyObject_SetAttr(object, name, number);
    Py_DECREF(number);
    return result;
}

static int is_true(PyObject *object, PyObject *name) {
    PyObject *got = PyObject_GetAttr(object, name);
    if (!got) return -1;
    int truth = PyObject_IsTrue(got);
    Py_DECREF(got);
    return truth;
}

/* start(work, source) -> -1 not taken (nothing done), 0 done, 1 a rank is late, 2 signatures differ,
 * 3 done but for the end's late check or average (claim given back) */
enum { FAILED = -2 }; /* core_run's status where an exception is set */

static int core_run(LeanCore *self, PyObject *work, PyObject *source) {
    if (!self->kernel || !PyObject_TypeCheck(self->kernel, &SmallAllreduceType) || !self->watchdog ||
        !PyObject_TypeCheck(self->watchdog, &WatchdogCoreType) || !self->executor || !self->guard ||
        !self->tracer)
        return NOT_TAKEN;
    WatchdogCore *watchdog = (WatchdogCore *)self->watchdog;
    if (watchdog->broken && watchdog->broken != Py_None)
        return NOT_TAKEN; /* the Python path refuses it, naming why */
    if (!claim_take(watchdog)) return NOT_TAKEN; /* the Python path's claim raises, naming the thread */
    /* claimed: from here an error is the call's, which the caller ends */
    watchdog->claimed_by = PyThread_get_thread_ident();
    double began = now_s(); /* CLOCK_MONOTONIC: time.monotonic's clock */
    long long sequence = watchdog->sequence++;
    self->sequence = sequence;
    self->began = began;
    self->barriers = 0;
    Py_XSETREF(self->call, Py_NewRef(Py_None));
    PyObject *recorder = watchdog->recorder;
    int counted = 0;
    if (self->entry && self->entry != Py_None && recorder) {
        Py_ssize_t length = PyObject_Length(recorder);
        if (length > 0) {
            PyObject *last = PySequence_GetItem(recorder, length - 1);
            counted = last == self->entry;
            Py_XDECREF(last);
        }
        if (PyErr_Occurred()) return FAILED;
    }
    if (counted) { /* no other call since: count it in */
        long long starts;
        if (set_long(self->entry, s_last, sequence) < 0 || get_long(self->entry, s_starts, &starts) < 0 ||
            set_long(self->entry, s_starts, starts + 1) < 0)
            return FAILED;
    } else {
        PyObject *number = PyLong_FromLongLong(sequence);
        PyObject *made = number ? PyObject_CallMethodOneArg((PyObject *)self, s_new_entry, number) : NULL;
        Py_XDECREF(number);
        if (!made) return FAILED;
        Py_DECREF(made);
    }
    PyObject *check = (self->check && self->check != Py_None) ? self->check : watchdog->check;
    int checked = check ? PyObject_IsTrue(check) : 0;
    if (checked < 0) return FAILED;
    long long digest = 0;
    PyObject *packed = NULL;
    if (checked) {
        PyObject *tag = watchdog->tag ? watchdog->tag : Py_None;
        if (tag != self->tag) { /* a new tag is a new signature (the engine stamps the number) */
            PyObject *number = PyLong_FromLongLong(sequence);
            PyObject *done = number ? PyObject_CallMethodObjArgs(self->guard, s_stamp, number, tag, NULL) : NULL;
            Py_XDECREF(number);
            if (!done) return FAILED;
            Py_DECREF(done);
            Py_XSETREF(self->tag, Py_NewRef(tag));
        }
        if (!self->packed) { /* the stamp writes the same bytearray in place: read once */
            self->packed = PyObject_GetAttr(self->guard, s_packed);
            if (!self->packed) return FAILED;
        }
        if (get_long(self->guard, s_digest, &digest) < 0) return FAILED;
        packed = Py_NewRef(self->packed);
    }
    long long turn;
    if (get_long(self->executor, s_turn, &turn) < 0 || set_long(self->executor, s_turn, turn ^ 1) < 0) {
        Py_XDECREF(packed);
        return FAILED;
    }
    self->turn = (int)turn;
    self->barriers = 1;
    self->posted = digest;
    int status = small_call((SmallAllreduce *)self->kernel, (long)turn, work, source, sequence, packed, digest);
    Py_XDECREF(packed);
    if (status < 0) return FAILED;
    if (status != DONE) return status;
    /* the call's end: an average of floats divided here; the claim given back; the late check, a trace
     * record or another average: Python's (LeanAllreduce._end, which divides where this did not) */
    int late = began - watchdog->last_began >= watchdog->late_after;
    SmallAllreduce *kernel = (SmallAllreduce *)self->kernel;
    int divides = self->averages && !late && (kernel->kind == F32 || kernel->kind == F64);
    if (divides && small_divide(kernel, work) < 0) return FAILED;
    watchdog->claimed_by = 0;
    claim_give(watchdog);
    if (late || (self->averages && !divides)) return FINISH;
    int traced = is_true(self->tracer, s_on);
    if (traced < 0) return FAILED;
    if (traced) { /* the trace's record of a lean repeat, as LeanAllreduce's end appends it */
        PyObject *record = PyObject_GetAttr(self->tracer, s_record);
        PyObject *tag = watchdog->tag ? watchdog->tag : Py_None;
        PyObject *item = record ? Py_BuildValue("(OLddO)", (PyObject *)self, sequence, began, now_s(), tag) : NULL;
        PyObject *done = item ? PyObject_CallOneArg(record, item) : NULL;
        Py_XDECREF(record);
        Py_XDECREF(item);
        if (!done) return FAILED;
        Py_DECREF(done);
    }
    watchdog->last_began = began;
    return DONE;
}

/* An error raised inside a call (set): where the call holds its claim, it is the call's, which
 * LeanAllreduce._failed ends (the claim given back, the Call's record), as the Python path does. */
static void core_failed(LeanCore *self) {
    PyObject *lean = (PyObject *)self;
    if (((WatchdogCore *)self->watchdog)->claimed_by != PyThread_get_thread_ident()) return;
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyErr_NormalizeException(&type, &value, &trace);
    if (trace) PyException_SetTraceback(value, trace);
    PyObject *ended = PyObject_CallMethodOneArg(lean, s_failed, value);
    if (ended) {
        Py_DECREF(ended);
        PyErr_Restore(type, value, trace);
    } else { /* its own error goes up, this one its context */
        Py_XDECREF(type);
        Py_XDECREF(trace);
        PyObject *ftype, *fvalue, *ftrace;
        PyErr_Fetch(&ftype, &fvalue, &ftrace);
        PyErr_NormalizeException(&ftype, &fvalue, &ftrace);
        if (fvalue && value) PyException_SetContext(fvalue, value); /* steals value */
        else Py_XDECREF(value);
        PyErr_Restore(ftype, fvalue, ftrace);
    }
}

static PyObject *core_start(LeanCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "start(work, source)");
        return NULL;
    }
    int status = core_run(self, args[0], args[1]);
    if (status != FAILED) return PyLong_FromLong(status);
    core_failed(self);
    return NULL;
}

static PyTypeObject LeanCoreType;

/* The lean path kept under `key` (a new reference), where the compiled call may take it (not while the
 * watchdog's debug log is on); NULL, no error set, where none is. */
static PyObject *lean_kept(PyObject *kept, PyObject *key, PyObject **repeat) {
    *repeat = key ? PyDict_GetItemWithError(kept, key) : NULL; /* borrowed */
    PyObject *lean = *repeat ? PyObject_GetAttr(*repeat, s_lean) : NULL;
    if (!lean || !PyObject_TypeCheck(lean, &LeanCoreType) || !((LeanCore *)lean)->watchdog ||
        !PyObject_TypeCheck(((LeanCore *)lean)->watchdog, &WatchdogCoreType) ||
        is_true(((LeanCore *)lean)->watchdog, s_debug) != 0) {
        PyErr_Clear(); /* not kept: the full path decides, and names any problem */
        Py_XDECREF(lean);
        return NULL;
    }
    return lean;
}

/* The lean path kept under an allreduce's key (collectives.repeats.allreduce_key), as lean_kept. */
static PyObject *lean_found(PyObject *kept, PyObject *x, PyObject *op, PyObject *algorithm, PyObject *result,
                            PyObject *check) {
    PyObject *shape = PyObject_GetAttr(x, s_shape);
    PyObject *dtype = shape ? PyObject_GetAttr(x, s_dtype) : NULL;
    PyObject *key = dtype ? PyTuple_Pack(7, (PyObject *)Py_TYPE(x), shape, dtype, op, algorithm, result, check)
                          : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    PyObject *repeat;
    PyObject *lean = lean_kept(kept, key, &repeat);
    Py_XDECREF(key);
    return lean;
}

/* Whether an array's memory is C-contiguous (and writable, with PyBUF_WRITABLE in flags); where it is,
 * its bounds (where begins is not NULL). The full path copies a strided array, and names a read-only
 * output. */
static int contiguous(PyObject *array, int flags, char **begins, char **ends) {
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, flags | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (begins) {
        *begins = view.buf;
        *ends = (char *)view.buf + view.len;
    }
    PyBuffer_Release(&view);
    return 1;
}

/* Whether `out` may take a kept call's result as it is: C-contiguous, writable, of `shape` and `dtype`. An
 * odd array is not (the full path names it). */
static int out_fits(PyObject *out, PyObject *shape, PyObject *dtype) {
    PyObject *out_shape = PyObject_GetAttr(out, s_shape), *out_dtype = PyObject_GetAttr(out, s_dtype);
    int fits = out_shape && out_dtype && contiguous(out, PyBUF_WRITABLE, NULL, NULL) &&
               PyObject_RichCompareBool(out_shape, shape, Py_EQ) == 1 &&
               PyObject_RichCompareBool(out_dtype, dtype, Py_EQ) == 1;
    Py_XDECREF(out_shape);
    Py_XDECREF(out_dtype);
    PyErr_Clear();
    return fits;
}

/* The end of a call that core_run started: result where done, else (lean, status), or with
 * result_too (lean, status, result), for the Python path to go on with (LeanAllreduce.went_on). */
static PyObject *repeat_ended(PyObject *lean, int status, PyObject *result, int result_too) {
    if (status == DONE) {
        Py_DECREF(lean);
        return Py_NewRef(result);
    }
    if (status != FAILED)
        return result_too ? Py_BuildValue("(NiO)", lean, status, result) : Py_BuildValue("(Ni)", lean, status);
    core_failed((LeanCore *)lean);
    Py_DECREF(lean);
    return NULL;
}

/* repeat_in_place(kept, x, op, algorithm, check) -> x: done; None: not taken, nothing done; or
 * (lean, status): the call started, for the Python path to go on with (LeanAllreduce.went_on)
 *
 * A plain in-place allreduce's repeat in one call: its key as collectives.repeats.find_repeat makes it
 * for an in-place call, the kept decisions' lean path (not while the watchdog's debug log is on), the
 * arrays' check (RepeatedAllreduce.fits: C-contiguous and writable) and the lean call's start. */
static PyObject *engine_repeat_in_place(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "repeat_in_place(kept: dict, x, op, algorithm, check)");
        return NULL;
    }
    PyObject *x = args[1];
    PyObject *lean = lean_found(args[0], x, args[2], args[3], s_in_place, args[4]);
    if (!lean) Py_RETURN_NONE;
    if (!contiguous(x, PyBUF_WRITABLE, NULL, NULL)) {
        Py_DECREF(lean);
        Py_RETURN_NONE;
    }
    return repeat_ended(lean, core_run((LeanCore *)lean, x, x), x, 0);
}

/* repeat_out_of_place(kept, x, out, op, algorithm, check, empty_like) -> the result: done; None: not taken,
 * nothing done; or (lean, status, result): started, for the Python path to go on with
 *
 * As repeat_in_place, for a call whose result goes into out, an array apart from x, or, where out is
 * None, into a new array, empty_like(x), made once the repeat is found. The checks are
 * RepeatedAllreduce.fits's: x C-contiguous; out of x's type, shape and dtype, C-contiguous, writable,
 * and its memory apart from x's (by bounds: where they overlap at all the full path decides). */
static PyObject *engine_repeat_out_of_place(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "repeat_out_of_place(kept: dict, x, out, op, algorithm, check, empty_like)");
        return NULL;
    }
    PyObject *x = args[1], *out = args[2];
    int new = out == Py_None;
    if (out == x || (!new && Py_TYPE(out) != Py_TYPE(x))) Py_RETURN_NONE;
    PyObject *lean = lean_found(args[0], x, args[3], args[4], new ? s_new : s_out, args[5]);
    if (!lean) Py_RETURN_NONE;
    char *x_begins, *x_ends, *out_begins, *out_ends;
    int fits = contiguous(x, 0, &x_begins, &x_ends);
    if (fits && new) {
        out = PyObject_CallOneArg(args[6], x);
        if (!out) {
            Py_DECREF(lean);
            return NULL;
        }
    } else
        Py_INCREF(out);
    fits = fits && contiguous(out, PyBUF_WRITABLE, &out_begins, &out_ends) &&
           (out_ends <= x_begins || x_ends <= out_begins);
    if (fits && !new) {
        PyObject *x_shape = PyObject_GetAttr(x, s_shape), *x_dtype = PyObject_GetAttr(x, s_dtype);
        fits = x_shape && x_dtype && out_fits(out, x_shape, x_dtype);
        Py_XDECREF(x_shape);
        Py_XDECREF(x_dtype);
        PyErr_Clear();
    }
    if (!fits) {
        Py_DECREF(lean);
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    PyObject *ended = repeat_ended(lean, core_run((LeanCore *)lean, out, x), out, 1);
    Py_DECREF(out);
    return ended;
}

/* repeat_shares(kept, collective, x, out, op, counts, algorithm, check, empty) -> the result: done; None: not
 * taken, nothing done; or (lean, status, result): started, for the Python path to go on with
 * (LeanShared.went_on; a status of -1: not taken either)
 *
 * A repeated reduce-scatter's or all-gather's call in one: its key as collectives.repeats.find_repeat makes
 * it, the kept decisions' lean path (not while the watchdog's debug log is on), the arrays' checks and the
 * lean call's start, which runs the engine's small call where the lean path holds one. The checks are
 * RepeatedReduceScatter's and RepeatedAllgather's, for arrays the engine takes as they are: x C-contiguous;
 * out of x's type and dtype, of the kept result's shape, C-contiguous and writable (it may overlap x: the
 * small call copies x in before it writes out), or, where out is None, a new array, empty(shape, dtype). */
static PyObject *engine_repeat_shares(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 9 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "repeat_shares(kept: dict, collective, x, out, op, counts, algorithm, check, "
                                         "empty)");
        return NULL;
    }
    PyObject *x = args[2], *out = args[3], *counts = args[5];
    int new = out == Py_None;
    if (!new && Py_TYPE(out) != Py_TYPE(x)) Py_RETURN_NONE;
    PyObject *shares = counts == Py_None ? Py_NewRef(Py_None) : PySequence_Tuple(counts);
    PyObject *shape = shares ? PyObject_GetAttr(x, s_shape) : NULL;
    PyObject *dtype = shape ? PyObject_GetAttr(x, s_dtype) : NULL;
    PyObject *key = dtype ? PyTuple_Pack(9, args[1], (PyObject *)Py_TYPE(x), shape, dtype, args[4], shares, args[6],
                                         new ? Py_True : Py_False, args[7])
                          : NULL;
    Py_XDECREF(shares);
    Py_XDECREF(shape);
    PyObject *repeat;
    PyObject *lean = lean_kept(args[0], key, &repeat);
    Py_XDECREF(key);
    PyObject *result_shape = lean ? PyObject_GetAttr(repeat, s_shape) : NULL;
    if (!result_shape || !contiguous(x, 0, NULL, NULL)) {
        PyErr_Clear(); /* not kept, or not an array: the full path decides, and names any problem */
        Py_XDECREF(lean);
        Py_XDECREF(dtype);
        Py_XDECREF(result_shape);
        Py_RETURN_NONE;
    }
    int fits = 1;
    if (new)
        out = PyObject_CallFunctionObjArgs(args[8], result_shape, dtype, NULL);
    else {
        Py_INCREF(out);
        fits = out_fits(out, result_shape, dtype);
    }
    Py_DECREF(dtype);
    Py_DECREF(result_shape);
    if (!out || !fits) {
        Py_DECREF(lean);
        Py_XDECREF(out);
        if (!out) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *ended = repeat_ended(lean, core_run((LeanCore *)lean, out, x), out, 1);
    Py_DECREF(out);
    return ended;
}

/* repeat_rooted(kept, collective, x, out, op, root, algorithm, check, empty_like) -> the result: done
 * (a reduce's input at a rank not its root); None: not taken, nothing done; or (lean, status, result):
 * started, for the Python path to go on with (LeanShared.went_on; a status of -1: not taken either)
 *
 * A repeated broadcast's or reduce's call in one, as repeat_shares: its key as find_repeat makes it
 * (root an int), the kept decisions' lean path, the arrays' checks and the lean call's start. x
 * C-contiguous (and writable in place, or at a broadcast's ranks but its root, where x is the output);
 * out of x's type, shape and dtype, C-contiguous and writable (it may overlap x: the small call copies x
 * in before it writes out), or, where out is None, a new array, empty_like(x), at a reduce's root alone. */
static PyObject *engine_repeat_rooted(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 9 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "repeat_rooted(kept: dict, collective, x, out, op, root, algorithm, check, "
                                         "empty_like)");
        return NULL;
    }
    PyObject *x = args[2], *out = args[3], *root = args[5];
    int new = out == Py_None, in_place = out == x;
    if (!PyLong_CheckExact(root) || (!new && Py_TYPE(out) != Py_TYPE(x))) Py_RETURN_NONE;
    PyObject *shape = PyObject_GetAttr(x, s_shape);
    PyObject *dtype = shape ? PyObject_GetAttr(x, s_dtype) : NULL;
    PyObject *key = dtype ? PyTuple_Pack(9, args[1], (PyObject *)Py_TYPE(x), shape, dtype, args[4], root, args[6],
                                         new ? s_new : in_place ? s_in_place : s_out, args[7])
                          : NULL;
    PyObject *repeat;
    PyObject *lean = lean_kept(args[0], key, &repeat);
    Py_XDECREF(key);
    if (!lean || !((LeanCore *)lean)->kernel || !PyObject_TypeCheck(((LeanCore *)lean)->kernel, &SmallAllreduceType)) {
        PyErr_Clear();
        Py_XDECREF(lean);
        Py_XDECREF(shape);
        Py_XDECREF(dtype);
        Py_RETURN_NONE;
    }
    SmallAllreduce *kernel = (SmallAllreduce *)((LeanCore *)lean)->kernel;
    int at_root = kernel->m.rank == kernel->root, reduces = kernel->mode == SMALL_REDUCE;
    PyObject *work = NULL;
    int writes_x = in_place && !(reduces && !at_root); /* a reduce's input is its output at the root alone */
    int fits = contiguous(x, writes_x ? PyBUF_WRITABLE : 0, NULL, NULL);
    if (fits && !new && !in_place) fits = out_fits(out, shape, dtype);
    if (fits)
        work = in_place || (reduces && !at_root) ? Py_NewRef(x) : new ? PyObject_CallOneArg(args[8], x) : Py_NewRef(out);
    Py_DECREF(shape);
    Py_DECREF(dtype);
    if (fits && !work) { /* empty_like raised */
        Py_DECREF(lean);
        return NULL;
    }
    if (!fits) {
        Py_DECREF(lean);
        Py_XDECREF(work);
        Py_RETURN_NONE;
    }
    PyObject *ended = repeat_ended(lean, core_run((LeanCore *)lean, work, x), work, 1);
    Py_DECREF(work);
    return ended;
}

/* repeat_barrier(kept, algorithm, check, nothing) -> nothing: done; None: not taken, nothing done; or
 * (lean, status, nothing): started, for the Python path to go on with (a status of -1: not taken either)
 *
 * A repeated barrier's call in one: the engine's small call of no bytes (an all-gather of nothing), its
 * signature posted, passed and compared, with the call's bookkeeping. `nothing`: a writable buffer of
 * no bytes. */
static PyObject *engine_repeat_barrier(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "repeat_barrier(kept: dict, algorithm, check, nothing)");
        return NULL;
    }
    PyObject *key = PyTuple_Pack(3, s_barrier, args[1], args[2]);
    PyObject *repeat;
    PyObject *lean = lean_kept(args[0], key, &repeat);
    Py_XDECREF(key);
    if (!lean) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return repeat_ended(lean, core_run((LeanCore *)lean, args[3], args[3]), args[3], 1);
}

static int core_traverse(LeanCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->kernel);
    Py_VISIT(self->watchdog);
    Py_VISIT(self->executor);
    Py_VISIT(self->guard);
    Py_VISIT(self->check);
    Py_VISIT(self->entry);
    Py_VISIT(self->tag);
    Py_VISIT(self->call);
    Py_VISIT(self->tracer);
    Py_VISIT(self->packed);
    return 0;
}

static int core_clear(LeanCore *self) {
    Py_CLEAR(self->kernel);
    Py_CLEAR(self->watchdog);
    Py_CLEAR(self->executor);
    Py_CLEAR(self->guard);
    Py_CLEAR(self->check);
    Py_CLEAR(self->entry);
    Py_CLEAR(self->tag);
    Py_CLEAR(self->call);
    Py_CLEAR(self->tracer);
    Py_CLEAR(self->packed);
    return 0;
}

static void core_dealloc(LeanCore *self) {
    PyObject_GC_UnTrack(self);
    core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef core_members[] = {
    {"_kernel", T_OBJECT, offsetof(LeanCore, kernel), 0, "the engine's call, or None"},
    {"watchdog", T_OBJECT, offsetof(LeanCore, watchdog), 0, "the communicator's watchdog"},
    {"executor", T_OBJECT, offsetof(LeanCore, executor), 0, "its shared-memory executor"},
    {"guard", T_OBJECT, offsetof(LeanCore, guard), 0, "the packed signature"},
    {"_check", T_OBJECT, offsetof(LeanCore, check), 0, "the call's check (None: the watchdog's)"},
    {"_entry", T_OBJECT, offsetof(LeanCore, entry), 0, "the flight-recorder entry of the calls in a row"},
    {"_tag", T_OBJECT, offsetof(LeanCore, tag), 0, "the tag the compiled calls' signature has"},
    {"_call", T_OBJECT, offsetof(LeanCore, call), 0, "the Call, where the call waited or failed"},
    {"_tracer", T_OBJECT, offsetof(LeanCore, tracer), 0, "the tracer (its on)"},
    {"_sequence", T_LONGLONG, offsetof(LeanCore, sequence), 0, "the call's sequence number"},
    {"_posted", T_LONGLONG, offsetof(LeanCore, posted), 0, "the digest the last compiled call posted"},
    {"_began", T_DOUBLE, offsetof(LeanCore, began), 0, "when the last compiled call began"},
    {"_barriers", T_INT, offsetof(LeanCore, barriers), 0, "barriers the call passed"},
    {"_turn", T_INT, offsetof(LeanCore, turn), 0, "the window's turn the last compiled call took"},
    {"averages", T_BOOL, offsetof(LeanCore, averages), 0, "whether the op divides by the world size"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef core_methods[] = {
    {"start", (PyCFunction)(void (*)(void))core_start, METH_FASTCALL,
     "start(work, source) -> -1 not taken, 0 done, 1 late, 2 signatures differ, 3 done but for the end"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LeanCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectives._engine.LeanCore",
    .tp_doc = "A repeated small allreduce's bookkeeping and compiled call in one call (LeanAllreduce's base).",
    .tp_basicsize = sizeof(LeanCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_members = core_members,
    .tp_methods = core_methods,
};

/* the reproducible sums' loops: defined in their own section at the end of this file */
static PyObject *repro_codes(PyObject *, PyObject *const *, Py_ssize_t);
static PyObject *repro_words(PyObject *, PyObject *const *, Py_ssize_t);
static PyObject *repro_add(PyObject *, PyObject *const *, Py_ssize_t);
static PyObject *repro_finish(PyObject *, PyObject *const *, Py_ssize_t);
static PyObject *repro_rows(PyObject *, PyObject *const *, Py_ssize_t);
static PyObject *repro_pack(PyObject *, PyObject *const *, Py_ssize_t);
static PyObject *repro_pair(PyObject *, PyObject *const *, Py_ssize_t);
static PyObject *repro_sum_rows(PyObject *, PyObject *const *, Py_ssize_t);

static PyMethodDef engine_methods[] = {
    {"reduces", (PyCFunction)(void (*)(void))engine_reduces, METH_FASTCALL,
     "reduces(dtype, op) -> whether the engine reduces that dtype with that op (with numpy's bits)"},
    {"combine", (PyCFunction)(void (*)(void))engine_combine, METH_FASTCALL,
     "combine(dtype, op, out, a, b): out = a op b with the engine's loop"},
    {"repeat_in_place", (PyCFunction)(void (*)(void))engine_repeat_in_place, METH_FASTCALL,
     "repeat_in_place(kept, x, op, algorithm, check) -> x done, None not taken, or (lean, status) started"},
    {"repeat_out_of_place", (PyCFunction)(void (*)(void))engine_repeat_out_of_place, METH_FASTCALL,
     "repeat_out_of_place(kept, x, out, op, algorithm, check, empty_like) -> the result done, None not taken, or "
     "(lean, status, result) started"},
    {"repeat_shares", (PyCFunction)(void (*)(void))engine_repeat_shares, METH_FASTCALL,
     "repeat_shares(kept, collective, x, out, op, counts, algorithm, check, empty) -> the result done, None not "
     "taken, or (lean, status, result) started"},
    {"repeat_rooted", (PyCFunction)(void (*)(void))engine_repeat_rooted, METH_FASTCALL,
     "repeat_rooted(kept, collective, x, out, op, root, algorithm, check, empty_like) -> the result done, None "
     "not taken, or (lean, status, result) started"},
    {"repeat_barrier", (PyCFunction)(void (*)(void))engine_repeat_barrier, METH_FASTCALL,
     "repeat_barrier(kept, algorithm, check, nothing) -> nothing done, None not taken, or (lean, status, nothing) "
     "started"},
    {"repro_codes", (PyCFunction)(void (*)(void))repro_codes, METH_FASTCALL,
     "repro_codes(x, codes) -> flags: each element's code (1 a special code, 2 -0.0's, found)"},
    {"repro_words", (PyCFunction)(void (*)(void))repro_words, METH_FASTCALL,
     "repro_words(x, agreed, words): the contributions cut at the agreed codes"},
    {"repro_add", (PyCFunction)(void (*)(void))repro_add, METH_FASTCALL,
     "repro_add(x, codes, levels, specials, kind) -> whether x holds an inf or a NaN: x added to an accumulator"},
    {"repro_finish", (PyCFunction)(void (*)(void))repro_finish, METH_FASTCALL,
     "repro_finish(sums, codes, out, to_odd, divide_by, specials): the summed words rounded once"},
    {"repro_rows", (PyCFunction)(void (*)(void))repro_rows, METH_FASTCALL,
     "repro_rows(message, size, count, out, to_odd, divide_by) -> whether the rows' trailers agree"},
    {"repro_pack", (PyCFunction)(void (*)(void))repro_pack, METH_FASTCALL,
     "repro_pack(x, message, rank, kind, op): message zeroed but rank's row: x's bits, then kind and op"},
    {"repro_pair", (PyCFunction)(void (*)(void))repro_pair, METH_FASTCALL,
     "repro_pair(out, a, b, divide_by): out = the reproducible sum of two raw contributions, divided"},
    {"repro_sum_rows", (PyCFunction)(void (*)(void))repro_sum_rows, METH_FASTCALL,
     "repro_sum_rows(out, rows, divide_by): out = the reproducible sum of 1 to 64 raw contributions, divided"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef engine_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "collectives._engine",
    .m_doc = "The compiled engine of collectives: node-local steps of repeated calls (see collectives.engine).",
    .m_size = -1,
    .m_methods = engine_methods,
};

PyMODINIT_FUNC PyInit__engine(void) {
    if (PyType_Ready(&SmallAllreduceType) < 0 || PyType_Ready(&SegmentedAllreduceType) < 0 ||
        PyType_Ready(&SignedBarrierType) < 0 ||
        PyType_Ready(&WatchdogCoreType) < 0 || PyType_Ready(&LeanCoreType) < 0)
        return NULL;
    static const char *names[] = {"record", "turn",  "stamp", "digest", "packed", "last",     "starts",
                                  "on",     "_new_entry", "shape", "dtype", "lean", "debug", "in place",
                                  "new",    "out",        "_failed", "barrier"};
    PyObject **interned[] = {&s_record, &s_turn,  &s_stamp, &s_digest, &s_packed,   &s_last,  &s_starts, &s_on,
                             &s_new_entry, &s_shape, &s_dtype, &s_lean, &s_debug, &s_in_place, &s_new, &s_out,
                             &s_failed, &s_barrier};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*interned[i] = PyUnicode_InternFromString(names[i]))) return NULL;
    PyObject *module = PyModule_Create(&engine_module);
    if (!module) return NULL;
    if (PyModule_AddObjectRef(module, "SmallAllreduce", (PyObject *)&SmallAllreduceType) < 0 ||
        PyModule_AddObjectRef(module, "SegmentedAllreduce", (PyObject *)&SegmentedAllreduceType) < 0 ||
        PyModule_AddObjectRef(module, "SignedBarrier", (PyObject *)&SignedBarrierType) < 0 ||
        PyModule_AddObjectRef(module, "LeanCore", (PyObject *)&LeanCoreType) < 0 ||
        PyModule_AddObjectRef(module, "WatchdogCore", (PyObject *)&WatchdogCoreType) < 0 ||
        PyModule_AddIntConstant(module, "MODES", MODES) < 0 ||
        PyModule_AddIntConstant(module, "NOT_TAKEN", NOT_TAKEN) < 0 || PyModule_AddIntConstant(module, "FINISH", FINISH) < 0 ||
        PyModule_AddIntConstant(module, "DONE", DONE) < 0 || PyModule_AddIntConstant(module, "LATE", LATE) < 0 ||
        PyModule_AddIntConstant(module, "MISMATCH", MISMATCH) < 0 ||
        PyModule_AddIntConstant(module, "MAX_RANKS", MAX_RANKS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

/* ===================================================================================================
 * Reproducible sums: the conversion's loops (collectives/reproducible.py is the numpy path they
 * stand for, and says what each step means). One pass each: every element's code, the contributions
 * cut at the agreed codes into words, an accumulator's add (its codes raised, its level sums moved
 * and added to), the summed words rounded once, and the whole sum of every rank's raw contribution
 * gathered on each rank. Float16, bfloat16 and float32 arrive as float32 (the float32 family),
 * float64 as float64; a buffer's item size says which (the add takes float16's and bfloat16's bits
 * too, and widens them itself). The results are the numpy path's bits: the arithmetic is exact but
 * for the one rounding, which goes through the same C casts and ldexp as numpy's loops.
 * =================================================================================================== */
#include <math.h>
#if defined(__GNUC__) && !defined(__clang__)
/* the loops below read no floating-point flags: let the compiler vectorize their choices (values are
 * unchanged: this allows no reassociation, no contraction, no change of signed zeros) */
#pragma GCC optimize("no-trapping-math", "no-loop-unroll-and-jam")
#endif

/* the loops over many elements, built also for the x86-64 levels with wide vectors where the compiler
 * can (GCC on Linux), the processor's chosen at load: the same arithmetic, so the same bits */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && __GNUC__ >= 11
#define REPRO_WIDE __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define REPRO_WIDE
#endif

enum { R_WORD = 47, R_SPECIAL = 127, R_NAN = 1, R_PLUS_INF = 2, R_MINUS_INF = 4 };
enum { R32_BITS = 47, R32_LOWEST = -7, R32_TOP = 8 };   /* the float32 family: 47 value bits, one word */
enum { R64_BITS = 94, R64_LOWEST = -62, R64_TOP = 64 }; /* float64: 94 value bits, two words */

/* 2**k, for k in -1022..1023 (the loops below keep to them, without branches, so they vectorize) */
static inline double repro_pow2(int64_t k) {
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* x * 2**k, as ldexp gives it: a product by an exact power of two is rounded once, as ldexp is */
static inline double repro_ldexp(double x, int64_t k) {
    if (k > 1023 && k <= 1023 + 600) return x * repro_pow2(k - 600) * repro_pow2(600);
    if (k < -1022 || k > 1023) return ldexp(x, (int)k);
    return x * repro_pow2(k);
}

/* ceil(E / 16) for |x| < 2**E, from the exponent field: floor((field + 16 - bias) / 16) */
static inline int repro_code32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    int code = (int)((((u >> 23) & 0xffu) + 17u) >> 4) - 8;
    code = code > R32_TOP ? R_SPECIAL : code;
    return u == UINT32_C(0x80000000) ? R32_LOWEST - 1 : code; /* -0.0 */
}

static inline int repro_code64(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    int code = (int)((((u >> 52) & 0x7ffu) + 1u) >> 4) - 63;
    code = code < R64_LOWEST ? R64_LOWEST : code;
    code = code > R64_TOP ? R_SPECIAL : code;
    return u == UINT64_C(0x8000000000000000) ? R64_LOWEST - 1 : code;
}

static inline unsigned repro_special_bits(double x) {
    return x != x ? R_NAN : x == INFINITY ? R_PLUS_INF : x == -INFINITY ? R_MINUS_INF : 0;
}

/* trunc(v) for |v| < 2**51 without a call or a conversion to integers, so that it vectorizes:
 * v + 1.5 * 2**52 rounds v to an integer (nearest), then one step back toward zero where it went past */
static inline double repro_trunc(double v) {
    double r = (v + 0x1.8p52) - 0x1.8p52;
    return r - copysign((double)(fabs(r) > fabs(v)), v);
}

/* the whole units of x cut at code, as a float64 integer (exact: below 2**47), 0 at the special code */
static inline double repro_units32(float x, int code) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    int special = code == R_SPECIAL;
    u = special ? 0 : u;
    float finite;
    memcpy(&finite, &u, sizeof finite);
    return repro_trunc((double)finite * repro_pow2(special ? 0 : R32_BITS - 16 * code));
}

/* x cut toward zero at the unit 2**(16 code - 47), as repro_units32's units times the unit, given
 * k16 = 16 code + 103: the low k bits of x's significand cleared, k = k16 - max(field, 1) the unit's
 * exponent less that of x's last bit; 0 where the unit is above x (k >= 24), as at the special code;
 * -0.0 kept as it is (the sums start at +0.0, which a -0.0 leaves alone) */
static inline float repro_cut32(float x, int32_t k16) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    int32_t field = (int32_t)((u >> 23) & 0xffu);
    int32_t k = k16 - (field > 1 ? field : 1);
    uint32_t mask = k >= 24 ? 0u : k <= 0 ? ~0u : ~0u << k;
    u &= mask;
    float cut;
    memcpy(&cut, &u, sizeof cut);
    return cut;
}

/* the two words of x cut at code: high = trunc(scaled / 2**47), low = the rest, truncated; scaled =
 * x * 2**(94 - 16 code) as ldexp gives it (past 2**1023 in two exact steps: x is tiny there) */
static inline void repro_cut64(double x, int code, int64_t *high, int64_t *low) {
    int special = code == R_SPECIAL;
    int64_t k = special ? 0 : R64_BITS - 16 * code; /* -930 .. 1102 */
    int far = k > 1023;
    double scaled = (special ? 0.0 : x) * repro_pow2(far ? k - 600 : k) * repro_pow2(far ? 600 : 0);
    int64_t top = (int64_t)(scaled * 0x1p-47);
    *high = top;
    *low = (int64_t)(scaled - (double)top * 0x1p47);
}

/* an int64 below 2**62 as float64, toward zero, its last bit set where inexact (rounded to odd) */
static inline double repro_odd(int64_t whole) {
    double value = (double)whole;
    int64_t rest = whole - (int64_t)value;
    if (rest != 0) {
        int64_t bits;
        memcpy(&bits, &value, sizeof bits);
        if ((rest ^ whole) < 0) bits -= 1;
        bits |= 1;
        memcpy(&value, &bits, sizeof value);
    }
    return value;
}

static inline int repro_clip(int64_t v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : (int)v; }

/* whole * 2**unit as float64: to nearest (a subnormal rounded once, at 2**-1074), or to odd */
static inline double repro_rounded(int64_t whole, int64_t unit, int to_odd) {
    if (to_odd) return repro_ldexp(repro_odd(whole), unit);
    double value = repro_ldexp((double)whole, unit);
    if (whole != 0 && fabs(value) < 0x1p-1022) {
        int64_t drop = -1074 - unit;
        if (drop > 63) drop = 63;
        int right = repro_clip(drop, 0, 62), left = repro_clip(-drop, 0, 62);
        int64_t kept = drop > 0 ? whole >> right : (int64_t)((uint64_t)whole << left);
        int64_t rest = whole - (int64_t)((uint64_t)kept << right);
        int64_t half = (int64_t)1 << repro_clip(drop - 1, 0, 62);
        int up = drop > 0 && (rest > half || (rest == half && (kept & 1)));
        kept = drop >= 63 ? 0 : kept + up;
        value = ldexp((double)kept, -1074); /* exact: |kept| <= 2**52 */
    }
    return value;
}

/* a float64 element's two summed words as one of at most 62 bits (the bits cut off kept as a
 * sticky last bit), then rounded */
static inline double repro_rounded_pair(int64_t high, int64_t low, int64_t unit, int to_odd) {
    int64_t carry = low >> R_WORD;
    low -= (int64_t)((uint64_t)carry << R_WORD);
    high += carry;
    double magnitude = (double)(high < 0 ? -high : high);
    uint64_t field;
    memcpy(&field, &magnitude, sizeof field);
    int64_t top = high == 0 ? 0 : (int64_t)(field >> 52) - 1022; /* frexp's exponent of |high| as float64 */
    int64_t cut = top - 13 > 0 ? top - 13 : 0;
    /* cut 0 gives 2 * whole at unit - 1: the same value, without a branch on the data */
    int part = cut < R_WORD ? (int)cut : R_WORD;
    int64_t kept = (int64_t)((uint64_t)high << (R_WORD - part)) + (low >> part);
    int sticky = (low & (((int64_t)1 << part) - 1)) != 0;
    if (cut > R_WORD) {
        int more = repro_clip(cut - R_WORD, 0, 62);
        kept = high >> more;
        sticky |= ((high & (((int64_t)1 << more) - 1)) != 0) || low != 0;
    }
    return repro_rounded(2 * kept + sticky, unit + cut - 1, to_odd);
}

/* the same, where it can be had directly: the words' carry taken, high below 2**52, and the result
 * not subnormal, high * 2**47 + low is the one rounding (a float addition of exact terms) and the
 * scaling by 2**unit exact; elsewhere the sticky-bit route above */
static inline double repro_pair_value(int64_t high, int64_t low, int64_t unit, int to_odd) {
    int64_t carry = low >> R_WORD;
    int64_t rest = low - (int64_t)((uint64_t)carry << R_WORD), top = high + carry;
    if (!to_odd && top > -(INT64_C(1) << 52) && top < (INT64_C(1) << 52) && unit >= -1022 && unit <= 1023) {
        double value = ((double)top * 0x1p47 + (double)rest) * repro_pow2(unit);
        if (value == 0.0 || fabs(value) >= 0x1p-1022) return value;
    }
    return repro_rounded_pair(high, low, unit, to_odd);
}

/* NaN where some contribution is NaN or both infinities are, else the infinity there is */
static inline double repro_special_value(unsigned bits) {
    if ((bits & R_NAN) || (bits & (R_PLUS_INF | R_MINUS_INF)) == (R_PLUS_INF | R_MINUS_INF))
        return __builtin_nan("");
    return (bits & R_PLUS_INF) ? INFINITY : -INFINITY;
}

/* one element's result: the special and -0.0 codes' values as stated, else value */
static inline double repro_fixed(double value, int code, int negative_zero, unsigned bits) {
    value = code == negative_zero ? -0.0 : value;
    return code == R_SPECIAL ? repro_special_value(bits) : value;
}

/* each element's code into c; returns 1 where a special code was found, | 2 where -0.0's was */
REPRO_WIDE static long repro_codes_loop(const void *x, Py_ssize_t itemsize, int8_t *c, Py_ssize_t n) {
        int special = 0, negative_zero = 0;
        if (itemsize == 4) {
            const float *v = x;
            for (Py_ssize_t i = 0; i < n; i++) {
                int code = repro_code32(v[i]);
                special |= code == R_SPECIAL;
                negative_zero |= code == R32_LOWEST - 1;
                c[i] = (int8_t)code;
            }
        } else {
            const double *v = x;
            for (Py_ssize_t i = 0; i < n; i++) {
                int code = repro_code64(v[i]);
                special |= code == R_SPECIAL;
                negative_zero |= code == R64_LOWEST - 1;
                c[i] = (int8_t)code;
            }
        }
        return special | negative_zero << 1;
}

/* the contributions cut at the agreed codes: float64 values or int64 whole units (two for float64) */
REPRO_WIDE static void repro_words_loop(const void *x, Py_ssize_t itemsize, const int8_t *c, void *words, int as_float,
                                        Py_ssize_t n) {
        if (itemsize == 4 && as_float) {
            const float *v = x;
            double *w = words;
            for (Py_ssize_t i = 0; i < n; i++) w[i] = (double)repro_cut32(v[i], 16 * (int32_t)c[i] + 103) + 0.0; /* never -0.0 */
        } else if (itemsize == 4) {
            const float *v = x;
            int64_t *w = words;
            for (Py_ssize_t i = 0; i < n; i++) w[i] = (int64_t)repro_units32(v[i], c[i]);
        } else {
            const double *v = x;
            int64_t *w = words;
            for (Py_ssize_t i = 0; i < n; i++) repro_cut64(v[i], c[i], &w[2 * i], &w[2 * i + 1]);
        }
}

/* a C-contiguous buffer of n items of one size and kind ('f' float, 'i' signed, 'u' unsigned) */
static int repro_buffer(PyObject *object, Py_buffer *view, int writable, char kind, const char *name) {
    if (PyObject_GetBuffer(object, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    char format = view->format ? view->format[strlen(view->format) - 1] : 'B';
    int is_float = format == 'f' || format == 'd';
    int is_unsigned = format == 'B' || format == 'H' || format == 'I' || format == 'L' || format == 'Q';
    int ok = kind == 'f' ? is_float : kind == 'u' ? is_unsigned : !is_float && !is_unsigned;
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: a buffer of format '%s' is not what it takes", name, view->format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *repro_codes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "repro_codes(x, codes)");
    Py_buffer x, codes;
    if (repro_buffer(args[0], &x, 0, 'f', "repro_codes x") < 0) return NULL;
    if (repro_buffer(args[1], &codes, 1, 'i', "repro_codes codes") < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.len / x.itemsize;
    long flags = -1;
    if (codes.itemsize != 1 || codes.len != n)
        PyErr_SetString(PyExc_ValueError, "repro_codes takes an int8 code per element");
    else {
        flags = repro_codes_loop(x.buf, x.itemsize, codes.buf, n);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&codes);
    return flags < 0 ? NULL : PyLong_FromLong(flags);
}

static PyObject *repro_words(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "repro_words(x, agreed, words)");
    Py_buffer x, agreed, words;
    if (repro_buffer(args[0], &x, 0, 'f', "repro_words x") < 0) return NULL;
    if (repro_buffer(args[1], &agreed, 0, 'i', "repro_words agreed") < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &words, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&agreed);
        return NULL;
    }
    Py_ssize_t n = x.len / x.itemsize;
    int as_float = words.format && strchr(words.format, 'd') != NULL;
    Py_ssize_t per = x.itemsize == 8 ? 2 : 1;
    PyObject *result = NULL;
    if (agreed.itemsize != 1 || agreed.len != n || words.itemsize != 8 || words.len != 8 * n * per ||
        (as_float && per == 2))
        PyErr_SetString(PyExc_ValueError, "repro_words: an int8 code per element, and the words' room");
    else {
        repro_words_loop(x.buf, x.itemsize, agreed.buf, words.buf, as_float, n);
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&agreed);
    PyBuffer_Release(&words);
    return result;
}

/* ---- an accumulator's add (collectives.reproducible.Levels.add): one pass over a contribution ----
 * Per element: its code, the stored code raised to it (the sums moved down a level a step it rose),
 * and the contribution cut at the raised code and the grid steps above, added to the level sums;
 * an element whose code is special takes nothing more. Levels' sums are int64 (levels, count * words),
 * a float64 element's two words side by side, as the numpy path lays them out. */
enum { R32_LEVELS = 3, R64_LEVELS = 6, R_ADD_BLOCK = 512 };
enum { R_FLOAT16 = 1, R_BFLOAT16 = 2, R_FLOAT32 = 3, R_FLOAT64 = 4 }; /* reproducible.BITS_OF's numbers */

/* one element's sums moved down by the steps its code rose (Levels._lift): level l takes level
 * l + steps, the top ones 0 (all of them where it rose by levels or more) */
static void repro_lift(int64_t *levels, Py_ssize_t stride, int count, int words, Py_ssize_t at, int steps) {
    for (int l = 0; l < count; l++)
        for (int w = 0; w < words; w++)
            levels[l * stride + at + w] = l + steps < count ? levels[(l + steps) * stride + at + w] : 0;
}

/* a block's stored codes c raised to the contribution's (codes of x, from code_of), the sums of
 * those that rose moved down; raised codes into up; returns 1 where x holds an inf or a NaN */
#define REPRO_RAISE(code_of, levels_count, words)                                                  \
    uint8_t rose = 0, special = 0;                                                                 \
    for (Py_ssize_t i = 0; i < m; i++) {                                                           \
        int own = code_of(v[i]), stored = c[i];                                                    \
        int raised = own > stored ? own : stored;                                                  \
        up[i] = (int8_t)raised;                                                                    \
        rose |= raised != stored;                                                                  \
        special |= own == R_SPECIAL;                                                               \
    }                                                                                              \
    for (Py_ssize_t i = 0; rose && i < m; i++)                                                     \
        if (up[i] != c[i]) {                                                                       \
            repro_lift(levels, stride, levels_count, words, (words) * (start + i), up[i] - c[i]);  \
            c[i] = up[i];                                                                          \
        }                                                                                          \
    for (Py_ssize_t i = 0; special && i < m; i++)                                                  \
        if (bits) bits[start + i] |= (uint8_t)repro_special_bits(v[i]);                            \
    found |= special;

/* float16 bits as float32 (exact: every float16 is a float32): the fields moved, a subnormal's
 * value made from its significand; inf and NaN (their payload kept) as such */
static inline float repro_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, field = (h >> 10) & 0x1fu, significand = h & 0x3ffu;
    uint32_t bits = sign | (field == 0x1f ? 0xffu : field + 112) << 23 | significand << 13;
    float tiny = (float)significand * 0x1p-24f; /* exact */
    uint32_t tiny_bits;
    memcpy(&tiny_bits, &tiny, sizeof tiny_bits);
    bits = field == 0 ? (tiny_bits | sign) : bits;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* bfloat16 bits as float32: its top half */
static inline float repro_brain(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* the float32 family: x's elements (float32, or float16 or bfloat16 bits widened a block at a time:
 * kind is BITS_OF's number) cut at their raised code c (level 0) and the two steps above,
 * trunc(x * 2**(47 - 16 (c + l))) whole units, each product exact in float64 */
REPRO_WIDE static int repro_add32(const void *x, int kind, int8_t *codes, int64_t *levels, uint8_t *bits,
                                  Py_ssize_t n) {
    Py_ssize_t stride = n;
    int8_t up[R_ADD_BLOCK];
    float widened[R_ADD_BLOCK];
    int found = 0;
    for (Py_ssize_t start = 0; start < n; start += R_ADD_BLOCK) {
        Py_ssize_t m = n - start < R_ADD_BLOCK ? n - start : R_ADD_BLOCK;
        const float *v = widened;
        const uint16_t *narrow = (const uint16_t *)x + start;
        if (kind == R_FLOAT16)
            for (Py_ssize_t i = 0; i < m; i++) widened[i] = repro_half(narrow[i]);
        else if (kind == R_BFLOAT16)
            for (Py_ssize_t i = 0; i < m; i++) widened[i] = repro_brain(narrow[i]);
        else
            v = (const float *)x + start;
        int8_t *c = codes + start;
        REPRO_RAISE(repro_code32, R32_LEVELS, 1)
        int64_t *l0 = levels + start, *l1 = l0 + stride, *l2 = l1 + stride;
        for (Py_ssize_t i = 0; i < m; i++) {
            int skip = up[i] == R_SPECIAL;
            double scaled = (skip ? 0.0 : (double)v[i]) * repro_pow2(skip ? 0 : R32_BITS - 16 * up[i]);
            l0[i] += (int64_t)scaled;
            l1[i] += (int64_t)(scaled * 0x1p-16);
            l2[i] += (int64_t)(scaled * 0x1p-32);
        }
    }
    return found;
}

/* float64: x's elements cut at their raised code and the five steps above, two words each (high =
 * trunc(scaled / 2**47), low = the rest, truncated), scaled = x * 2**(94 - 16 code) as repro_cut64
 * has it, then 2**-16 a level as the numpy path (exact, or below one unit: 0 either way) */
REPRO_WIDE static int repro_add64(const double *x, int8_t *codes, int64_t *levels, uint8_t *bits, Py_ssize_t n) {
    Py_ssize_t stride = 2 * n;
    int8_t up[R_ADD_BLOCK];
    double scaled[R_ADD_BLOCK];
    int found = 0;
    for (Py_ssize_t start = 0; start < n; start += R_ADD_BLOCK) {
        Py_ssize_t m = n - start < R_ADD_BLOCK ? n - start : R_ADD_BLOCK;
        const double *v = x + start;
        int8_t *c = codes + start;
        REPRO_RAISE(repro_code64, R64_LEVELS, 2)
        for (Py_ssize_t i = 0; i < m; i++) {
            int skip = up[i] == R_SPECIAL;
            int64_t k = skip ? 0 : R64_BITS - 16 * up[i]; /* -930 .. 1102 */
            int far = k > 1023;
            scaled[i] = (skip ? 0.0 : v[i]) * repro_pow2(far ? k - 600 : k) * repro_pow2(far ? 600 : 0);
        }
        for (int l = 0; l < R64_LEVELS; l++) {
            int64_t *w = levels + l * stride + 2 * start;
            for (Py_ssize_t i = 0; i < m; i++) {
                int64_t top = (int64_t)(scaled[i] * 0x1p-47);
                w[2 * i] += top;
                w[2 * i + 1] += (int64_t)(scaled[i] - (double)top * 0x1p47);
                scaled[i] *= 0x1p-16;
            }
        }
    }
    return found;
}

/* add(x, codes, levels, specials or None, kind) -> whether x holds an inf or a NaN (the caller makes
 * the specials from x where it had none): x added to an accumulator's codes and level sums in one
 * pass; kind is x's dtype by BITS_OF's numbers, float16's and bfloat16's bits as uint16 */
static PyObject *repro_add(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) return PyErr_Format(PyExc_TypeError, "repro_add(x, codes, levels, specials, kind)");
    long kind = PyLong_AsLong(args[4]);
    if (kind == -1 && PyErr_Occurred()) return NULL;
    if (kind < R_FLOAT16 || kind > R_FLOAT64) return PyErr_Format(PyExc_ValueError, "repro_add: kind %ld", kind);
    Py_buffer x, codes, levels, specials = {0};
    if (repro_buffer(args[0], &x, 0, kind < R_FLOAT32 ? 'u' : 'f', "repro_add x") < 0) return NULL;
    if (repro_buffer(args[1], &codes, 1, 'i', "repro_add codes") < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    if (repro_buffer(args[2], &levels, 1, 'i', "repro_add levels") < 0) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&codes);
        return NULL;
    }
    if (args[3] != Py_None && repro_buffer(args[3], &specials, 1, 'u', "repro_add specials") < 0) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&codes);
        PyBuffer_Release(&levels);
        return NULL;
    }
    Py_ssize_t n = x.len / x.itemsize;
    int wide = kind == R_FLOAT64;
    Py_ssize_t cells = n * (wide ? 2 * R64_LEVELS : R32_LEVELS);
    PyObject *result = NULL;
    if (x.itemsize != (kind < R_FLOAT32 ? 2 : wide ? 8 : 4) || codes.itemsize != 1 || codes.len != n ||
        levels.itemsize != 8 || levels.len != 8 * cells || (specials.obj && (specials.itemsize != 1 || specials.len != n)))
        PyErr_SetString(PyExc_ValueError,
                        "repro_add: x of its kind, an int8 code, the levels' words and a special byte per element");
    else {
        uint8_t *bits = specials.obj ? specials.buf : NULL;
        int found;
        Py_BEGIN_ALLOW_THREADS /* milliseconds on large arrays, as numpy's loops of the same pass */
        found = wide ? repro_add64(x.buf, codes.buf, levels.buf, bits, n)
                     : repro_add32(x.buf, (int)kind, codes.buf, levels.buf, bits, n);
        Py_END_ALLOW_THREADS
        result = PyBool_FromLong(found);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&levels);
    if (specials.obj) PyBuffer_Release(&specials);
    return result;
}

/* finish's values into o, by the kind of sums: exact float64, one word (float32 family), two words */
#define REPRO_VALUES(o)                                                                              \
    if (exact && by == 1.0) {                                                                        \
        const double *values = sums;                                                                 \
        for (Py_ssize_t i = 0; i < n; i++) o[i] = values[i];                                         \
    } else if (exact) {                                                                              \
        const double *values = sums;                                                                 \
        for (Py_ssize_t i = 0; i < n; i++) o[i] = values[i] / by;                                    \
    } else if (!pairs) {                                                                             \
        const int64_t *whole = sums;                                                                 \
        for (Py_ssize_t i = 0; i < n; i++) {                                                         \
            int special = c[i] == R_SPECIAL;                                                         \
            double value = to_odd ? repro_odd(whole[i]) : (double)whole[i];                          \
            o[i] = value * repro_pow2(special ? 0 : 16 * c[i] - R32_BITS) / by;                      \
        }                                                                                            \
    } else {                                                                                         \
        const int64_t *words = sums;                                                                 \
        for (Py_ssize_t i = 0; i < n; i++) {                                                         \
            int64_t unit = c[i] == R_SPECIAL ? 0 : 16 * (int64_t)c[i] - R64_BITS;                    \
            o[i] = repro_pair_value(words[2 * i], words[2 * i + 1], unit, to_odd) / by;              \
        }                                                                                            \
    }

/* finish's values into out, by the kind of sums: exact float64, one word (float32 family), two words */
REPRO_WIDE static void repro_finish_loop(const void *sums, int exact, int pairs, int to_odd, const int8_t *c,
                                         void *out, int out_size, double by, Py_ssize_t n) {
    if (out_size == 4) {
        float *o = out;
        REPRO_VALUES(o)
    } else {
        double *o = out;
        REPRO_VALUES(o)
    }
}

/* whether some code is the special one or -0.0's (bytes compared a vector at a time) */
REPRO_WIDE static int repro_any_fixed(const int8_t *c, Py_ssize_t n, int8_t negative_zero) {
    uint8_t any = 0;
    for (Py_ssize_t i = 0; i < n; i++) any |= (uint8_t)((c[i] == R_SPECIAL) | (c[i] == negative_zero));
    return any != 0;
}

/* finish(sums, codes, out, to_odd, divide_by, specials or None): the summed words of elements with
 * agreed codes, rounded once into out (float32, or float64 for float64 and for float16 and bfloat16,
 * whose last rounding numpy does) */
static PyObject *repro_finish(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) return PyErr_Format(PyExc_TypeError, "repro_finish(sums, codes, out, to_odd, divide_by, specials)");
    int to_odd = PyObject_IsTrue(args[3]);
    long divide_by = PyLong_AsLong(args[4]);
    if (to_odd < 0 || (divide_by == -1 && PyErr_Occurred())) return NULL;
    Py_buffer sums, codes, out, specials = {0};
    if (PyObject_GetBuffer(args[0], &sums, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (repro_buffer(args[1], &codes, 0, 'i', "repro_finish codes") < 0) {
        PyBuffer_Release(&sums);
        return NULL;
    }
    if (repro_buffer(args[2], &out, 1, 'f', "repro_finish out") < 0) {
        PyBuffer_Release(&sums);
        PyBuffer_Release(&codes);
        return NULL;
    }
    if (args[5] != Py_None && repro_buffer(args[5], &specials, 0, 'u', "repro_finish specials") < 0) {
        PyBuffer_Release(&sums);
        PyBuffer_Release(&codes);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t n = codes.len;
    int exact = sums.format && strchr(sums.format, 'd') != NULL;
    Py_ssize_t per = sums.itemsize == 8 ? sums.len / 8 / (n ? n : 1) : 0;
    int pairs = per == 2;
    PyObject *result = NULL;
    if (codes.itemsize != 1 || sums.itemsize != 8 || sums.len != 8 * n * (n ? per : 0) || (exact && pairs) ||
        (per != 1 && per != 2 && n) || out.len != n * out.itemsize || (specials.obj && specials.len != n) ||
        divide_by < 1)
        PyErr_SetString(PyExc_ValueError, "repro_finish: the sums, codes, result and specials of one count");
    else {
        const int8_t *c = codes.buf;
        repro_finish_loop(sums.buf, exact, pairs, to_odd, c, out.buf, (int)out.itemsize, (double)divide_by, n);
        int negative_zero = pairs ? R64_LOWEST - 1 : R32_LOWEST - 1;
        int fix = repro_any_fixed(c, n, (int8_t)negative_zero);
        const uint8_t *bits = specials.obj ? specials.buf : NULL;
        for (Py_ssize_t i = 0; fix && i < n; i++)
            if (c[i] == R_SPECIAL || c[i] == negative_zero) {
                double value = repro_fixed(0.0, c[i], negative_zero, bits ? bits[i] : 0);
                if (out.itemsize == 4)
                    ((float *)out.buf)[i] = (float)value;
                else
                    ((double *)out.buf)[i] = value;
            }
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&sums);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&out);
    if (specials.obj) PyBuffer_Release(&specials);
    return result;
}


enum { R_BLOCK = 512 }; /* elements a pass of the gathered sum takes, so that its loops vectorize */

static inline void repro_put(void *out, int out_size, Py_ssize_t i, double value) {
    if (out_size == 4)
        ((float *)out)[i] = (float)value;
    else
        ((double *)out)[i] = value;
}

/* a block's special elements: the or of their rows' special_bits, read before the result is written
 * (it may be one of the rows) */
static void repro_rows_specials(const int8_t *codes, Py_ssize_t m, const void *const *rows, Py_ssize_t item,
                                Py_ssize_t size, Py_ssize_t start, uint8_t *bits) {
    for (Py_ssize_t i = 0; i < m; i++) {
        unsigned found = 0;
        for (Py_ssize_t r = 0; r < size && codes[i] == R_SPECIAL; r++)
            found |= item == 4 ? repro_special_bits(((const float *)rows[r])[start + i])
                               : repro_special_bits(((const double *)rows[r])[start + i]);
        bits[i] = (uint8_t)found;
    }
}

/* the elements of a block whose code is special or -0.0's: their values as stated */
static void repro_rows_fixed(const int8_t *codes, const uint8_t *bits, Py_ssize_t m, int negative_zero, void *out,
                             int out_size, Py_ssize_t start) {
    for (Py_ssize_t i = 0; i < m; i++)
        if (codes[i] == R_SPECIAL || codes[i] == negative_zero)
            repro_put(out, out_size, start + i, repro_fixed(0.0, codes[i], negative_zero, bits[i]));
}

/* the float32 family's rows (size pointers to n floats), a block of elements at a time (the block's
 * rows stay in the cache): each element's code the max of its rows', its rows cut at that code and
 * summed exactly in float64 (multiples of the unit below 2**53 of it for at most 64 rows, so in any
 * order), rounded once into out (which may be one of the rows) */
REPRO_WIDE static void repro_rows32(const void *const *rows, Py_ssize_t size, Py_ssize_t n, void *out, int out_size,
                                    double by) {
    int8_t codes[R_BLOCK];
    int32_t k16[R_BLOCK];
    double sums[R_BLOCK];
    uint8_t bits[R_BLOCK];
    for (Py_ssize_t start = 0; start < n; start += R_BLOCK) {
        Py_ssize_t m = n - start < R_BLOCK ? n - start : R_BLOCK;
        for (Py_ssize_t i = 0; i < m; i++) k16[i] = R32_LOWEST - 1;
        for (Py_ssize_t r = 0; r < size; r++) {
            const float *row = (const float *)rows[r] + start;
            for (Py_ssize_t i = 0; i < m; i++) {
                int32_t own = repro_code32(row[i]);
                k16[i] = own > k16[i] ? own : k16[i];
            }
        }
        int fix = 0;
        for (Py_ssize_t i = 0; i < m; i++) {
            fix |= (k16[i] == R_SPECIAL) | (k16[i] == R32_LOWEST - 1);
            codes[i] = (int8_t)k16[i];
            k16[i] = 16 * k16[i] + 103;
            sums[i] = 0.0;
        }
        for (Py_ssize_t r = 0; r < size; r++) {
            const float *row = (const float *)rows[r] + start;
            for (Py_ssize_t i = 0; i < m; i++) sums[i] += (double)repro_cut32(row[i], k16[i]);
        }
        if (fix) repro_rows_specials(codes, m, rows, 4, size, start, bits);
        if (out_size == 4) {
            float *o = (float *)out + start;
            if (by == 1.0)
                for (Py_ssize_t i = 0; i < m; i++) o[i] = (float)sums[i];
            else
                for (Py_ssize_t i = 0; i < m; i++) o[i] = (float)(sums[i] / by);
        } else {
            double *o = (double *)out + start;
            for (Py_ssize_t i = 0; i < m; i++) o[i] = sums[i] / by; /* exact where by is 1 */
        }
        if (fix) repro_rows_fixed(codes, bits, m, R32_LOWEST - 1, out, out_size, start);
    }
}

/* float64's rows: each element's two words summed, as the distributed sum's, then rounded once */
REPRO_WIDE static void repro_rows64(const void *const *rows, Py_ssize_t size, Py_ssize_t n, void *out, int out_size,
                                    double by, int to_odd) {
    int8_t codes[R_BLOCK];
    int64_t high[R_BLOCK], low[R_BLOCK];
    uint8_t bits[R_BLOCK];
    for (Py_ssize_t start = 0; start < n; start += R_BLOCK) {
        Py_ssize_t m = n - start < R_BLOCK ? n - start : R_BLOCK;
        for (Py_ssize_t i = 0; i < m; i++) codes[i] = R64_LOWEST - 1;
        for (Py_ssize_t r = 0; r < size; r++) {
            const double *row = (const double *)rows[r] + start;
            for (Py_ssize_t i = 0; i < m; i++) {
                int own = repro_code64(row[i]);
                codes[i] = (int8_t)(own > codes[i] ? own : codes[i]);
            }
        }
        for (Py_ssize_t i = 0; i < m; i++) high[i] = low[i] = 0;
        for (Py_ssize_t r = 0; r < size; r++) {
            const double *row = (const double *)rows[r] + start;
            for (Py_ssize_t i = 0; i < m; i++) {
                int64_t h, l;
                repro_cut64(row[i], codes[i], &h, &l);
                high[i] += h;
                low[i] += l;
            }
        }
        int fix = repro_any_fixed(codes, m, R64_LOWEST - 1);
        if (fix) repro_rows_specials(codes, m, rows, 8, size, start, bits);
        for (Py_ssize_t i = 0; i < m; i++) {
            int64_t unit = codes[i] == R_SPECIAL ? 0 : 16 * (int64_t)codes[i] - R64_BITS;
            repro_put(out, out_size, start + i, repro_pair_value(high[i], low[i], unit, to_odd) / by);
        }
        if (fix) repro_rows_fixed(codes, bits, m, R64_LOWEST - 1, out, out_size, start);
    }
}

/* rows(message, size, count, out, to_odd, divide_by) -> whether the rows' trailers agree: the
 * reproducible sum of ``size`` ranks' raw contributions, each rank's row of ``message`` (its
 * ``count`` floats, as float32 or float64 bits, then a trailer), into out (as finish's) */
static PyObject *repro_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) return PyErr_Format(PyExc_TypeError, "repro_rows(message, size, count, out, to_odd, divide_by)");
    Py_ssize_t size = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    Py_ssize_t n = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    int to_odd = PyObject_IsTrue(args[4]);
    long divide_by = PyLong_AsLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer message, out;
    if (PyObject_GetBuffer(args[0], &message, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (repro_buffer(args[3], &out, 1, 'f', "repro_rows out") < 0) {
        PyBuffer_Release(&message);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t item = message.itemsize, stride = size > 0 ? message.len / item / size : 0;
    if (size < 1 || size > 64 || (item != 4 && item != 8) || message.len != size * stride * item || stride < n ||
        out.len != n * out.itemsize || divide_by < 1)
        PyErr_SetString(PyExc_ValueError, "repro_rows: 1 to 64 rows of count floats and a trailer, and a result of count");
    else {
        const char *base = message.buf;
        const void *rows[64];
        int agree = 1;
        for (Py_ssize_t r = 0; r < size; r++) rows[r] = base + r * stride * item;
        for (Py_ssize_t r = 1; r < size && agree; r++)
            agree = memcmp(base + (n * item), base + (r * stride + n) * item, (size_t)((stride - n) * item)) == 0;
        if (agree && out.itemsize == item && !to_odd) /* float32 or float64 rounded by the sum itself */
            repro_rows_all(item == 4 ? F32 : F64, rows, size, out.buf, n, (double)divide_by);
        else if (agree && item == 4)
            repro_rows32(rows, size, n, out.buf, (int)out.itemsize, (double)divide_by);
        else if (agree)
            repro_rows64(rows, size, n, out.buf, (int)out.itemsize, (double)divide_by, to_odd);
        result = PyBool_FromLong(agree);
    }
    PyBuffer_Release(&message);
    PyBuffer_Release(&out);
    return result;
}

/* a block of repro_pair32 into made: whether some element's code is the special one (an inf or a
 * NaN among its two) or -0.0's (both -0.0), whose results the caller sets. Else an element's code is
 * that of the larger exponent field of its two (the code grows with the field), and each of the two
 * is cut as repro_cut32 cuts it. The sum is taken in float32 (`how` PAIR_SUM), or in float64 and
 * multiplied by `by` (PAIR_SCALED: a power of two, which is exact as the division by its inverse is)
 * or divided by it (PAIR_DIVIDED), then rounded. The reductions are of the inputs' bits, beside the
 * codes, so that the loop vectorizes. */
enum { PAIR_SUM, PAIR_SCALED, PAIR_DIVIDED };
static inline int repro_pair32_block(const float *x, const float *y, float *made, Py_ssize_t m, int how, double by) {
    uint32_t widest = 0, zeros = UINT32_MAX;
    for (Py_ssize_t i = 0; i < m; i++) {
        uint32_t ux, uy;
        memcpy(&ux, &x[i], sizeof ux);
        memcpy(&uy, &y[i], sizeof uy);
        int32_t fx = (int32_t)((ux >> 23) & 0xffu), fy = (int32_t)((uy >> 23) & 0xffu);
        int32_t field = fx > fy ? fx : fy;
        widest = (uint32_t)field > widest ? (uint32_t)field : widest;
        uint32_t both = (ux ^ UINT32_C(0x80000000)) | (uy ^ UINT32_C(0x80000000)); /* 0: both -0.0 */
        zeros = both < zeros ? both : zeros;
        int32_t k16 = 16 * ((field + 17) >> 4) - 25; /* 16 code + 103 */
        int32_t kx = k16 - (fx > 1 ? fx : 1), ky = k16 - (fy > 1 ? fy : 1);
        ux &= kx >= 24 ? 0u : ~0u << (kx > 0 ? kx : 0);
        uy &= ky >= 24 ? 0u : ~0u << (ky > 0 ? ky : 0);
        float p, q;
        memcpy(&p, &ux, sizeof p);
        memcpy(&q, &uy, sizeof q);
        double wide = (0.0 + (double)p) + (double)q;
        made[i] = how == PAIR_SUM ? (0.0f + p) + q : (float)(how == PAIR_SCALED ? wide * by : wide / by);
    }
    return widest == 0xffu || zeros == 0;
}

/* repro_pair32_block's float64 twin (repro_rows64's arithmetic): the code of the larger field, each
 * input cut at its unit 2**(16 code - 94) by clearing the significand's bits below it (the words'
 * truncation, as repro_cut64 makes them), and the sum of the two cut values rounded once: a float64
 * addition, correctly rounded (to a subnormal too), is the one rounding of their exact sum that the
 * words' sum gets; scaled or divided after that rounding, as finish divides the rounded sum. */
static inline int repro_pair64_block(const double *x, const double *y, double *made, Py_ssize_t m, int how,
                                     double by) {
    uint64_t widest = 0, zeros = UINT64_MAX;
    const uint64_t sign = UINT64_C(0x8000000000000000);
    for (Py_ssize_t i = 0; i < m; i++) {
        uint64_t ux, uy;
        memcpy(&ux, &x[i], sizeof ux);
        memcpy(&uy, &y[i], sizeof uy);
        int64_t fx = (int64_t)((ux >> 52) & 0x7ffu), fy = (int64_t)((uy >> 52) & 0x7ffu);
        int64_t field = fx > fy ? fx : fy;
        widest = (uint64_t)field > widest ? (uint64_t)field : widest;
        uint64_t both = (ux ^ sign) | (uy ^ sign); /* 0: both -0.0 */
        zeros = both < zeros ? both : zeros;
        int64_t code = ((field + 1) >> 4) - 63;
        code = code < R64_LOWEST ? R64_LOWEST : code;
        int64_t k16 = 16 * code + 981; /* the unit's exponent less that of the field's last bit, + field */
        int64_t kx = k16 - (fx > 1 ? fx : 1), ky = k16 - (fy > 1 ? fy : 1);
        /* the bits shifted out and back (GCC 12 vectorizes no 64-bit shift of a constant by lanes) */
        uint64_t sx = (uint64_t)(kx < 0 ? 0 : kx > 63 ? 63 : kx), sy = (uint64_t)(ky < 0 ? 0 : ky > 63 ? 63 : ky);
        ux = kx >= 53 ? 0u : (ux >> sx) << sx;
        uy = ky >= 53 ? 0u : (uy >> sy) << sy;
        double p, q;
        memcpy(&p, &ux, sizeof p);
        memcpy(&q, &uy, sizeof q);
        double sum = (0.0 + p) + q;
        made[i] = how == PAIR_SUM ? sum : how == PAIR_SCALED ? sum * by : sum / by;
    }
    return widest == 0x7ffu || zeros == 0;
}

/* repro_rows32 or repro_rows64 of two rows, in one pass a block: a block is made (its elements' codes
 * the larger of their two, both cut there and summed, rounded once) before it is stored (out may be
 * a or b), its special and -0.0 elements then set as the rows' sums set them. Where there is no
 * divisor the float32 family's sum is taken in float32: the cut values are float32s, and their
 * float32 sum is their exact sum rounded once, as (float) of it in float64 is (0.0f + first, as the
 * rows' sums start from +0.0). */
REPRO_WIDE static void repro_pair_loop(Kind kind, const void *a, const void *b, void *out, Py_ssize_t n, double by) {
    int exponent, item = kind == F32 ? 4 : 8;
    double inverse = frexp(by, &exponent) == 0.5 ? 1.0 / by : 0.0; /* exact where by is a power of two */
    int how = by == 1.0 ? PAIR_SUM : inverse > 0.0 ? PAIR_SCALED : PAIR_DIVIDED;
    double scale = how == PAIR_SCALED ? inverse : by;
    union { float single[R_BLOCK]; double wide[R_BLOCK]; } made;
    int8_t codes[R_BLOCK];
    uint8_t bits[R_BLOCK];
    const void *rows[2] = {a, b};
    int negative_zero = kind == F32 ? R32_LOWEST - 1 : R64_LOWEST - 1;
    for (Py_ssize_t start = 0; start < n; start += R_BLOCK) {
        Py_ssize_t m = n - start < R_BLOCK ? n - start : R_BLOCK;
        int fix;
        if (kind == F32) {
            const float *x = (const float *)a + start, *y = (const float *)b + start;
            fix = how == PAIR_SUM      ? repro_pair32_block(x, y, made.single, m, PAIR_SUM, 1.0)
                  : how == PAIR_SCALED ? repro_pair32_block(x, y, made.single, m, PAIR_SCALED, scale)
                                       : repro_pair32_block(x, y, made.single, m, PAIR_DIVIDED, scale);
            for (Py_ssize_t i = 0; fix && i < m; i++) {
                int cx = repro_code32(x[i]), cy = repro_code32(y[i]);
                codes[i] = (int8_t)(cx > cy ? cx : cy);
            }
        } else {
            const double *x = (const double *)a + start, *y = (const double *)b + start;
            fix = how == PAIR_SUM      ? repro_pair64_block(x, y, made.wide, m, PAIR_SUM, 1.0)
                  : how == PAIR_SCALED ? repro_pair64_block(x, y, made.wide, m, PAIR_SCALED, scale)
                                       : repro_pair64_block(x, y, made.wide, m, PAIR_DIVIDED, scale);
            for (Py_ssize_t i = 0; fix && i < m; i++) {
                int cx = repro_code64(x[i]), cy = repro_code64(y[i]);
                codes[i] = (int8_t)(cx > cy ? cx : cy);
            }
        }
        if (fix) repro_rows_specials(codes, m, rows, item, 2, start, bits);
        memcpy((char *)out + start * item, &made, (size_t)(m * item));
        if (fix) repro_rows_fixed(codes, bits, m, negative_zero, out, item, start);
    }
}

/* repro_rows32 and repro_rows64 of 2 to 64 rows into out of their dtype, a block at a time, in passes
 * that vectorize: the larger exponent field of each element's rows (its code the field's, as in
 * repro_pair32_block), the rows cut at that code by masking and summed, rounded once. The float32
 * family's cut values sum exactly in float64 (as repro_rows32's). Float64's are added in a float64
 * pair (hi, lo) by TwoSum: every partial sum and error is a multiple of the unit, the errors together
 * below 2**52 units, so hi + lo is the exact sum and one addition rounds it (to a subnormal too);
 * elements of the top codes are summed scaled by 2**-8, exactly, so that no partial sum overflows
 * where the whole sum does not. Special and -0.0 elements are set as the rows' sums set them. */
enum { R_SCALED_CODE = 60 };

/* a block's codes (the max of its rows') and specials, where repro_many_loop found some special or -0.0
 * element: read before the block's results are stored (out may be one of the rows) */
static void repro_many_fix(const void *const *rows, Py_ssize_t size, Py_ssize_t start, Py_ssize_t m, int item,
                           int8_t *codes, uint8_t *bits) {
    for (Py_ssize_t i = 0; i < m; i++) codes[i] = item == 4 ? R32_LOWEST - 1 : R64_LOWEST - 1;
    for (Py_ssize_t r = 0; r < size; r++)
        for (Py_ssize_t i = 0; i < m; i++) {
            int own = item == 4 ? repro_code32(((const float *)rows[r])[start + i])
                                : repro_code64(((const double *)rows[r])[start + i]);
            codes[i] = (int8_t)(own > codes[i] ? own : codes[i]);
        }
    repro_rows_specials(codes, m, rows, item, size, start, bits);
}

/* one row's pass of repro_many32_block over a block: its fields into the largest so far, its bits
 * into the or that is 0 where every row is -0.0; then its cut values into the sums. Each a function
 * of restrict pointers, so that the loops vectorize without checks of overlap at run time. */
static inline void repro_fields32(const uint32_t *restrict row, int32_t *restrict fields,
                                  uint32_t *restrict nonzero, Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) {
        int32_t field = (int32_t)((row[i] >> 23) & 0xffu);
        fields[i] = field > fields[i] ? field : fields[i];
        nonzero[i] |= row[i] ^ UINT32_C(0x80000000);
    }
}

/* the first row's passes: set where the others' combine (zeroing the block's arrays first took an
 * eighth of the time at four rows) */
static inline void repro_fields32_first(const uint32_t *restrict row, int32_t *restrict fields,
                                        uint32_t *restrict nonzero, Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) {
        fields[i] = (int32_t)((row[i] >> 23) & 0xffu);
        nonzero[i] = row[i] ^ UINT32_C(0x80000000);
    }
}

static inline float repro_cut32_at(uint32_t u, int32_t k16) {
    int32_t f = (int32_t)((u >> 23) & 0xffu), k = k16 - (f > 1 ? f : 1);
    u &= k >= 24 ? 0u : ~0u << (k > 0 ? k : 0);
    float cut;
    memcpy(&cut, &u, sizeof cut);
    return cut;
}

static inline void repro_cuts32(const uint32_t *restrict row, const int32_t *restrict k16, double *restrict sums,
                                Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) sums[i] += (double)repro_cut32_at(row[i], k16[i]);
}

static inline void repro_cuts32_first(const uint32_t *restrict row, const int32_t *restrict k16,
                                      double *restrict sums, Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) sums[i] = (double)repro_cut32_at(row[i], k16[i]);
}

static inline void repro_fields64(const uint64_t *restrict row, int64_t *restrict fields,
                                  uint64_t *restrict nonzero, Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t field = (int64_t)((row[i] >> 52) & 0x7ffu);
        fields[i] = field > fields[i] ? field : fields[i];
        nonzero[i] |= row[i] ^ UINT64_C(0x8000000000000000);
    }
}

static inline void repro_fields64_first(const uint64_t *restrict row, int64_t *restrict fields,
                                        uint64_t *restrict nonzero, Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) {
        fields[i] = (int64_t)((row[i] >> 52) & 0x7ffu);
        nonzero[i] = row[i] ^ UINT64_C(0x8000000000000000);
    }
}

static inline double repro_cut64_at(uint64_t u, int64_t k16) {
    int64_t f = (int64_t)((u >> 52) & 0x7ffu), k = k16 - (f > 1 ? f : 1);
    uint64_t shift = (uint64_t)(k < 0 ? 0 : k > 63 ? 63 : k); /* see repro_pair64_block */
    u = k >= 53 ? 0u : (u >> shift) << shift;
    double cut;
    memcpy(&cut, &u, sizeof cut);
    return cut;
}

static inline void repro_cuts64(const uint64_t *restrict row, const int64_t *restrict k16,
                                const double *restrict scale, double *restrict sums, double *restrict lo,
                                Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) {
        double cut = repro_cut64_at(row[i], k16[i]) * scale[i];
        double sum = sums[i] + cut, back = sum - cut; /* TwoSum: the addition's error, exactly */
        lo[i] += (sums[i] - back) + (cut - (sum - back));
        sums[i] = sum;
    }
}

static inline void repro_cuts64_first(const uint64_t *restrict row, const int64_t *restrict k16,
                                      const double *restrict scale, double *restrict sums, double *restrict lo,
                                      Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) {
        sums[i] = repro_cut64_at(row[i], k16[i]) * scale[i];
        lo[i] = 0.0;
    }
}

/* the float32 family's block of repro_many_loop: the exact sums in float64 into sums; whether some
 * element is special or -0.0 */
static inline int repro_many32_block(const void *const *rows, Py_ssize_t size, Py_ssize_t start, Py_ssize_t m,
                                     double *sums) {
    int32_t fields[R_BLOCK];
    uint32_t nonzero[R_BLOCK]; /* 0 where every row is -0.0 */
    repro_fields32_first((const uint32_t *)rows[0] + start, fields, nonzero, m);
    for (Py_ssize_t r = 1; r < size; r++) repro_fields32((const uint32_t *)rows[r] + start, fields, nonzero, m);
    int32_t widest = 0;
    uint32_t zeros = UINT32_MAX;
    for (Py_ssize_t i = 0; i < m; i++) {
        widest = fields[i] > widest ? fields[i] : widest;
        zeros = nonzero[i] < zeros ? nonzero[i] : zeros;
        fields[i] = 16 * ((fields[i] + 17) >> 4) - 25; /* now 16 code + 103, as repro_cut32 takes it */
    }
    repro_cuts32_first((const uint32_t *)rows[0] + start, fields, sums, m);
    for (Py_ssize_t r = 1; r < size; r++) repro_cuts32((const uint32_t *)rows[r] + start, fields, sums, m);
    return widest == 0xff || zeros == 0;
}

/* float64's block of repro_many_loop: the sums rounded once into sums; whether some element is special
 * or -0.0 */
static inline int repro_many64_block(const void *const *rows, Py_ssize_t size, Py_ssize_t start, Py_ssize_t m,
                                     double *sums) {
    int64_t fields[R_BLOCK];
    uint64_t nonzero[R_BLOCK]; /* 0 where every row is -0.0 */
    double lo[R_BLOCK], scale[R_BLOCK];
    repro_fields64_first((const uint64_t *)rows[0] + start, fields, nonzero, m);
    for (Py_ssize_t r = 1; r < size; r++) repro_fields64((const uint64_t *)rows[r] + start, fields, nonzero, m);
    int64_t widest = 0;
    uint64_t zeros = UINT64_MAX;
    for (Py_ssize_t i = 0; i < m; i++) {
        widest = fields[i] > widest ? fields[i] : widest;
        zeros = nonzero[i] < zeros ? nonzero[i] : zeros;
        int64_t code = ((fields[i] + 1) >> 4) - 63;
        code = code < R64_LOWEST ? R64_LOWEST : code;
        fields[i] = 16 * code + 981; /* now the unit's exponent less that of the last bit, + field */
        scale[i] = code > R_SCALED_CODE ? 0x1p-8 : 1.0;
    }
    repro_cuts64_first((const uint64_t *)rows[0] + start, fields, scale, sums, lo, m);
    for (Py_ssize_t r = 1; r < size; r++) repro_cuts64((const uint64_t *)rows[r] + start, fields, scale, sums, lo, m);
    for (Py_ssize_t i = 0; i < m; i++) sums[i] = (sums[i] + lo[i]) * (1.0 / scale[i]);
    return widest == 0x7ff || zeros == 0;
}

/* repro_rows32 and repro_rows64 of 2 to 64 rows into out of their dtype, a block at a time, in passes
 * that vectorize: the larger exponent field of each element's rows (its code the field's, as in
 * repro_pair32_block), the rows cut at that code by masking and summed, rounded once. The float32
 * family's cut values sum exactly in float64 (as repro_rows32's). Float64's are added in a float64
 * pair (hi, lo) by TwoSum: every partial sum and error is a multiple of the unit, the errors together
 * below 2**52 units, so hi + lo is the exact sum and one addition rounds it (to a subnormal too);
 * elements of the top codes are summed scaled by 2**-8, exactly, so that no partial sum overflows
 * where the whole sum does not. Special and -0.0 elements are set as the rows' sums set them. */
REPRO_WIDE static void repro_many_loop(const void *const *rows, Py_ssize_t size, Py_ssize_t n, void *out, int item,
                                       double by) {
    int exponent;
    double inverse = frexp(by, &exponent) == 0.5 ? 1.0 / by : 0.0; /* exact where by is a power of two */
    double sums[R_BLOCK];
    int8_t codes[R_BLOCK];
    uint8_t bits[R_BLOCK];
    for (Py_ssize_t start = 0; start < n; start += R_BLOCK) {
        Py_ssize_t m = n - start < R_BLOCK ? n - start : R_BLOCK;
        int fix = item == 4 ? repro_many32_block(rows, size, start, m, sums)
                            : repro_many64_block(rows, size, start, m, sums);
        if (fix) repro_many_fix(rows, size, start, m, item, codes, bits);
        if (item == 4) {
            float *o = (float *)out + start;
            if (by == 1.0)
                for (Py_ssize_t i = 0; i < m; i++) o[i] = (float)sums[i];
            else if (inverse > 0.0)
                for (Py_ssize_t i = 0; i < m; i++) o[i] = (float)(sums[i] * inverse);
            else
                for (Py_ssize_t i = 0; i < m; i++) o[i] = (float)(sums[i] / by);
        } else {
            double *o = (double *)out + start;
            if (by == 1.0)
                for (Py_ssize_t i = 0; i < m; i++) o[i] = sums[i];
            else if (inverse > 0.0)
                for (Py_ssize_t i = 0; i < m; i++) o[i] = sums[i] * inverse;
            else
                for (Py_ssize_t i = 0; i < m; i++) o[i] = sums[i] / by;
        }
        if (fix) repro_rows_fixed(codes, bits, m, item == 4 ? R32_LOWEST - 1 : R64_LOWEST - 1, out, item, start);
    }
}

/* out = the reproducible sum of `size` (1 to 64) rows of float32 or float64 (as kind says), divided by
 * `by`: the whole ops' combine in the engine's calls, repro_pair's and repro_sum_rows', so one
 * arithmetic gives all their bits */
static void repro_rows_all(Kind kind, const void *const *rows, Py_ssize_t size, void *out, Py_ssize_t n, double by) {
    if (size == 2)
        repro_pair_loop(kind, rows[0], rows[1], out, n, by);
    else if (size > 2)
        repro_many_loop(rows, size, n, out, kind == F32 ? 4 : 8, by);
    else if (kind == F32)
        repro_rows32(rows, 1, n, out, 4, by);
    else
        repro_rows64(rows, 1, n, out, 8, by, 0);
}

/* pair(out, a, b, divide_by): out = the reproducible sum of two raw contributions a and b (float32 or
 * float64, one dtype, one count; out may be a or b), divided by divide_by: at two ranks every
 * algorithm combines an element's two contributions once, so this is the whole sum */
static PyObject *repro_pair(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) return PyErr_Format(PyExc_TypeError, "repro_pair(out, a, b, divide_by)");
    long divide_by = PyLong_AsLong(args[3]);
    if (divide_by == -1 && PyErr_Occurred()) return NULL;
    Py_buffer views[3];
    const char *names[3] = {"repro_pair out", "repro_pair a", "repro_pair b"};
    for (int i = 0; i < 3; i++)
        if (repro_buffer(args[i], &views[i], i == 0, 'f', names[i]) < 0) {
            while (i-- > 0) PyBuffer_Release(&views[i]);
            return NULL;
        }
    PyObject *result = NULL;
    Py_ssize_t item = views[0].itemsize, n = item ? views[0].len / item : 0;
    if ((item != 4 && item != 8) || views[1].itemsize != item || views[2].itemsize != item ||
        views[1].len != views[0].len || views[2].len != views[0].len || divide_by < 1)
        PyErr_SetString(PyExc_ValueError, "repro_pair: out, a and b of one float dtype and count, divide_by >= 1");
    else {
        const void *rows[2] = {views[1].buf, views[2].buf};
        repro_rows_all(item == 4 ? F32 : F64, rows, 2, views[0].buf, n, (double)divide_by);
        result = Py_NewRef(Py_None);
    }
    for (int i = 0; i < 3; i++) PyBuffer_Release(&views[i]);
    return result;
}

/* sum_rows(out, rows, divide_by): out = the reproducible sum of the raw contributions `rows` (a sequence
 * of 1 to 64 arrays of out's float dtype and count; out may be one of them), divided by divide_by: the
 * gathered sum's arithmetic on rows wherever they lie (a shared-memory owner's share of every rank's) */
static PyObject *repro_sum_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "repro_sum_rows(out, rows, divide_by)");
    long divide_by = PyLong_AsLong(args[2]);
    if (divide_by == -1 && PyErr_Occurred()) return NULL;
    PyObject *sequence = PySequence_Fast(args[1], "repro_sum_rows: rows is a sequence of arrays");
    if (!sequence) return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(sequence);
    Py_buffer out, views[64];
    int taken = 0;
    PyObject *result = NULL;
    if (size < 1 || size > 64 || divide_by < 1) {
        PyErr_SetString(PyExc_ValueError, "repro_sum_rows: 1 to 64 rows, divide_by >= 1");
        goto done;
    }
    if (repro_buffer(args[0], &out, 1, 'f', "repro_sum_rows out") < 0) goto done;
    for (; taken < size; taken++)
        if (repro_buffer(PySequence_Fast_GET_ITEM(sequence, taken), &views[taken], 0, 'f', "repro_sum_rows row") < 0)
            break;
    if (taken == size) {
        const void *rows[64];
        Py_ssize_t item = out.itemsize, n = item ? out.len / item : 0;
        int alike = item == 4 || item == 8;
        for (Py_ssize_t r = 0; r < size && alike; r++) {
            alike = views[r].itemsize == item && views[r].len == out.len;
            rows[r] = views[r].buf;
        }
        if (!alike)
            PyErr_SetString(PyExc_ValueError, "repro_sum_rows: out and the rows of one float dtype and count");
        else {
            repro_rows_all(item == 4 ? F32 : F64, rows, size, out.buf, n, (double)divide_by);
            result = Py_NewRef(Py_None);
        }
    }
    while (taken-- > 0) PyBuffer_Release(&views[taken]);
    PyBuffer_Release(&out);
done:
    Py_DECREF(sequence);
    return result;
}

/* pack(x, message, rank, kind, op): the gathered sum's message, zero but this rank's row: its
 * elements' bits (message's items are x's size), then the trailer kind, op */
static PyObject *repro_pack(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) return PyErr_Format(PyExc_TypeError, "repro_pack(x, message, rank, kind, op)");
    Py_ssize_t rank = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    long kind = PyLong_AsLong(args[3]), op = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer x, message;
    if (PyObject_GetBuffer(args[0], &x, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &message, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t item = message.itemsize, stride = x.len / (item ? item : 1) + 2;
    if ((item != 4 && item != 8) || x.itemsize != item || x.len % item || rank < 0 ||
        message.len < (rank + 1) * stride * item || message.len % (stride * item))
        PyErr_SetString(PyExc_ValueError, "repro_pack: a message of rows of x's elements and two more");
    else {
        memset(message.buf, 0, (size_t)message.len);
        char *row = (char *)message.buf + rank * stride * item;
        memcpy(row, x.buf, (size_t)x.len);
        if (item == 4) {
            ((int32_t *)row)[stride - 2] = (int32_t)kind;
            ((int32_t *)row)[stride - 1] = (int32_t)op;
        } else {
            ((int64_t *)row)[stride - 2] = kind;
            ((int64_t *)row)[stride - 1] = op;
        }
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&message);
    return result;
}
