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
 * sums, products, min, max and bit operations (wrapping as numpy's do). Anything
 * else stays on the Python path (collectives.engine.kernel says which).
 *
 * The barrier numbers are the shared control window's: a rank's own number is
 * stored with release order after its data and its posted sequence number, and
 * the peers' are loaded with acquire order, so a peer that sees the number sees
 * the data, on any processor (C11 atomics rather than x86's store order alone).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum { DONE = 0, LATE = 1, MISMATCH = 2 };
enum { MAX_RANKS = 64 };

typedef enum { F32, F64, I8, U8, I16, U16, I32, U32, I64, U64 } Kind;
typedef enum { SUM, PROD, MIN, MAX, BAND, BOR, BXOR } Op;

typedef struct {
    PyObject_HEAD
    int64_t *numbers;           /* the control window, as int64 words */
    int64_t *state;             /* the barrier's state: arrived at, passed, digest posted by parity */
    Py_buffer control, state_buffer;
    Py_buffer regions[2][MAX_RANKS]; /* by turn, every rank's small region */
    int size, rank;
    Py_ssize_t own_slot;
    Py_ssize_t peer_slots[MAX_RANKS];
    Py_ssize_t own_words[2];                /* this rank's posted sequence number, by parity */
    Py_ssize_t peer_words[2][MAX_RANKS];    /* the peers', by parity */
    Py_ssize_t digest_offset;               /* from a posted sequence number to its digest */
    Py_ssize_t message_bytes;               /* a posted signature's room */
    Py_ssize_t nbytes, count;
    Kind kind;
    Op op;
    long spin_polls;
    double spin_seconds;
} SmallAllreduce;

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

/* out = a op b, elementwise, one rounding per element, as numpy's loops. Where both are NaN the
 * result is a's (quieted), as the processor gives for numpy's a + b: said outright, as the
 * compiler may swap the operands of a commutative + or * and so hand back b's. */
#define FLOAT_LOOP(T)                                                                              \
    static void reduce_##T(T *out, const T *a, const T *b, Py_ssize_t n, Op op) {        \
        if (op == SUM)                                                                             \
            for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] != a[i] ? quiet_##T(a[i]) : a[i] + b[i]; \
        else                                                                                       \
            for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] != a[i] ? quiet_##T(a[i]) : a[i] * b[i]; \
    }
FLOAT_LOOP(float)
FLOAT_LOOP(double)

/* integers add and multiply as unsigned words: numpy wraps, and signed overflow is undefined in C */
#define INT_LOOP(NAME, T, U)                                                                   \
    static void reduce_##NAME(T *out, const T *a, const T *b, Py_ssize_t n, Op op) { \
        switch (op) {                                                                          \
        case SUM: for (Py_ssize_t i = 0; i < n; i++) out[i] = (T)((U)a[i] + (U)b[i]); break;   \
        case PROD: for (Py_ssize_t i = 0; i < n; i++) out[i] = (T)((U)a[i] * (U)b[i]); break;  \
        case MIN: for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] < b[i] ? a[i] : b[i]; break; \
        case MAX: for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] > b[i] ? a[i] : b[i]; break; \
        case BAND: for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] & b[i]; break;             \
        case BOR: for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] | b[i]; break;              \
        case BXOR: for (Py_ssize_t i = 0; i < n; i++) out[i] = a[i] ^ b[i]; break;             \
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

