/* Capture encoding: the loop of cdc.serde.EnvelopeEncoder.emit in C, and emit_rows for a
 * snapshot's RowBlock further down.
 *
 * Optional: cdc/serde.py loads it through cdc.native where setup.py built it (`optional=True`)
 * and otherwise runs its own Python loop, which stays the reference. Both make the same bytes
 * (tests/unit/test_encode.py compares them on generated events). Rows, keys and fields are
 * still serialized by orjson.dumps; what moves to C is the per-event work around it: unpacking
 * the event, the cache lookups, assembling the value from its pieces and calling `emit`.
 *
 * emit(middle, events, emit, when_room, everywhere, now_ms, where, source_header) -> bytes of values made
 *   middle(table, op, snapshot, now_ms) -> (topic, b',"op":...,"ts_ms":'), cached per call.
 *   Each record goes out as emit(topic, value, key, [("cdc.version", b"<version>"), source_header])
 *   (its headers, cdc/headers.py), a delete's tombstone with the delete's list.
 *   On failure `where` (a list of two) is set to [topic or None, bytes made so far] and the
 *   exception propagates; serde.py wraps it in an EmitError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <stdint.h>

#include "_inttext.h"
#include "_logrecord.h"
#include "_rowblock.h"

static PyObject *dumps = NULL;        /* orjson.dumps */
static PyObject *op_truncate = NULL;  /* Op.TRUNCATE */
static PyObject *op_delete = NULL;    /* Op.DELETE */
static PyObject *truncate_key = NULL; /* b"{}" */
static PyObject *version_header = NULL; /* VERSION_HEADER as a str */

static const char HEAD_BEFORE[] = "{\"before\":";
static const char HEAD_AFTER[] = ",\"after\":";
static const char VERSION[] = ",\"version\":";
static const char TX_NULL[] = ",\"transaction\":null}";
static const char TX_ID[] = ",\"transaction\":{\"id\":";
static const char TX_TOTAL[] = ",\"total_order\":";
static const char TX_DCO[] = ",\"data_collection_order\":";

/* Call f(a, b, c, h); on BufferError call room(a, b, c, h) instead. A new reference or NULL. */
static PyObject *
call_with_room(PyObject *f, PyObject *room, PyObject *a, PyObject *b, PyObject *c, PyObject *h)
{
    PyObject *args[4] = {a, b, c, h};
    PyObject *r = PyObject_Vectorcall(f, args, 4, NULL);
    if (r == NULL && PyErr_ExceptionMatches(PyExc_BufferError)) {
        PyErr_Clear();
        r = PyObject_Vectorcall(room, args, 4, NULL);
    }
    return r;
}

/* [(version_header, b"<digits>"), source]: a record's headers (cdc/headers.py). */
static PyObject *
record_headers(const char *digits, Py_ssize_t n, PyObject *source)
{
    PyObject *value = PyBytes_FromStringAndSize(digits, n);
    PyObject *pair = value ? PyTuple_Pack(2, version_header, value) : NULL;
    Py_XDECREF(value);
    PyObject *list = pair ? PyList_New(2) : NULL;
    if (list == NULL) {
        Py_XDECREF(pair);
        return NULL;
    }
    PyList_SET_ITEM(list, 0, pair);
    PyList_SET_ITEM(list, 1, Py_NewRef(source));
    return list;
}

static PyObject *
dump(PyObject *value)
{
    PyObject *out = PyObject_CallOneArg(dumps, value);
    if (out != NULL && !PyBytes_Check(out)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "orjson.dumps returned no bytes");
        return NULL;
    }
    return out;
}

