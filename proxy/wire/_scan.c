/* Two questions asked of a read that holds a large message, in C.
 *
 * Both are asked once per large message (the request and response readers look for
 * the end of the head in the read; proxy.upstream.readbuffer asks whether the store a
 * backend read went to is free again). Spelled in Python they are calls by name that mypyc
 * cannot make direct: bytearray.find parses a tuple of arguments, and the free-store
 * test releases a memoryview, resizes the store twice and makes a new view; each costs
 * about 2,000 instructions, here about 400 (the search, a memchr per head line) and
 * 30 (three counts read).
 *
 * Contracts (the functions of the same names in proxy.wire.scan are the reference
 * and run when this module is not built):
 *
 *   find_blank_line(data: bytes | bytearray, size: int) -> int: the index of the first
 *   CR LF CR LF within data[:size]; -1 if there is none (size is clipped to
 *   len(data), a negative one finds nothing).
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

static PyObject *
find_blank_line(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "find_blank_line() takes 2 arguments");
        return NULL;
    }
    const char *data;
    Py_ssize_t length;
    if (PyByteArray_Check(args[0])) {
        data = PyByteArray_AS_STRING(args[0]);
        length = PyByteArray_GET_SIZE(args[0]);
    } else if (PyBytes_Check(args[0])) {
        data = PyBytes_AS_STRING(args[0]);
        length = PyBytes_GET_SIZE(args[0]);
    } else {
        PyErr_SetString(PyExc_TypeError, "find_blank_line() needs bytes or a bytearray");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (size > length) {
        size = length;
    }
    const char *at = data;
    const char *end = data + size;
    while (end - at >= 4) {
        const char *cr = memchr(at, '\r', (size_t)(end - at - 3));
        if (cr == NULL) {
            break;
        }
        if (cr[1] == '\n' && cr[2] == '\r' && cr[3] == '\n') {
            return PyLong_FromSsize_t(cr - data);
        }
        at = cr + 1;
    }
    return PyLong_FromLong(-1);
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
    {"find_blank_line", (PyCFunction)(void (*)(void))find_blank_line, METH_FASTCALL,
     "find_blank_line(data, size) -> int: where the first CR LF CR LF of data[:size] is, "
     "-1 if nowhere."},
    {"sole_view", sole_view, METH_O,
     "sole_view(view) -> bool: whether view is the only view of its bytearray alive."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "proxy.wire._scan",
    "Two questions asked of a backend read of a large response, in C.", 0, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__scan(void)
{
    return PyModuleDef_Init(&module);
}