static void reduce_pair(Kind kind, Op op, void *out, const void *a, const void *b, Py_ssize_t n) {
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

/* out = region[0] op region[1] op ... in rank order, as SharedExecutor.reduce: the same bits */
static void reduce_regions(SmallAllreduce *self, int turn, void *out) {
    Py_buffer *regions = self->regions[turn];
    if (self->size == 1) {
        memmove(out, regions[0].buf, (size_t)self->nbytes);
        return;
    }
    reduce_pair(self->kind, self->op, out, regions[0].buf, regions[1].buf, self->count);
    for (int r = 2; r < self->size; r++) reduce_pair(self->kind, self->op, out, out, regions[r].buf, self->count);
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
    static const struct { const char *name; Op op; int floats; } ops[] = {
        {"sum", SUM, 1}, {"prod", PROD, 1}, {"min", MIN, 0}, {"max", MAX, 0},
        {"band", BAND, 0}, {"bor", BOR, 0}, {"bxor", BXOR, 0},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(name, ops[i].name) == 0) {
            if (!ops[i].floats && (kind == F32 || kind == F64)) return 0;
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

static void release_all(SmallAllreduce *self) {
    if (self->control.obj) PyBuffer_Release(&self->control);
    if (self->state_buffer.obj) PyBuffer_Release(&self->state_buffer);
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < MAX_RANKS; r++)
            if (self->regions[t][r].obj) PyBuffer_Release(&self->regions[t][r]);
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

/* SmallAllreduce(control, state, slots, words, digest_offset, message_bytes, regions, rank, dtype, op,
 *                count, spin_polls, spin_seconds)
 *
 * control: the control window (writable, int64-aligned); state: the barrier's state words (the
 * number arrived at, the number passed, by parity the digest posted; shared with the Python
 * barrier); slots: every rank's barrier-number word; words: per parity, every rank's posted
 * signature's first word (its sequence number); regions: per turn, every rank's small region
 * (writable, count elements of dtype each). */
static int small_init(SmallAllreduce *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"control", "state", "slots", "words", "digest_offset", "message_bytes", "regions",
                            "rank", "dtype", "op", "count", "spin_polls", "spin_seconds", NULL};
    PyObject *control, *state, *slots, *words, *regions;
    const char *dtype, *op_name;
    Py_ssize_t digest_offset, message_bytes, count;
    int rank;
    long spin_polls;
    double spin_seconds;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOnnOissnld", names, &control, &state, &slots, &words,
                                     &digest_offset, &message_bytes, &regions, &rank, &dtype, &op_name,
                                     &count, &spin_polls, &spin_seconds))
        return -1;
    release_all(self);
    memset(&self->control, 0, sizeof self->control);
    memset(&self->state_buffer, 0, sizeof self->state_buffer);
    memset(self->regions, 0, sizeof self->regions);
    Py_ssize_t size = PySequence_Size(slots);
    if (size < 1 || size > MAX_RANKS || rank < 0 || rank >= size) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "the compiled engine takes 1 to %d ranks, and a rank among them", MAX_RANKS);
        return -1;
    }
    if (!parse_kind(dtype, &self->kind) || !parse_op(op_name, self->kind, &self->op)) {
        PyErr_Format(PyExc_ValueError, "the compiled engine does not reduce %s with %s", dtype, op_name);
        return -1;
    }
    self->size = (int)size;
    self->rank = rank;
    self->count = count;
    self->spin_polls = spin_polls;
    self->spin_seconds = spin_seconds;
    self->digest_offset = digest_offset;
    if (PyObject_GetBuffer(control, &self->control, PyBUF_WRITABLE) < 0) return -1;
    Py_ssize_t words_in_control = self->control.len / 8;
    if (((uintptr_t)self->control.buf) % 8) {
        PyErr_SetString(PyExc_ValueError, "the control window is not aligned to 8 bytes");
        return -1;
    }
    self->numbers = self->control.buf;
    if (PyObject_GetBuffer(state, &self->state_buffer, PyBUF_WRITABLE) < 0) return -1;
    if (self->state_buffer.len != 4 * 8 || ((uintptr_t)self->state_buffer.buf) % 8) {
        PyErr_SetString(PyExc_ValueError, "the barrier's state is four aligned int64 words");
        return -1;
    }
    self->state = self->state_buffer.buf;
    if (message_bytes < 8 || message_bytes > digest_offset * 8) {
        PyErr_SetString(PyExc_ValueError, "a posted signature's room ends before its digest");
        return -1;
    }
    self->message_bytes = message_bytes;
    int peer = 0;
    for (Py_ssize_t r = 0; r < size; r++) {
        Py_ssize_t slot = index_at(slots, r);
        if (slot < 0 || slot >= words_in_control) goto out_of_window;
        if (r == rank) self->own_slot = slot;
        else self->peer_slots[peer] = slot;
        for (int parity = 0; parity < 2; parity++) {
            PyObject *by_rank = PySequence_GetItem(words, parity);
            if (!by_rank) return -1;
            Py_ssize_t word = index_at(by_rank, r);
            Py_DECREF(by_rank);
            if (word < 0 || word + digest_offset >= words_in_control) goto out_of_window;
            if (r == rank) self->own_words[parity] = word;
            else self->peer_words[parity][peer] = word;
        }
        if (r != rank) peer++;
    }
    Py_ssize_t itemsize = (self->kind == F64 || self->kind == I64 || self->kind == U64) ? 8
                          : (self->kind == F32 || self->kind == I32 || self->kind == U32) ? 4
                          : (self->kind == I16 || self->kind == U16) ? 2 : 1;
    self->nbytes = count * itemsize;
    for (int turn = 0; turn < 2; turn++) {
        PyObject *half = PySequence_GetItem(regions, turn);
        if (!half) return -1;
        for (Py_ssize_t r = 0; r < size; r++) {
            PyObject *region = PySequence_GetItem(half, r);
            int failed = !region || PyObject_GetBuffer(region, &self->regions[turn][r], PyBUF_WRITABLE) < 0;
            Py_XDECREF(region);
            if (failed) {
                Py_DECREF(half);
                return -1;
            }
            if (self->regions[turn][r].len < self->nbytes) {
                Py_DECREF(half);
                PyErr_SetString(PyExc_ValueError, "a small region is shorter than the call's input");
                return -1;
            }
        }
        Py_DECREF(half);
    }
    return 0;
out_of_window:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a word lies outside the control window");
    return -1;
}

