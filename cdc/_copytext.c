/* SQL COPY text in C: the lines of sinks/sql/copy_rows.py's formatter for rows left as JSON bytes
 * (the Python formatter is the reference; tests/unit/test_raw_rows.py compares them).
 *
 * copy_rows(pairs, names, kinds, nested, rest) -> bytes: the COPY text lines of
 *   sinks/sql/copy_rows.py's formatter for the (key JSON, SinkEvent) pairs whose after is JSON
 *   bytes; the pairs with a decoded after are appended to the list rest, for the Python loop;
 *   kinds has a byte per column: 'v' a value, 'j' a json column, 'x' skipped (NULL). nested(span)
 *   gives the text of an object or array value and of any json column's value (orjson there, so
 *   the bytes are the formatter's); floats are written as repr writes them.
 * unknown_names(afters, names, loads) -> set of the member names of the after objects not in
 *   names (loads, orjson.loads, decodes a name with escapes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <stdint.h>

#include "_inttext.h"
#include "_jsonscan.h"

/* A growing output buffer. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Out;

static int
out_reserve(Out *o, Py_ssize_t extra)
{
    if (o->len + extra <= o->cap) return 1;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + extra) cap *= 2;
    char *grown = PyMem_Realloc(o->data, cap);
    if (grown == NULL) { PyErr_NoMemory(); return 0; }
    o->data = grown;
    o->cap = cap;
    return 1;
}

static int
out_put(Out *o, const char *p, Py_ssize_t n)
{
    if (!out_reserve(o, n)) return 0;
    memcpy(o->data + o->len, p, n);
    o->len += n;
    return 1;
}

/* A byte as COPY text writes it: backslash, tab, newline and carriage return escaped. */
static inline void
copy_byte(Out *o, unsigned char c)
{
    switch (c) {
    case '\\': o->data[o->len++] = '\\'; o->data[o->len++] = '\\'; break;
    case '\t': o->data[o->len++] = '\\'; o->data[o->len++] = 't'; break;
    case '\n': o->data[o->len++] = '\\'; o->data[o->len++] = 'n'; break;
    case '\r': o->data[o->len++] = '\\'; o->data[o->len++] = 'r'; break;
    default: o->data[o->len++] = (char)c;
    }
}

