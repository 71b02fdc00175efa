/* Avro binary encoding of a compiled schema: the walk of cdc/formats/avro_write.py's closures in C.
 *
 * Optional: cdc/formats/avro_write.py loads it through cdc.native where setup.py built it, and its
 * closures stay the reference (tests/unit/test_avro_write.py checks both against fastavro).
 *
 * write(program, value, header) -> header + the Avro binary of value
 *
 * A program is what avro_write.program() compiles a schema into:
 *   an int          a primitive: P_NULL .. P_STRING below;
 *   (U, null_first, inner)            a [null, T] or [T, null] union;
 *   (R, full_name, ((field, default, has_default, program), ...))   a record;
 *   (A, items)      an array;
 *   (M, values)     a map.
 * A failure in a record's field is raised again with "<record>.<field>: " before its message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <stdint.h>

enum { P_NULL, P_BOOLEAN, P_LONG, P_FLOAT, P_DOUBLE, P_BYTES, P_STRING, K_UNION, K_RECORD, K_ARRAY, K_MAP };

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char small[512];
} Out;

static int
room(Out *out, Py_ssize_t n)
{
    if (out->len + n <= out->cap)
        return 0;
    Py_ssize_t cap = out->cap * 2;
    while (cap < out->len + n)
        cap *= 2;
    char *data = out->data == out->small ? PyMem_Malloc((size_t)cap) : PyMem_Realloc(out->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (out->data == out->small)
        memcpy(data, out->small, (size_t)out->len);
    out->data = data;
    out->cap = cap;
    return 0;
}

static int
put(Out *out, const void *src, Py_ssize_t n)
{
    if (room(out, n) < 0)
        return -1;
    memcpy(out->data + out->len, src, (size_t)n);
    out->len += n;
    return 0;
}

static int
put_byte(Out *out, unsigned char b)
{
    if (room(out, 1) < 0)
        return -1;
    out->data[out->len++] = (char)b;
    return 0;
}

/* Zigzag varint: Avro's int and long. */
static int
put_long(Out *out, long long n)
{
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    if (room(out, 10) < 0)
        return -1;
    while (z > 0x7F) {
        out->data[out->len++] = (char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    out->data[out->len++] = (char)z;
    return 0;
}

static int
put_text(Out *out, const char *s, Py_ssize_t n)
{
    if (put_long(out, n) < 0)
        return -1;
    return put(out, s, n);
}

static int write_value(Out *out, PyObject *program, PyObject *value);

static int
write_primitive(Out *out, long kind, PyObject *value)
{
    switch (kind) {
    case P_NULL:
        if (value != Py_None) {
            PyErr_Format(PyExc_TypeError, "an Avro null needs None, got %s", Py_TYPE(value)->tp_name);
            return -1;
        }
        return 0;
    case P_BOOLEAN: {
        int truth = PyObject_IsTrue(value);
        return truth < 0 ? -1 : put_byte(out, truth ? 1 : 0);
    }
    case P_LONG: {
        long long n = PyLong_AsLongLong(value);
        if (n == -1 && PyErr_Occurred())
            return -1;
        return put_long(out, n);
    }
    case P_FLOAT:
    case P_DOUBLE: {
        double d = PyFloat_AsDouble(value);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        int size = kind == P_FLOAT ? 4 : 8;
        if (room(out, size) < 0)
            return -1;
        unsigned char *p = (unsigned char *)out->data + out->len;
        if ((kind == P_FLOAT ? PyFloat_Pack4(d, (char *)p, 1) : PyFloat_Pack8(d, (char *)p, 1)) < 0)
            return -1;
        out->len += size;
        return 0;
    }
    case P_BYTES: {
        if (PyBytes_Check(value))
            return put_text(out, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
        Py_buffer view;
        if (PyObject_GetBuffer(value, &view, PyBUF_SIMPLE) < 0)
            return -1;
        int r = put_text(out, view.buf, view.len);
        PyBuffer_Release(&view);
        return r;
    }
    case P_STRING: {
        if (!PyUnicode_Check(value)) {
            PyErr_Format(PyExc_TypeError, "an Avro string needs str, got %s", Py_TYPE(value)->tp_name);
            return -1;
        }
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(value, &n);
        return s == NULL ? -1 : put_text(out, s, n);
    }
    }
    PyErr_Format(PyExc_ValueError, "Avro program: unknown primitive %ld", kind);
    return -1;
}

/* Prefix the current exception's message with "<record>.<field>: " when it is one of the errors
 * a wrong value makes here (TypeError, ValueError, OverflowError: these take one message), the
 * original as its cause; any other exception goes on as it is. */
static void
name_field(PyObject *record, PyObject *field)
{
    PyObject *type, *val, *tb;
    PyErr_Fetch(&type, &val, &tb);
    PyErr_NormalizeException(&type, &val, &tb);
    if (val == NULL || (type != PyExc_TypeError && type != PyExc_ValueError && type != PyExc_OverflowError)) {
        PyErr_Restore(type, val, tb);
        return;
    }
    PyErr_Format(type, "%U.%U: %S", record, field, val);
    PyObject *t2, *v2, *tb2;
    PyErr_Fetch(&t2, &v2, &tb2);
    PyErr_NormalizeException(&t2, &v2, &tb2);
    if (v2 != NULL)
        PyException_SetCause(v2, Py_NewRef(val));
    PyErr_Restore(t2, v2, tb2);
    Py_XDECREF(type);
    Py_XDECREF(val);
    Py_XDECREF(tb);
}

static int
write_record(Out *out, PyObject *name, PyObject *fields, PyObject *value)
{
    if (!PyTuple_Check(fields)) {
        PyErr_SetString(PyExc_TypeError, "Avro program: a record's fields must be a tuple");
        return -1;
    }
    int is_dict = PyDict_Check(value);
    if (!is_dict && !PyMapping_Check(value)) {
        PyErr_Format(PyExc_TypeError, "an Avro record %U needs a mapping, got %s", name, Py_TYPE(value)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        PyObject *fname = PyTuple_GET_ITEM(field, 0);
        PyObject *item;
        if (is_dict) {
            item = PyDict_GetItemWithError(value, fname);
            if (item == NULL && PyErr_Occurred())
                return -1;
            Py_XINCREF(item);
        } else {
            item = PyObject_GetItem(value, fname);
            if (item == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_KeyError))
                    return -1;
                PyErr_Clear();
            }
        }
        if (item == NULL) {
            if (!PyObject_IsTrue(PyTuple_GET_ITEM(field, 2))) {
                PyErr_Format(PyExc_ValueError, "%U: field %R is missing and has no default", name, fname);
                return -1;
            }
            item = Py_NewRef(PyTuple_GET_ITEM(field, 1));
        }
        int r = write_value(out, PyTuple_GET_ITEM(field, 3), item);
        Py_DECREF(item);
        if (r < 0) {
            name_field(name, fname);
            return -1;
        }
    }
    return 0;
}

static int
write_array(Out *out, PyObject *items, PyObject *value)
{
    PyObject *seq = PySequence_Fast(value, "an Avro array needs a sequence");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **each = PySequence_Fast_ITEMS(seq);
    int r = 0;
    if (n > 0)
        r = put_long(out, n);
    for (Py_ssize_t i = 0; r == 0 && i < n; i++)
        r = write_value(out, items, each[i]);
    Py_DECREF(seq);
    return r < 0 ? -1 : put_byte(out, 0);
}

static int
write_map(Out *out, PyObject *values, PyObject *value)
{
    PyObject *pairs = PyDict_Check(value) ? PyDict_Items(value) : PyMapping_Items(value);
    if (pairs == NULL)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(pairs);
    int r = 0;
    if (n > 0)
        r = put_long(out, n);
    for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        r = write_primitive(out, P_STRING, PyTuple_GET_ITEM(pair, 0));
        if (r == 0)
            r = write_value(out, values, PyTuple_GET_ITEM(pair, 1));
    }
    Py_DECREF(pairs);
    return r < 0 ? -1 : put_byte(out, 0);
}

static int
write_value(Out *out, PyObject *program, PyObject *value)
{
    if (PyLong_CheckExact(program))
        return write_primitive(out, PyLong_AsLong(program), value);
    if (!PyTuple_Check(program) || PyTuple_GET_SIZE(program) < 2) {
        PyErr_SetString(PyExc_TypeError, "Avro program: a node is an int or a tuple");
        return -1;
    }
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(program, 0));
    if ((kind == K_UNION || kind == K_RECORD) && PyTuple_GET_SIZE(program) < 3) {
        PyErr_SetString(PyExc_TypeError, "Avro program: a union or record node has three items");
        return -1;
    }
    switch (kind) {
    case K_UNION: {
        int null_first = PyTuple_GET_ITEM(program, 1) == Py_True;
        if (value == Py_None)
            return put_byte(out, null_first ? 0 : 2);      /* zigzag(0) or zigzag(1) */
        if (put_byte(out, null_first ? 2 : 0) < 0)
            return -1;
        return write_value(out, PyTuple_GET_ITEM(program, 2), value);
    }
    case K_RECORD: {
        if (Py_EnterRecursiveCall(" in an Avro record"))
            return -1;
        int r = write_record(out, PyTuple_GET_ITEM(program, 1), PyTuple_GET_ITEM(program, 2), value);
        Py_LeaveRecursiveCall();
        return r;
    }
    case K_ARRAY:
        return write_array(out, PyTuple_GET_ITEM(program, 1), value);
    case K_MAP:
        return write_map(out, PyTuple_GET_ITEM(program, 1), value);
    }
    PyErr_Format(PyExc_ValueError, "Avro program: unknown node %ld", kind);
    return -1;
}

static PyObject *
py_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "write(program, value, header: bytes)");
        return NULL;
    }
    Out out;
    out.data = out.small;
    out.len = 0;
    out.cap = (Py_ssize_t)sizeof(out.small);
    PyObject *result = NULL;
    if (put(&out, PyBytes_AS_STRING(args[2]), PyBytes_GET_SIZE(args[2])) == 0
            && write_value(&out, args[0], args[1]) == 0)
        result = PyBytes_FromStringAndSize(out.data, out.len);
    if (out.data != out.small)
        PyMem_Free(out.data);
    return result;
}

static PyMethodDef methods[] = {
    {"write", (PyCFunction)(void (*)(void))py_write, METH_FASTCALL,
     "write(program, value, header) -> header + the Avro binary of value"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._avro", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__avro(void)
{
    return PyModule_Create(&module);
}
