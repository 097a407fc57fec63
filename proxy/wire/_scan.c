/* Two questions asked of a read, in C.
 *
 * One is asked once per large message: proxy.upstream.readbuffer asks whether the store
 * a backend read went to is free again. Spelled in Python, the test releases a
 * memoryview, resizes the store twice and makes a new view, about 2,000 instructions;
 * here about 30 (three counts read).
 *
 * The other is asked of nearly every backend answer: the fields of its head. llhttp
 * reports each field by a call into Python (httptools makes the name and value, the
 * call, and the reader's method appends them), about 550 instructions per field; here
 * one pass makes the list, and a name or value that most backends send in the same
 * spelling (Content-Type, Date, keep-alive) is one shared object, not a new one.
 *
 * Measured (benchmarks/RESULTS.md, "Fast paths", 2026-12-07; paired, five rounds):
 * against the same tree without this module, the Python reference running, 1.28x /
 * 1.40x / 1.20x the requests per second of a 13 B GET / 64 KiB GET / 16 KiB POST;
 * against reading every answer with llhttp's callbacks alone (no split, no pass-through),
 * 1.08x / 1.12x / 1.01x.
 *
 * Contracts (the functions of the same names in proxy.wire.scan are the reference
 * and run when this module is not built):
 *
 *   split_response_head(data: bytes | bytearray, size: int, max_fields: int,
 *     max_bytes: int) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None: the end
 *   of a plain final response head at the start of data[:size], its reason and its
 *   fields; None for any other head, an incomplete one, or one over the limits (the
 *   Python function's docstring says what plain is).
 *
 *   sole_view(view: memoryview) -> bool: True when view is alive, views a bytearray,
 *   and is the only view of it: no memoryview sliced from it or made from the
 *   bytearray is alive and no buffer was taken from either (a transport that still
 *   has to send a piece, a read in progress), so the bytearray's bytes may be
 *   overwritten. False otherwise, also whenever that cannot be told.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Names and values shared rather than made per field: what backends send nearly always,
 * spelled as they send it. Up to SHARED_PER_LENGTH of each length below SHARED_LENGTHS. */
#define SHARED_LENGTHS 32
#define SHARED_PER_LENGTH 4
static const char *const SHARED_NAMES[] = {
    "Age", "Date", "ETag", "Vary", "Server", "Expires", "Location", "Connection",
    "Keep-Alive", "Set-Cookie", "Content-Type", "Accept-Ranges", "Cache-Control",
    "Last-Modified", "Content-Length", "Content-Encoding", "X-Content-Type-Options",
    "Strict-Transport-Security", "Access-Control-Allow-Origin", NULL,
};
static const char *const SHARED_VALUES[] = {"close", "bytes", "keep-alive", NULL};

typedef struct {
    PyObject *by_length[SHARED_LENGTHS][SHARED_PER_LENGTH];
} shared_table;

typedef struct {
    shared_table names;
    shared_table values;
} scan_state;

/* RFC 9110 §5.6.2: the characters of a token, which a field name is. */
static const unsigned char TOKEN[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 0,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0,
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0,
};

static int
fill_table(shared_table *table, const char *const *spellings)
{
    for (; *spellings != NULL; spellings++) {
        size_t length = strlen(*spellings);
        PyObject **slot = table->by_length[length];
        while (*slot != NULL) {
            slot++;
        }
        *slot = PyBytes_FromStringAndSize(*spellings, (Py_ssize_t)length);
        if (*slot == NULL) {
            return -1;
        }
    }
    return 0;
}

static void
clear_table(shared_table *table)
{
    for (int length = 0; length < SHARED_LENGTHS; length++) {
        for (int i = 0; i < SHARED_PER_LENGTH; i++) {
            Py_CLEAR(table->by_length[length][i]);
        }
    }
}

/* The table's object for these bytes (a new reference), else a new bytes object. */
static PyObject *
shared_or_new(const shared_table *table, const char *at, Py_ssize_t size)
{
    if (size < SHARED_LENGTHS) {
        PyObject *const *slot = table->by_length[size];
        for (int i = 0; i < SHARED_PER_LENGTH && slot[i] != NULL; i++) {
            const char *known = PyBytes_AS_STRING(slot[i]);
            if (known[0] == at[0] && memcmp(known, at, (size_t)size) == 0) {
                Py_INCREF(slot[i]);
                return slot[i];
            }
        }
    }
    return PyBytes_FromStringAndSize(at, size);
}