static PyObject *
py_setup(PyObject *self, PyObject *args)
{
    PyObject *d, *t, *del, *k;
    if (!PyArg_ParseTuple(args, "OOOO!", &d, &t, &del, &PyBytes_Type, &k))
        return NULL;
    if (version_header == NULL && (version_header = PyUnicode_InternFromString(VERSION_HEADER)) == NULL)
        return NULL;
    Py_XSETREF(dumps, Py_NewRef(d));
    Py_XSETREF(op_truncate, Py_NewRef(t));
    Py_XSETREF(op_delete, Py_NewRef(del));
    Py_XSETREF(truncate_key, Py_NewRef(k));
    Py_RETURN_NONE;
}

static PyObject *
py_emit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "emit takes 8 arguments");
        return NULL;
    }
    if (dumps == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cdc._decode.setup was not called");
        return NULL;
    }
    PyObject *middle_fn = args[0], *events = args[1], *emit = args[2], *room = args[3];
    PyObject *everywhere = args[4], *now_ms = args[5], *where = args[6], *source_header = args[7];
    if (!PyList_Check(where) || PyList_GET_SIZE(where) != 2) {
        PyErr_SetString(PyExc_TypeError, "where must be a list of two");
        return NULL;
    }
    /* A list of the events (the same list when given one): every event, and so every table,
     * transaction id and fields dict compared by identity below, stays alive for the call. */
    PyObject *seq = PySequence_Fast(events, "events must be iterable");
    if (seq == NULL)
        return NULL;
    PyObject *iter = PyObject_GetIter(seq);
    if (iter == NULL) {
        Py_DECREF(seq);
        return NULL;
    }

    PyObject *cache = PyDict_New();            /* (id(table), op, snapshot) -> (topic, middle) */
    PyObject *last_table = NULL, *last_op = NULL, *last_snapshot = NULL;  /* borrowed */
    PyObject *middle = NULL;                   /* borrowed from cache */
    PyObject *last_tx_id = NULL, *tx_id_json = NULL;        /* borrowed, owned */
    PyObject *last_fields = NULL, *fields_json = NULL;      /* borrowed, owned */
    PyObject *topic = NULL;                    /* borrowed from middle */
    long long nbytes = 0;
    PyObject *event = NULL;
    int failed = cache == NULL;

    while (!failed && (event = PyIter_Next(iter)) != NULL) {
        PyObject *before_json = NULL, *after_json = NULL, *key_json = NULL, *value = NULL, *r = NULL;
        PyObject *headers = NULL;
        if (!PyTuple_Check(event) || PyTuple_GET_SIZE(event) != 10) {
            PyErr_Format(PyExc_TypeError, "not a ChangeEvent: %.100s", Py_TYPE(event)->tp_name);
            goto fail_event;
        }
        PyObject *op = PyTuple_GET_ITEM(event, 0), *table = PyTuple_GET_ITEM(event, 1);
        PyObject *key = PyTuple_GET_ITEM(event, 2), *before = PyTuple_GET_ITEM(event, 3);
        PyObject *after = PyTuple_GET_ITEM(event, 4), *version = PyTuple_GET_ITEM(event, 5);
        PyObject *ts_ms = PyTuple_GET_ITEM(event, 6), *snapshot = PyTuple_GET_ITEM(event, 7);
        PyObject *fields = PyTuple_GET_ITEM(event, 8), *tx = PyTuple_GET_ITEM(event, 9);

        if (table != last_table || op != last_op || snapshot != last_snapshot) {
            PyObject *id = PyLong_FromVoidPtr(table);
            PyObject *ck = id ? PyTuple_Pack(3, id, op, snapshot) : NULL;
            Py_XDECREF(id);
            if (ck == NULL)
                goto fail_event;
            PyObject *found = PyDict_GetItemWithError(cache, ck);
            if (found == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(ck);
                    goto fail_event;
                }
                PyObject *margs[4] = {table, op, snapshot, now_ms};
                found = PyObject_Vectorcall(middle_fn, margs, 4, NULL);
                if (found == NULL || !PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 2
                        || !PyBytes_Check(PyTuple_GET_ITEM(found, 1))) {
                    if (found != NULL)
                        PyErr_SetString(PyExc_TypeError, "middle() must return (topic, bytes)");
                    Py_XDECREF(found);
                    Py_DECREF(ck);
                    goto fail_event;
                }
                int set = PyDict_SetItem(cache, ck, found);
                Py_DECREF(found);  /* the cache keeps it */
                if (set < 0) {
                    Py_DECREF(ck);
                    goto fail_event;
                }
            }
            Py_DECREF(ck);
            middle = found;
            last_table = table;
            last_op = op;
            last_snapshot = snapshot;
        }
        topic = PyTuple_GET_ITEM(middle, 0);

        int has_fields = 0;
        if (fields != Py_None) {
            has_fields = PyObject_IsTrue(fields);
            if (has_fields < 0)
                goto fail_event;
        }
        if (has_fields && fields != last_fields) {
            PyObject *j = dump(fields);
            if (j == NULL)
                goto fail_event;
            if (PyBytes_GET_SIZE(j) < 2) {
                Py_DECREF(j);
                PyErr_SetString(PyExc_TypeError, "source fields must be a dict");
                goto fail_event;
            }
            Py_XSETREF(fields_json, j);
            last_fields = fields;
        }
        PyObject *tx_total = NULL, *tx_dco = NULL;
        if (tx != Py_None) {
            if (!PyTuple_Check(tx) || PyTuple_GET_SIZE(tx) != 3) {
                PyErr_SetString(PyExc_TypeError, "transaction must be a TransactionInfo");
                goto fail_event;
            }
            PyObject *tx_id = PyTuple_GET_ITEM(tx, 0);
            if (tx_id != last_tx_id || tx_id_json == NULL) {
                PyObject *j = dump(tx_id);
                if (j == NULL)
                    goto fail_event;
                Py_XSETREF(tx_id_json, j);
                last_tx_id = tx_id;
            }
            tx_total = PyTuple_GET_ITEM(tx, 1);
            tx_dco = PyTuple_GET_ITEM(tx, 2);
        }

        if (before != Py_None && (before_json = dump(before)) == NULL)
            goto fail_event;
        if ((after_json = dump(after)) == NULL)
            goto fail_event;

        char ts_buf[24], version_buf[24], total_buf[24], dco_buf[24];
        Py_ssize_t ts_len = format_int(ts_ms, ts_buf, "ts_ms");
        if (ts_len < 0)
            goto fail_event;
        Py_ssize_t version_len = format_int(version, version_buf, "version");
        if (version_len < 0)
            goto fail_event;
        Py_ssize_t total_len = 0, dco_len = 0;
        if (tx_total != NULL) {
            if ((total_len = format_int(tx_total, total_buf, "total_order")) < 0)
                goto fail_event;
            if ((dco_len = format_int(tx_dco, dco_buf, "data_collection_order")) < 0)
                goto fail_event;
        }

        PyObject *mid = PyTuple_GET_ITEM(middle, 1);
        Py_ssize_t before_len = before_json ? PyBytes_GET_SIZE(before_json) : 4;
        Py_ssize_t size = LIT(HEAD_BEFORE) + before_len + LIT(HEAD_AFTER) + PyBytes_GET_SIZE(after_json)
                          + PyBytes_GET_SIZE(mid) + ts_len + LIT(VERSION) + version_len;
        /* The source object closes with the fields (",<fields JSON without its {>") or with "}". */
        size += has_fields ? PyBytes_GET_SIZE(fields_json) : 1;
        if (tx_total != NULL)
            size += LIT(TX_ID) + PyBytes_GET_SIZE(tx_id_json) + LIT(TX_TOTAL) + total_len + LIT(TX_DCO)
                    + dco_len + 2;
        else
            size += LIT(TX_NULL);
        value = PyBytes_FromStringAndSize(NULL, size);
        if (value == NULL)
            goto fail_event;
        char *w = PyBytes_AS_STRING(value);
