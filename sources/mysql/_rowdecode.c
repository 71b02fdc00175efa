/* Row images of binlog row events -> change events, in C, for the common column types.
 *
 * Optional, like cdc/_encode.c: sources/mysql/decoder.py builds a Program for a table map whose
 * every column is of a type handled here, and keeps its generated Python decoder as the
 * reference and the fallback. The C path never raises on bad input: on anything it does not
 * take (bytes past the end, a value a converter refuses, a date it does not print, an int that
 * does not fit) it returns None, and the Python decoder decodes the event again and raises its
 * DecodeError naming the row. tests/unit/test_mysql_rowdecode.py compares the two paths.
 *
 * Column ops, one tuple per column: (kind, nullable, a, b, conv)
 *   INT      a = bytes (1, 2, 3, 4, 8), b = signed        FLOAT   conv = shortest_float32
 *   DOUBLE   -                                             YEAR    -
 *   DECIMAL  a = precision, b = scale                      DATE    -
 *   DATETIME2, TIMESTAMP2  a = fsp
 *   STR      a = length-prefix bytes (1-4), conv = None (UTF-8) or a callable on the bytes
 *   ENUM     a = bytes (1, 2), conv = ("", label, ...)    BIT     a = bytes (1-8)
 *   SET      a = bytes (1-8), conv = (label, ...)
 *   PYFIXED  a = bytes, conv(the bytes, 0) -> the value (TIME2 and the pre-5.6 temporal types)
 *
 * A row image is read in _rowdecode_image.c (per column, by its op); this unit makes the events
 * and holds the type. _rowdecode.h declares what they share.
 */
#include "_rowdecode.h"
#include <string.h>

enum { WRITE = 1, UPDATE_ROWS = 2, DELETE_ROWS = 3 };

static PyObject *s_file, *s_pos, *s_row, *s_gtid;  /* interned field names */

static void release(PyObject **values, Py_ssize_t n) { for (Py_ssize_t i = 0; i < n; i++) Py_CLEAR(values[i]); }

static PyObject *as_dict(PyObject *names, PyObject **values, Py_ssize_t n)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(names, i), values[i]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    return d;
}