static int
read_arguments(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
               const char **data, Py_ssize_t *size, const char *name)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments", name, want);
        return -1;
    }
    Py_ssize_t length;
    if (PyByteArray_Check(args[0])) {
        *data = PyByteArray_AS_STRING(args[0]);
        length = PyByteArray_GET_SIZE(args[0]);
    } else if (PyBytes_Check(args[0])) {
        *data = PyBytes_AS_STRING(args[0]);
        length = PyBytes_GET_SIZE(args[0]);
    } else {
        PyErr_Format(PyExc_TypeError, "%s() needs bytes or a bytearray", name);
        return -1;
    }
    *size = PyLong_AsSsize_t(args[1]);
    if (*size == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*size > length) {
        *size = length;
    }
    return 0;
}

#define IS_DIGIT(c) ((c) >= '0' && (c) <= '9')

/* HTTP/1.1 ddd, the first status digit 2 to 9, then nothing or a space and a reason.
 * Only version 1.1: the reader then knows the version of a plain head without asking
 * llhttp (any other version takes llhttp's way, which reads it for every head). */
static int
plain_status_line(const char *line, Py_ssize_t size)
{
    if (size < 12 || memcmp(line, "HTTP/1.1 ", 9) != 0) {
        return 0;
    }
    return line[9] >= '2' && line[9] <= '9' && IS_DIGIT(line[10]) && IS_DIGIT(line[11])
        && (size == 12 || line[12] == ' ');
}

/* Transfer-Encoding in any case, the name being 17 token characters (ASCII letters
 * folded: only letters and '-' are in it, and no other token character folds onto
 * one of those). */
static int
is_transfer_encoding(const unsigned char *name)
{
    static const char coding[] = "transfer-encoding";
    for (int i = 0; i < 17; i++) {
        if ((name[i] | 0x20) != coding[i]) {
            return 0;
        }
    }
    return 1;
}

/* (name, value) as a new tuple, or NULL with an exception set. */
static PyObject *
field_pair(const scan_state *state, const unsigned char *name, Py_ssize_t name_size,
           const unsigned char *value, Py_ssize_t value_size)
{
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        return NULL;
    }
    PyObject *item = shared_or_new(&state->names, (const char *)name, name_size);
    if (item == NULL) {
        Py_DECREF(pair);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, item);
    item = shared_or_new(&state->values, (const char *)value, value_size);
    if (item == NULL) {
        Py_DECREF(pair);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 1, item);
    return pair;
}

/* The fields a plain head may have here: more go llhttp's way (a list of this many is
 * filled from the stack, never grown). */
#define MOST_FIELDS 64

typedef struct {
    PyObject *pairs[MOST_FIELDS];
    Py_ssize_t count;
} field_list;

/* Splits the field lines from at on into fields; the index after the blank line, 0
 * when the head is not plain or not whole or over the limits, -1 with an exception
 * set. */
static Py_ssize_t
split_fields(field_list *fields, const scan_state *state, const unsigned char *data,
             Py_ssize_t at, Py_ssize_t size, Py_ssize_t max_fields, Py_ssize_t max_bytes)
{
    const unsigned char *stop = data + size;
    Py_ssize_t total = 0;
    Py_ssize_t most = max_fields < MOST_FIELDS ? max_fields : MOST_FIELDS;
    while (size - at >= 2) {
        const unsigned char *line = data + at;
        if (line[0] == '\r') {  /* the blank line, or a CR with no LF */
            return line[1] == '\n' ? at + 2 : 0;
        }
        const unsigned char *colon = line;
        while (colon < stop && TOKEN[*colon]) {
            colon++;
        }
        Py_ssize_t name_size = colon - line;
        if (colon == stop || *colon != ':' || name_size == 0
                || (name_size == 17 && is_transfer_encoding(line))) {
            return 0;
        }
        const unsigned char *value = colon + 1;
        while (value < stop && (*value == ' ' || *value == '\t')) {
            value++;
        }
        const unsigned char *cr = memchr(value, '\r', (size_t)(stop - value));
        if (cr == NULL || stop - cr < 2 || cr[1] != '\n') {
            return 0;
        }
        const unsigned char *end = cr;
        while (end > value && (end[-1] == ' ' || end[-1] == '\t')) {
            end--;
        }
        total += name_size + (end - value);
        if (fields->count >= most || total > max_bytes) {
            return 0;
        }
        PyObject *pair = field_pair(state, line, name_size, value, end - value);
        if (pair == NULL) {
            return -1;
        }
        fields->pairs[fields->count++] = pair;
        at = cr + 2 - data;
        if (at < size && (data[at] == ' ' || data[at] == '\t')) {
            return 0;  /* an obsolete line folding */
        }
    }
    return 0;
}

/* (end, reason, fields) as a new tuple, taking the pairs; NULL with an exception set
 * (the pairs released). */