static int get_buffers(SmallAllreduce *self, PyObject *work, PyObject *source, Py_buffer *out, Py_buffer *in) {
    if (PyObject_GetBuffer(work, out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (source == work) {
        *in = *out;
        in->obj = NULL;
    } else if (PyObject_GetBuffer(source, in, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(out);
        return -1;
    }
    if (out->len != self->nbytes || in->len != self->nbytes) {
        PyErr_Format(PyExc_ValueError, "the compiled allreduce was made for %zd bytes, not %zd and %zd",
                     self->nbytes, out->len, in->len);
        PyBuffer_Release(out);
        if (in->obj) PyBuffer_Release(in);
        return -1;
    }
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
    if (turn != 0 && turn != 1) {
        PyErr_SetString(PyExc_ValueError, "turn is 0 or 1");
        return NULL;
    }
    int64_t *state = self->state, *numbers = self->numbers;
    int64_t number = state[0];
    if (state[1] != number) {
        PyErr_SetString(PyExc_RuntimeError, "arrive called before the previous barrier was passed");
        return NULL;
    }
    number++;
    int parity = (int)(number & 1);
    Py_ssize_t own = self->own_words[parity];
    if (digest) {
        if (!PyByteArray_CheckExact(args[4]) || PyByteArray_GET_SIZE(args[4]) < 8 ||
            PyByteArray_GET_SIZE(args[4]) > self->message_bytes) {
            PyErr_SetString(PyExc_TypeError, "a checked call's packed signature is a bytearray that fits a message");
            return NULL;
        }
        char *packed = PyByteArray_AS_STRING(args[4]);
        int64_t stamped = (int64_t)sequence;
        memcpy(packed, &stamped, sizeof stamped); /* its sequence number, as the guard's stamp writes it */
        if (state[2 + parity] != digest) {        /* the rest of the signature: posted once for repeats */
            memcpy(&numbers[own], packed, (size_t)PyByteArray_GET_SIZE(args[4]));
            numbers[own + self->digest_offset] = digest;
            state[2 + parity] = digest;
        }
    }
    Py_buffer out, in;
    if (get_buffers(self, args[1], args[2], &out, &in) < 0) return NULL;
    int peers = self->size - 1;
    memcpy(self->regions[turn][self->rank].buf, in.buf, (size_t)self->nbytes);
    if (in.obj) PyBuffer_Release(&in);
    if (digest) numbers[own] = sequence;
    __atomic_store_n(&numbers[self->own_slot], number, __ATOMIC_RELEASE);
    state[0] = number;
    int status = DONE;
    long polls = 0;
    double began = 0.0;
    for (int p = 0; p < peers; p++) {
        while (__atomic_load_n(&numbers[self->peer_slots[p]], __ATOMIC_ACQUIRE) < number) {
            polls++;
            if (polls > self->spin_polls) { /* the core to a late peer, the interpreter to other threads */
                Py_BEGIN_ALLOW_THREADS
                sched_yield();
                Py_END_ALLOW_THREADS
            }
            if ((polls & 63) == 0) {
                double t = now_s();
                if (began == 0.0) began = t;
                else if (t - began >= self->spin_seconds) {
                    status = LATE;
                    goto done;
                }
            }
        }
    }
    state[1] = number;
    if (digest)
        for (int p = 0; p < peers; p++) {
            Py_ssize_t at = self->peer_words[parity][p];
            if (numbers[at] != sequence || numbers[at + self->digest_offset] != digest) {
                status = MISMATCH;
                goto done;
            }
        }
    reduce_regions(self, (int)turn, out.buf);
done:
    PyBuffer_Release(&out);
    return PyLong_FromLong(status);
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
    if (PyObject_GetBuffer(args[1], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (out.len != self->nbytes) {
        PyErr_Format(PyExc_ValueError, "the compiled allreduce was made for %zd bytes, not %zd", self->nbytes, out.len);
        PyBuffer_Release(&out);
        return NULL;
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    reduce_regions(self, (int)turn, out.buf);
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
     "reduce(turn, work): every rank's region of the turn, reduced in rank order, into work"},
    {NULL, NULL, 0, NULL},
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
};

static PyMethodDef engine_methods[] = {
    {"reduces", (PyCFunction)(void (*)(void))engine_reduces, METH_FASTCALL,
     "reduces(dtype, op) -> whether the engine reduces that dtype with that op (with numpy's bits)"},
    {"combine", (PyCFunction)(void (*)(void))engine_combine, METH_FASTCALL,
     "combine(dtype, op, out, a, b): out = a op b with the engine's loop"},
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
    if (PyType_Ready(&SmallAllreduceType) < 0) return NULL;
    PyObject *module = PyModule_Create(&engine_module);
    if (!module) return NULL;
    if (PyModule_AddObjectRef(module, "SmallAllreduce", (PyObject *)&SmallAllreduceType) < 0 ||
        PyModule_AddIntConstant(module, "DONE", DONE) < 0 || PyModule_AddIntConstant(module, "LATE", LATE) < 0 ||
        PyModule_AddIntConstant(module, "MISMATCH", MISMATCH) < 0 ||
        PyModule_AddIntConstant(module, "MAX_RANKS", MAX_RANKS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