#define PUT(src, n) do { memcpy(w, (src), (size_t)(n)); w += (n); } while (0)
        PUT(HEAD_BEFORE, LIT(HEAD_BEFORE));
        if (before_json)
            PUT(PyBytes_AS_STRING(before_json), before_len);
        else
            PUT("null", 4);
        PUT(HEAD_AFTER, LIT(HEAD_AFTER));
        PUT(PyBytes_AS_STRING(after_json), PyBytes_GET_SIZE(after_json));
        PUT(PyBytes_AS_STRING(mid), PyBytes_GET_SIZE(mid));
        PUT(ts_buf, ts_len);
        PUT(VERSION, LIT(VERSION));
        PUT(version_buf, version_len);
        if (has_fields) {
            PUT(",", 1);
            PUT(PyBytes_AS_STRING(fields_json) + 1, PyBytes_GET_SIZE(fields_json) - 1);
        } else {
            PUT("}", 1);
        }
        if (tx_total != NULL) {
            PUT(TX_ID, LIT(TX_ID));
            PUT(PyBytes_AS_STRING(tx_id_json), PyBytes_GET_SIZE(tx_id_json));
            PUT(TX_TOTAL, LIT(TX_TOTAL));
            PUT(total_buf, total_len);
            PUT(TX_DCO, LIT(TX_DCO));
            PUT(dco_buf, dco_len);
            PUT("}}", 2);
        } else {
            PUT(TX_NULL, LIT(TX_NULL));
        }