static PyObject *
split_answer(field_list *fields, Py_ssize_t end, const char *reason, Py_ssize_t size)
{
    PyObject *list = PyList_New(fields->count);
    PyObject *text = PyBytes_FromStringAndSize(reason, size);
    PyObject *at = PyLong_FromSsize_t(end);
    PyObject *answer = list && text && at ? PyTuple_New(3) : NULL;
    if (answer == NULL) {
        Py_XDECREF(list);
        Py_XDECREF(text);
        Py_XDECREF(at);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < fields->count; i++) {
        PyList_SET_ITEM(list, i, fields->pairs[i]);
    }
    fields->count = 0;
    PyTuple_SET_ITEM(answer, 0, at);
    PyTuple_SET_ITEM(answer, 1, text);
    PyTuple_SET_ITEM(answer, 2, list);
    return answer;
}

/* The split of data[:size], whose bytes cannot move meanwhile (see the caller). */
static PyObject *
split_held(PyObject *module, const char *data, Py_ssize_t size, Py_ssize_t max_fields,
           Py_ssize_t max_bytes)
{
    const char *cr = size > 0 ? memchr(data, '\r', (size_t)size) : NULL;
    if (cr == NULL || data + size - cr < 2 || cr[1] != '\n'
            || !plain_status_line(data, cr - data)) {
        Py_RETURN_NONE;
    }
    field_list fields;
    fields.count = 0;
    Py_ssize_t end = split_fields(&fields, PyModule_GetState(module),
                                  (const unsigned char *)data, cr + 2 - data, size,
                                  max_fields, max_bytes);
    PyObject *answer = NULL;
    if (end > 0) {
        Py_ssize_t start = cr - data > 12 ? 13 : 12;  /* the reason, after its space */
        answer = split_answer(&fields, end, data + start, cr - data - start);
    }
    for (Py_ssize_t i = 0; i < fields.count; i++) {
        Py_DECREF(fields.pairs[i]);
    }
    if (answer == NULL && end >= 0 && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return answer;
}

static PyObject *
split_response_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *data;
    Py_ssize_t size;
    if (read_arguments(args, nargs, 4, &data, &size, "split_response_head") < 0) {
        return NULL;
    }
    Py_ssize_t max_fields = PyLong_AsSsize_t(args[2]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[3]);
    if ((max_fields == -1 || max_bytes == -1) && PyErr_Occurred()) {
        return NULL;
    }
    /* The bytes are held while the fields are made: making a tuple may run a
     * collection, and with it Python code, which must not resize a bytearray that is
     * being read (the conversions above may run Python code too: the pointer and
     * length are taken afresh). */
    Py_buffer held;
    if (PyObject_GetBuffer(args[0], &held, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *answer = split_held(module, held.buf, size < held.len ? size : held.len,
                                  max_fields, max_bytes);
    PyBuffer_Release(&held);
    return answer;
}

static PyObject *
sole_view(PyObject *module, PyObject *view)
{
    if (!PyMemoryView_Check(view)) {
        PyErr_SetString(PyExc_TypeError, "sole_view() needs a memoryview");
        return NULL;
    }
    PyMemoryViewObject *mv = (PyMemoryViewObject *)view;
    _PyManagedBufferObject *managed = mv->mbuf;
    if (mv->flags & _Py_MEMORYVIEW_RELEASED || managed == NULL
            || managed->flags & _Py_MANAGED_BUFFER_RELEASED) {
        Py_RETURN_FALSE;
    }
    PyObject *owner = managed->master.obj;
    /* One view registered with the managed buffer (this one: slices register too), no
     * buffer taken from it, and one export of the bytearray (the managed buffer's). */
    if (owner == NULL || !PyByteArray_CheckExact(owner) || managed->exports != 1
            || mv->exports != 0 || ((PyByteArrayObject *)owner)->ob_exports != 1) {
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"split_response_head", (PyCFunction)(void (*)(void))split_response_head,
     METH_FASTCALL,
     "split_response_head(data, size, max_fields, max_bytes) -> (end, reason, fields) "
     "for a plain final response head at the start of data[:size], else None."},
    {"sole_view", sole_view, METH_O,
     "sole_view(view) -> bool: whether view is the only view of its bytearray alive."},
    {NULL, NULL, 0, NULL},
};

static int
exec_module(PyObject *module)
{
    scan_state *state = PyModule_GetState(module);
    if (fill_table(&state->names, SHARED_NAMES) < 0
            || fill_table(&state->values, SHARED_VALUES) < 0) {
        return -1;
    }
    return 0;
}

static void
free_module(void *module)
{
    scan_state *state = PyModule_GetState((PyObject *)module);
    if (state != NULL) {
        clear_table(&state->names);
        clear_table(&state->values);
    }
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "proxy.wire._scan",
    "Questions asked of a read (where its head ends, what a plain response head's "
    "fields are, whether its store is free), in C.", sizeof(scan_state), methods,
    slots, NULL, NULL, free_module,
};

PyMODINIT_FUNC
PyInit__scan(void)
{
    return PyModuleDef_Init(&module);
}