static void
put_utf8(Out *o, unsigned int cp)
{
    if (cp < 0x80) { copy_byte(o, (unsigned char)cp); return; }
    if (cp < 0x800) {
        o->data[o->len++] = (char)(0xC0 | (cp >> 6));
    } else if (cp < 0x10000) {
        o->data[o->len++] = (char)(0xE0 | (cp >> 12));
        o->data[o->len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
    } else {
        o->data[o->len++] = (char)(0xF0 | (cp >> 18));
        o->data[o->len++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o->data[o->len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
    }
    o->data[o->len++] = (char)(0x80 | (cp & 0x3F));
}

/* The checked JSON string [p, end) (between its quotes) decoded, as COPY text. */
static int
put_string(Out *o, const unsigned char *p, const unsigned char *end)
{
    if (!out_reserve(o, 2 * (end - p))) return 0;  /* no escape grows past twice its bytes */
    while (p < end) {
        unsigned char c = *p;
        if (c != '\\') { copy_byte(o, c); p++; continue; }
        unsigned char e = p[1];
        p += 2;
        switch (e) {
        case 'b': copy_byte(o, '\b'); break;
        case 'f': copy_byte(o, '\f'); break;
        case 'n': copy_byte(o, '\n'); break;
        case 'r': copy_byte(o, '\r'); break;
        case 't': copy_byte(o, '\t'); break;
        case 'u': {
            unsigned int u, low;
            hex4(p, &u);
            p += 4;
            if (u >= 0xD800 && u <= 0xDBFF) {
                hex4(p + 2, &low);
                p += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
            }
            put_utf8(o, u);
            break;
        }
        default: copy_byte(o, e);  /* " \ / */
        }
    }
    return 1;
}

static int
put_text(Out *o, PyObject *text)
{
    Py_ssize_t n;
    const char *p;
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "nested() must return a str");
        return 0;
    }
    if ((p = PyUnicode_AsUTF8AndSize(text, &n)) == NULL) return 0;
    return out_put(o, p, n);
}

static int
put_nested(Out *o, PyObject *nested, const Member *m)
{
    PyObject *span = span_bytes(m);
    if (span == NULL) return 0;
    PyObject *text = PyObject_CallOneArg(nested, span);
    Py_DECREF(span);
    if (text == NULL) return 0;
    int ok = put_text(o, text);
    Py_DECREF(text);
    return ok;
}

/* One value (kind 'v') as the formatter's text(value) writes it. */
static int
put_value(Out *o, PyObject *nested, const Member *m)
{
    const unsigned char *p = m->value;
    Py_ssize_t n = m->value_end - p;
    switch (*p) {
    case '"': return put_string(o, p + 1, m->value_end - 1);
    case 'n': return out_put(o, "\\N", 2);
    case 't': return out_put(o, "true", 4);
    case 'f': return out_put(o, "false", 5);
    case '{': case '[': return put_nested(o, nested, m);
    }
    int integral = !memchr(p, '.', n) && !memchr(p, 'e', n) && !memchr(p, 'E', n);
    if (integral && int_fits(p, n)) {
        if (n == 2 && p[0] == '-' && p[1] == '0') return out_put(o, "0", 1);
        return out_put(o, (const char *)p, n);
    }
    double d;
    if (!number_double(p, n, &d)) {
        PyErr_SetString(PyExc_ValueError, "a number out of range");
        return 0;
    }
    char *repr = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (repr == NULL) return 0;
    int ok = out_put(o, repr, strlen(repr));
    PyMem_Free(repr);
    return ok;
}

/* The index of the column a member names, -1 if none; `hint` is tried first (rows list their
 * columns in order, so it is usually right). */
static Py_ssize_t
column_of(const Member *m, const char **names, const Py_ssize_t *lens, Py_ssize_t count, Py_ssize_t hint,
          Out *scratch)
{
    const unsigned char *name = m->name;
    Py_ssize_t len = m->name_len;
    if (m->escaped) {  /* compare the decoded name (as COPY text it is the same unless it has \ tab nl cr) */
        scratch->len = 0;
        if (!put_string(scratch, m->name, m->name + m->name_len)) return -2;
        if (memchr(scratch->data, '\\', scratch->len)) return -3;  /* needs the exact name: the caller decides */
        name = (const unsigned char *)scratch->data;
        len = scratch->len;
    }
    if (hint < count && lens[hint] == len && memcmp(names[hint], name, len) == 0) return hint;
    for (Py_ssize_t i = 0; i < count; i++)
        if (lens[i] == len && memcmp(names[i], name, len) == 0) return i;
    return -1;
}

static PyObject *
py_copy_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "copy_rows(pairs, names, kinds, nested, rest)");
        return NULL;
    }
    PyObject *rest = args[4];
    PyObject *rows = PySequence_Fast(args[0], "rows must be a sequence");
    if (rows == NULL) return NULL;
    PyObject *names_seq = PySequence_Fast(args[1], "names must be a sequence");
    if (names_seq == NULL) { Py_DECREF(rows); return NULL; }
    PyObject *kinds = args[2], *nested = args[3];
    Py_ssize_t count = PySequence_Fast_GET_SIZE(names_seq);
    const char **names = NULL;
    Py_ssize_t *lens = NULL;
    const Member **values = NULL;
    Members m = {NULL, 0, 0};
    Out o = {NULL, 0, 0}, scratch = {NULL, 0, 0};
    PyObject *result = NULL;
    if (!PyBytes_Check(kinds) || PyBytes_GET_SIZE(kinds) != count) {
        PyErr_SetString(PyExc_TypeError, "kinds must be bytes, one per name");
        goto done;
    }
    const char *kind = PyBytes_AS_STRING(kinds);
    names = PyMem_Calloc(count + 1, sizeof(char *));
    lens = PyMem_Calloc(count + 1, sizeof(Py_ssize_t));
    values = PyMem_Calloc(count + 1, sizeof(Member *));
    if (names == NULL || lens == NULL || values == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PySequence_Fast_GET_ITEM(names_seq, i);
        if (!PyUnicode_Check(name)) { PyErr_SetString(PyExc_TypeError, "names must be str"); goto done; }
        if ((names[i] = PyUnicode_AsUTF8AndSize(name, &lens[i])) == NULL) goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(rows);
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *row = PySequence_Fast_GET_ITEM(rows, r);
        PyObject *key, *event, *version, *after;
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(row, 1)) ||
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(row, 1)) < 8) {
            PyErr_SetString(PyExc_TypeError, "a row is (key JSON, SinkEvent)");
            goto done;
        }
        key = PyTuple_GET_ITEM(row, 0);
        event = PyTuple_GET_ITEM(row, 1);
        after = PyTuple_GET_ITEM(event, 6);
        version = PyTuple_GET_ITEM(event, 7);
        if (!PyBytes_Check(after)) {  /* a decoded row: for the Python loop */
            if (PyList_Append(rest, row) < 0) goto done;
            continue;
        }
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "a row's key JSON is bytes");
            goto done;
        }
        Scan s = {(const unsigned char *)PyBytes_AS_STRING(after),
                  (const unsigned char *)PyBytes_AS_STRING(after) + PyBytes_GET_SIZE(after)};
        int ok = scan_object(&s, &m);
        if (ok < 0) goto done;
        skip_ws(&s);
        if (!ok || s.p != s.end) {
            PyErr_SetString(PyExc_ValueError, "a row's after is not a JSON object");
            goto done;
        }
        memset(values, 0, count * sizeof(Member *));
        Py_ssize_t hint = 0;
        for (Py_ssize_t i = 0; i < m.len; i++) {
            Py_ssize_t c = column_of(&m.items[i], names, lens, count, hint, &scratch);
            if (c == -2) goto done;
            if (c == -3) {
                PyErr_SetString(PyExc_ValueError, "a member name with a backslash");
                goto done;
            }
            if (c >= 0) {
                values[c] = &m.items[i];
                hint = c + 1;
            }
        }
        /* the key JSON (backslashes doubled), the version, the columns */
        const char *k = PyBytes_AS_STRING(key);
        Py_ssize_t kn = PyBytes_GET_SIZE(key);
        if (!out_reserve(&o, 2 * kn + 32)) goto done;
        for (Py_ssize_t i = 0; i < kn; i++) {
            if (k[i] == '\\') o.data[o.len++] = '\\';
            o.data[o.len++] = k[i];
        }
        o.data[o.len++] = '\t';
        Py_ssize_t vn = format_int(version, o.data + o.len, "a row's version");
        if (vn < 0) goto done;
        o.len += vn;
        for (Py_ssize_t c = 0; c < count; c++) {
            if (!out_put(&o, "\t", 1)) goto done;
            const Member *v = values[c];
            if (kind[c] == 'x' || v == NULL || *v->value == 'n') {
                if (!out_put(&o, "\\N", 2)) goto done;
            } else if (kind[c] == 'j') {
                if (!put_nested(&o, nested, v)) goto done;
            } else if (!put_value(&o, nested, v)) {
                goto done;
            }
        }
        if (!out_put(&o, "\n", 1)) goto done;
    }
    result = PyBytes_FromStringAndSize(o.data ? o.data : "", o.len);