static PyObject *key_dict(Program *prog, PyObject **values)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < prog->nkey; k++) {
        Py_ssize_t i = prog->key_index[k];
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(prog->names, i), values[i]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* A tuple subclass instance (ChangeEvent, TransactionInfo) of n items, stealing them. */
static PyObject *record(PyObject *type, Py_ssize_t n, PyObject **items)
{
    PyObject *t = ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, n);
    if (t == NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(t, i, items[i]);
    return t;
}

typedef struct {
    PyObject *tid, *ts_ms, *file, *pos, *gtid, *tx_id;
    long long base, order, first;
} Context;

static PyObject *tx_info(Program *prog, Context *c, long long n)
{
    if (c->tx_id == Py_None)
        Py_RETURN_NONE;
    PyObject *items[3] = {Py_NewRef(c->tx_id), PyLong_FromLongLong(c->order + n), PyLong_FromLongLong(c->first + n)};
    if (items[1] == NULL || items[2] == NULL) {
        Py_XDECREF(items[0]); Py_XDECREF(items[1]); Py_XDECREF(items[2]);
        return NULL;
    }
    return record(prog->tx_type, 3, items);
}

static PyObject *fields(Context *c, long long row)
{
    PyObject *d = PyDict_New(), *r = PyLong_FromLongLong(row);
    if (d == NULL || r == NULL || PyDict_SetItem(d, s_file, c->file) < 0 || PyDict_SetItem(d, s_pos, c->pos) < 0
            || PyDict_SetItem(d, s_row, r) < 0 || PyDict_SetItem(d, s_gtid, c->gtid) < 0) {
        Py_XDECREF(d);
        Py_XDECREF(r);
        return NULL;
    }
    Py_DECREF(r);
    return d;
}

/* (op, tid, key, before, after, version, ts_ms, STREAMED, fields, tx): steals key, before, after,
 * fields (a new reference of the caller's is taken for it) and tx. */
static PyObject *event(Program *prog, Context *c, PyObject *op, PyObject *key, PyObject *before, PyObject *after,
                       Py_ssize_t start, PyObject *fields_dict, PyObject *tx)
{
    PyObject *version = PyLong_FromLongLong(c->base + (long long)start);
    PyObject *items[10] = {Py_NewRef(op), Py_NewRef(c->tid), key, before, after, version, Py_NewRef(c->ts_ms),
                           Py_NewRef(prog->streamed), fields_dict, tx};
    if (version == NULL || key == NULL || before == NULL || after == NULL || fields_dict == NULL || tx == NULL) {
        for (int i = 0; i < 10; i++)
            Py_XDECREF(items[i]);
        return NULL;
    }
    return record(prog->event_type, 10, items);
}

#define MAX_COLUMNS 4096

static PyObject *program_events(Program *prog, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "events takes 13 arguments");
        return NULL;
    }
    int kind = (int)PyLong_AsLong(args[0]);
    PyObject *data_obj = args[1];
    Py_ssize_t start = PyLong_AsSsize_t(args[2]), end = PyLong_AsSsize_t(args[3]);
    Context c = {args[4], args[6], args[7], args[8], args[9], args[10], 0, 0, 0};
    c.base = PyLong_AsLongLong(args[5]);
    c.order = PyLong_AsLongLong(args[11]);
    c.first = PyLong_AsLongLong(args[12]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!PyBytes_Check(data_obj) || start < 0 || end > PyBytes_GET_SIZE(data_obj) || start > end
            || prog->ncols > MAX_COLUMNS || (kind != WRITE && kind != UPDATE_ROWS && kind != DELETE_ROWS))
        Py_RETURN_NONE;
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(data_obj);
    Py_ssize_t n = prog->ncols, p = start;
    PyObject **after = PyMem_Calloc((size_t)(2 * n), sizeof(PyObject *));
    if (after == NULL)
        return PyErr_NoMemory();
    PyObject **before = after + n;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyMem_Free(after);
        return NULL;
    }
    long long i = 0, emitted = 0;
    while (p < end) {
        Py_ssize_t row_start = p;
        PyObject *ev = NULL, *ev2 = NULL;
        if (kind == UPDATE_ROWS) {
            if (rowdecode_image(prog, data, &p, end, before) < 0)
                goto not_taken;
            if (rowdecode_image(prog, data, &p, end, after) < 0) {
                release(before, n);
                goto not_taken;
            }
            PyObject *f = fields(&c, i);
            i++;
            emitted++;
            int same = 1;
            for (Py_ssize_t k = 0; k < prog->nkey && same == 1; k++)
                same = PyObject_RichCompareBool(after[prog->key_index[k]], before[prog->key_index[k]], Py_EQ);
            if (f == NULL || same < 0) {
                Py_XDECREF(f);
                release(before, n);
                release(after, n);
                goto not_taken;
            }
            if (same) {
                ev = event(prog, &c, prog->op_update, key_dict(prog, after), as_dict(prog->names, before, n),
                           as_dict(prog->names, after, n), row_start, Py_NewRef(f), tx_info(prog, &c, emitted));
            } else {
                ev = event(prog, &c, prog->op_delete, key_dict(prog, before), as_dict(prog->names, before, n),
                           Py_NewRef(Py_None), row_start, Py_NewRef(f), tx_info(prog, &c, emitted));
                emitted++;
                ev2 = event(prog, &c, prog->op_create, key_dict(prog, after), Py_NewRef(Py_None),
                            as_dict(prog->names, after, n), row_start, Py_NewRef(f), tx_info(prog, &c, emitted));
            }
            Py_DECREF(f);
            release(before, n);
            release(after, n);
            if (ev == NULL || (!same && ev2 == NULL))
                goto fail;
        } else {
            if (rowdecode_image(prog, data, &p, end, after) < 0)
                goto not_taken;
            i++;
            PyObject *row = as_dict(prog->names, after, n);
            PyObject *key = key_dict(prog, after);
            if (kind == WRITE)
                ev = event(prog, &c, prog->op_create, key, Py_NewRef(Py_None), row, row_start, fields(&c, i - 1),
                           tx_info(prog, &c, i));
            else
                ev = event(prog, &c, prog->op_delete, key, row, Py_NewRef(Py_None), row_start, fields(&c, i - 1),
                           tx_info(prog, &c, i));
            release(after, n);
            if (ev == NULL)
                goto fail;
        }
        int added = PyList_Append(out, ev);
        Py_DECREF(ev);
        if (added == 0 && ev2 != NULL) {
            added = PyList_Append(out, ev2);
            Py_DECREF(ev2);
            ev2 = NULL;
        }
        Py_XDECREF(ev2);
        if (added < 0)
            goto fail;
        continue;
    fail:
        Py_XDECREF(ev);
        Py_XDECREF(ev2);
    not_taken:
        PyErr_Clear();
        Py_DECREF(out);
        PyMem_Free(after);
        Py_RETURN_NONE;
    }
    PyMem_Free(after);
    if (p != end) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    PyObject *count = PyLong_FromLongLong(kind == UPDATE_ROWS ? emitted : i);
    PyObject *pos = PyLong_FromSsize_t(p);
    if (count == NULL || pos == NULL) {
        Py_XDECREF(count); Py_XDECREF(pos); Py_DECREF(out);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(3, out, pos, count);
    Py_DECREF(out); Py_DECREF(pos); Py_DECREF(count);
    return result;
}