#undef PUT
        if (w != PyBytes_AS_STRING(value) + size) {
            PyErr_SetString(PyExc_SystemError, "cdc._decode: value size miscounted");
            goto fail_event;
        }
        nbytes += size;
        if ((headers = record_headers(version_buf, version_len, source_header)) == NULL)
            goto fail_event;

        if (op == op_truncate) {
            PyObject *targs[4] = {topic, value, truncate_key, headers};
            r = PyObject_Vectorcall(everywhere, targs, 4, NULL);
            if (r == NULL)
                goto fail_event;
        } else {
            if ((key_json = dump(key)) == NULL)
                goto fail_event;
            if ((r = call_with_room(emit, room, topic, value, key_json, headers)) == NULL)
                goto fail_event;
            if (op == op_delete) {
                Py_DECREF(r);
                if ((r = call_with_room(emit, room, topic, Py_None, key_json, headers)) == NULL)
                    goto fail_event;
            }
        }
        Py_DECREF(r);
        Py_XDECREF(before_json);
        Py_DECREF(after_json);
        Py_XDECREF(key_json);
        Py_DECREF(value);
        Py_DECREF(headers);
        Py_DECREF(event);
        continue;
    fail_event:
        Py_XDECREF(before_json);
        Py_XDECREF(after_json);
        Py_XDECREF(key_json);
        Py_XDECREF(value);
        Py_XDECREF(headers);
        Py_DECREF(event);
        failed = 1;
    }
    if (!failed && PyErr_Occurred())  /* the iterator failed */
        failed = 1;

    PyObject *result = NULL;
    if (failed) {
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyObject *made = PyLong_FromLongLong(nbytes);
        if (made != NULL) {
            PyList_SetItem(where, 0, Py_NewRef(topic ? topic : Py_None));
            PyList_SetItem(where, 1, made);
        } else {
            PyErr_Clear();
        }
        PyErr_Restore(type, exc, tb);
    } else {
        result = PyLong_FromLongLong(nbytes);
    }
    Py_XDECREF(cache);  /* holds the middles (and so `topic`): released after `where` took it */
    Py_XDECREF(tx_id_json);
    Py_XDECREF(fields_json);
    Py_DECREF(iter);
    Py_DECREF(seq);
    return result;
}