done:
    PyMem_Free(names);
    PyMem_Free(lens);
    PyMem_Free(values);
    PyMem_Free(m.items);
    PyMem_Free(o.data);
    PyMem_Free(scratch.data);
    Py_DECREF(names_seq);
    Py_DECREF(rows);
    return result;
}

static PyObject *
py_unknown_names(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "unknown_names(afters, names, loads)");
        return NULL;
    }
    PyObject *afters = PySequence_Fast(args[0], "afters must be a sequence");
    if (afters == NULL) return NULL;
    PyObject *names_seq = PySequence_Fast(args[1], "names must be a sequence");
    if (names_seq == NULL) { Py_DECREF(afters); return NULL; }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(names_seq);
    const char **names = PyMem_Calloc(count + 1, sizeof(char *));
    Py_ssize_t *lens = PyMem_Calloc(count + 1, sizeof(Py_ssize_t));
    Members m = {NULL, 0, 0};
    Out scratch = {NULL, 0, 0};
    PyObject *found = PySet_New(NULL), *result = NULL;
    if (names == NULL || lens == NULL) { PyErr_NoMemory(); goto done; }
    if (found == NULL) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PySequence_Fast_GET_ITEM(names_seq, i);
        if (!PyUnicode_Check(name)) { PyErr_SetString(PyExc_TypeError, "names must be str"); goto done; }
        if ((names[i] = PyUnicode_AsUTF8AndSize(name, &lens[i])) == NULL) goto done;
    }
    for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(afters); r++) {
        PyObject *after = PySequence_Fast_GET_ITEM(afters, r);
        if (!PyBytes_Check(after)) { PyErr_SetString(PyExc_TypeError, "an after is bytes"); goto done; }
        Scan s = {(const unsigned char *)PyBytes_AS_STRING(after),
                  (const unsigned char *)PyBytes_AS_STRING(after) + PyBytes_GET_SIZE(after)};
        int ok = scan_object(&s, &m);
        if (ok < 0) goto done;
        if (!ok) { PyErr_SetString(PyExc_ValueError, "an after is not a JSON object"); goto done; }
        Py_ssize_t hint = 0;
        for (Py_ssize_t i = 0; i < m.len; i++) {
            Py_ssize_t c = column_of(&m.items[i], names, lens, count, hint, &scratch);
            if (c == -2) goto done;
            if (c >= 0) { hint = c + 1; continue; }
            /* not a known name (or one with a backslash): the exact name, decoded by loads */
            PyObject *span = PyBytes_FromStringAndSize((const char *)m.items[i].name - 1, m.items[i].name_len + 2);
            if (span == NULL) goto done;
            PyObject *text = PyObject_CallOneArg(args[2], span);
            Py_DECREF(span);
            if (text == NULL) goto done;
            int known = PySequence_Contains(names_seq, text);
            if (known < 0 || (!known && PySet_Add(found, text) < 0)) { Py_DECREF(text); goto done; }
            Py_DECREF(text);
        }
    }
    result = Py_NewRef(found);
done:
    Py_XDECREF(found);
    PyMem_Free(names);
    PyMem_Free(lens);
    PyMem_Free(m.items);
    PyMem_Free(scratch.data);
    Py_DECREF(names_seq);
    Py_DECREF(afters);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_rows", (PyCFunction)(void (*)(void))py_copy_rows, METH_FASTCALL,
     "copy_rows(pairs, names, kinds, nested, rest) -> COPY text of the (key JSON, event) pairs with JSON bytes"},
    {"unknown_names", (PyCFunction)(void (*)(void))py_unknown_names, METH_FASTCALL,
     "unknown_names(afters, names, loads) -> set of member names not in names"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._copytext", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__copytext(void)
{
    return PyModule_Create(&module);
}