static void program_dealloc(Program *self)
{
    PyMem_Free(self->ops);
    PyMem_Free(self->key_index);
    Py_XDECREF(self->ops_tuple);
    Py_XDECREF(self->names);
    Py_XDECREF(self->event_type);
    Py_XDECREF(self->tx_type);
    Py_XDECREF(self->op_create);
    Py_XDECREF(self->op_update);
    Py_XDECREF(self->op_delete);
    Py_XDECREF(self->streamed);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int valid_op(int kind, int a, int b)
{
    switch (kind) {
    case K_INT: return a == 1 || a == 2 || a == 3 || a == 4 || a == 8;
    case K_DECIMAL: return a >= 1 && a <= 65 && b >= 0 && b <= 30 && b <= a;
    case K_DATETIME2: case K_TIMESTAMP2: return a >= 0 && a <= 6;
    case K_STR: return a >= 1 && a <= 4;
    case K_ENUM: return a == 1 || a == 2;
    case K_BIT: case K_SET: return a >= 1 && a <= 8;
    case K_PYFIXED: return a >= 1 && a <= 16;
    case K_FLOAT: case K_DOUBLE: case K_YEAR: case K_DATE: return 1;
    }
    return 0;
}

/* Program(ops, names, key_index, (ChangeEvent, TransactionInfo, CREATE, UPDATE, DELETE, STREAMED)) */
static PyObject *program_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *ops, *names, *keys, *consts;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyTuple_Type, &ops, &PyTuple_Type, &names, &PyTuple_Type, &keys,
                          &PyTuple_Type, &consts))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(ops);
    if (n == 0 || n > MAX_COLUMNS || PyTuple_GET_SIZE(names) != n || PyTuple_GET_SIZE(consts) != 6
            || PyTuple_GET_SIZE(keys) == 0) {
        PyErr_SetString(PyExc_ValueError, "Program: bad shape");
        return NULL;
    }
    Program *self = (Program *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->ops = PyMem_Calloc((size_t)n, sizeof(Op));
    self->key_index = PyMem_Calloc((size_t)PyTuple_GET_SIZE(keys), sizeof(Py_ssize_t));
    if (self->ops == NULL || self->key_index == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->ncols = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(ops, i);
        int kind, nullable, a, b;
        PyObject *conv;
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "iiiiO", &kind, &nullable, &a, &b, &conv)
                || !valid_op(kind, a, b) || !PyUnicode_Check(PyTuple_GET_ITEM(names, i))
                || ((kind == K_ENUM || kind == K_SET) && !PyTuple_Check(conv))
                || ((kind == K_FLOAT || kind == K_PYFIXED) && !PyCallable_Check(conv))
                || (kind == K_STR && conv != Py_None && !PyCallable_Check(conv))) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "Program: column %zd: bad op", i);
            Py_DECREF(self);
            return NULL;
        }
        self->ops[i] = (Op){kind, nullable, a, b, conv};
    }
    self->nkey = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t k = 0; k < self->nkey; k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(keys, k));
        if (i < 0 || i >= n) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "Program: key index out of range");
            Py_DECREF(self);
            return NULL;
        }
        self->key_index[k] = i;
    }
    self->ops_tuple = Py_NewRef(ops);
    self->names = Py_NewRef(names);
    PyObject **slots[6] = {&self->event_type, &self->tx_type, &self->op_create, &self->op_update,
                           &self->op_delete, &self->streamed};
    for (int k = 0; k < 6; k++)
        *slots[k] = Py_NewRef(PyTuple_GET_ITEM(consts, k));
    if (!PyType_Check(self->event_type) || !PyType_IsSubtype((PyTypeObject *)self->event_type, &PyTuple_Type)
            || !PyType_Check(self->tx_type) || !PyType_IsSubtype((PyTypeObject *)self->tx_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "Program: the event and transaction types must be tuple types");
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyMethodDef program_methods[] = {
    {"events", (PyCFunction)(void (*)(void))program_events, METH_FASTCALL,
     "events(kind, data, start, end, tid, base, ts_ms, file, pos, gtid, tx_id, order, first) -> "
     "(events, end, count), or None when the Python decoder must take the event"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sources.mysql._rowdecode.Program",
    .tp_basicsize = sizeof(Program),
    .tp_dealloc = (destructor)program_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled decoding of one table map's row images.",
    .tp_methods = program_methods,
    .tp_new = program_new,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sources.mysql._rowdecode", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__rowdecode(void)
{
    if (PyType_Ready(&ProgramType) < 0)
        return NULL;
    s_file = PyUnicode_InternFromString("file");
    s_pos = PyUnicode_InternFromString("pos");
    s_row = PyUnicode_InternFromString("row");
    s_gtid = PyUnicode_InternFromString("gtid");
    if (!s_file || !s_pos || !s_row || !s_gtid)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    static const struct { const char *name; int kind; } kinds[] = {
        {"INT", K_INT}, {"FLOAT", K_FLOAT}, {"DOUBLE", K_DOUBLE}, {"YEAR", K_YEAR}, {"DECIMAL", K_DECIMAL},
        {"DATE", K_DATE}, {"DATETIME2", K_DATETIME2}, {"TIMESTAMP2", K_TIMESTAMP2}, {"STR", K_STR},
        {"ENUM", K_ENUM}, {"BIT", K_BIT}, {"SET", K_SET}, {"PYFIXED", K_PYFIXED}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (PyModule_AddIntConstant(m, kinds[i].name, kinds[i].kind) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    if (PyModule_AddObjectRef(m, "Program", (PyObject *)&ProgramType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