/* emit_rows(block, emit, when_room, topic, value_head, value_tail, key_head, key_tail, headers) -> bytes of values made
 *   The records of a block of snapshot rows (cdc.events.RowBlock) straight from its lines, with no
 *   event, dict or Fragment in between: each line `<key text>\t<row JSON>[\t...]\n` becomes
 *   emit(topic, value_head + row JSON + value_tail, key_head + key text + key_tail, headers),
 *   or when_room(...) on BufferError (the rows share a version, so every record the same headers). The block's maker checked its lines (RowBlock's docstring); a line without a tab
 *   here is a TypeError before anything of the block is handed over. A failure of emit propagates
 *   with the records before it handed over (the writer then never reports anything after them safe). */
static PyObject *
py_emit_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "emit_rows takes 9 arguments");
        return NULL;
    }
    PyObject *emit = args[1], *room = args[2], *topic = args[3], *headers = args[8];
    for (int i = 4; i < 8; i++)
        if (!PyBytes_Check(args[i])) {
            PyErr_SetString(PyExc_TypeError, "emit_rows: the heads and tails must be bytes");
            return NULL;
        }
    Py_buffer block;
    if (PyObject_GetBuffer(args[0], &block, PyBUF_SIMPLE) < 0)
        return NULL;
    const char *vh = PyBytes_AS_STRING(args[4]), *vt = PyBytes_AS_STRING(args[5]);
    const char *kh = PyBytes_AS_STRING(args[6]), *kt = PyBytes_AS_STRING(args[7]);
    Py_ssize_t nvh = PyBytes_GET_SIZE(args[4]), nvt = PyBytes_GET_SIZE(args[5]);
    Py_ssize_t nkh = PyBytes_GET_SIZE(args[6]), nkt = PyBytes_GET_SIZE(args[7]);
    const char *start = block.buf, *end = start + block.len, *p;
    if (rowblock_check(start, end, NULL, "emit_rows") < 0) {
        PyBuffer_Release(&block);
        return NULL;
    }
    long long nbytes = 0;
    for (p = start; p < end;) {
        RowLine line;
        p = rowblock_line(p, end, &line);
        Py_ssize_t nk = (Py_ssize_t)line.nkey, nj = (Py_ssize_t)line.njson;
        PyObject *value = PyBytes_FromStringAndSize(NULL, nvh + nj + nvt);
        PyObject *key = value ? PyBytes_FromStringAndSize(NULL, nkh + nk + nkt) : NULL;
        if (key == NULL) {
            Py_XDECREF(value);
            PyBuffer_Release(&block);
            return NULL;
        }
        char *v = PyBytes_AS_STRING(value), *k = PyBytes_AS_STRING(key);
        memcpy(v, vh, (size_t)nvh);
        memcpy(v + nvh, line.json, (size_t)nj);
        memcpy(v + nvh + nj, vt, (size_t)nvt);
        memcpy(k, kh, (size_t)nkh);
        memcpy(k + nkh, line.key, (size_t)nk);
        memcpy(k + nkh + nk, kt, (size_t)nkt);
        nbytes += nvh + nj + nvt;
        PyObject *r = call_with_room(emit, room, topic, value, key, headers);
        Py_DECREF(value);
        Py_DECREF(key);
        if (r == NULL) {
            PyBuffer_Release(&block);
            return NULL;
        }
        Py_DECREF(r);
    }
    PyBuffer_Release(&block);
    return PyLong_FromLongLong(nbytes);
}

static PyMethodDef methods[] = {
    {"setup", py_setup, METH_VARARGS, "setup(dumps, Op.TRUNCATE, Op.DELETE, truncate_key)"},
    {"emit", (PyCFunction)(void (*)(void))py_emit, METH_FASTCALL,
     "emit(middle, events, emit, when_room, everywhere, now_ms, where, source_header) -> bytes of values made"},
    {"emit_rows", (PyCFunction)(void (*)(void))py_emit_rows, METH_FASTCALL,
     "emit_rows(block, emit, when_room, topic, value_head, value_tail, key_head, key_tail, headers) -> bytes of values made"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._encode", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__encode(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "VERSION_HEADER", VERSION_HEADER) < 0)
        Py_CLEAR(m);
    return m;
}
