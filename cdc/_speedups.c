/* The encoding loop of cdc.serde.EnvelopeEncoder.emit, in C; and, further down, the sink side's
 * envelope decoder and COPY loop for rows left as JSON bytes (cdc/sink_events.py, sinks/sql/copy_rows.py).
 *
 * Optional: cdc/serde.py uses it when it was built (setup.py, `optional=True`) and otherwise
 * runs its own Python loop, which stays the reference. Both make the same bytes
 * (tests/unit/test_speedups.py compares them on generated events). Rows, keys and fields are
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
#define LIT(s) (sizeof(s) - 1)
#define VERSION_HEADER "cdc.version"  /* cdc/headers.py's VERSION (tests/unit/test_speedups.py) */

/* Decimal text of a Python int into buf (at least 24 bytes); its length, or -1 with an error. */
static Py_ssize_t
format_int(PyObject *value, char *buf, const char *what)
{
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(value)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) {
        PyErr_Format(PyExc_OverflowError, "%s does not fit in 64 bits", what);
        return -1;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + (u % 10));
        u /= 10;
    } while (u);
    Py_ssize_t len = 0;
    if (v < 0)
        buf[len++] = '-';
    while (n)
        buf[len++] = tmp[--n];
    return len;
}

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

/* produce_positionally(produce) -> f(topic, value, key, headers=None): confluent-kafka's
 * Producer.produce(topic, value, key, partition, callback, on_delivery, timestamp, headers) with
 * the headers in their place and the arguments before them at their defaults (any partition, the
 * producer's delivery callback, now). A keyword call costs about 0.45 us more there: its
 * argument parser makes a str for every keyword it looks up. */
static PyObject *minus_one = NULL, *zero = NULL;

static PyObject *
positional_produce(PyObject *produce, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "produce(topic, value, key, headers=None)");
        return NULL;
    }
    PyObject *full[8] = {args[0], args[1], args[2], minus_one, Py_None, Py_None, zero,
                         nargs == 4 ? args[3] : Py_None};
    return PyObject_Vectorcall(produce, full, 8, NULL);
}

static PyMethodDef positional_produce_def = {
    "produce", (PyCFunction)(void (*)(void))positional_produce, METH_FASTCALL,
    "produce(topic, value, key, headers=None): Producer.produce with the headers in their place"};

static PyObject *
speedups_produce_positionally(PyObject *self, PyObject *produce)
{
    if (minus_one == NULL && ((minus_one = PyLong_FromLong(-1)) == NULL || (zero = PyLong_FromLong(0)) == NULL))
        return NULL;
    return PyCFunction_New(&positional_produce_def, produce);
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
speedups_setup(PyObject *self, PyObject *args)
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
speedups_emit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "emit takes 8 arguments");
        return NULL;
    }
    if (dumps == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cdc._speedups.setup was not called");
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
            PyErr_SetString(PyExc_SystemError, "cdc._speedups: value size miscounted");
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


/* ---------------------------------------------------------------------------------------------
 * The sink side: plain json envelopes read without building their rows (issue #18).
 *
 * decode_envelopes(records, SinkEvent, ops, loads, raw=True) -> list, per LogRecord its SinkEvent
 *   (with `raw`, an upsert's `after` left as the bytes of the row object; else its dict), or None.
 *   One parser (decode_one) serves this and decode_batch further down. The value is checked as
 *   strictly as orjson.loads checks it (UTF-8, escapes and surrogate pairs, numbers that fit a
 *   double, no trailing bytes); the source block and the key object are built here (their names
 *   and repeated strings reused from the record before), a key that is no object, a delete's
 *   before and (without `raw`) the after by loads (orjson.loads). A tombstone (null value) with a plain JSON key is an event too. None
 *   for anything else: not JSON, not an object, Connect JSON or Avro, an unknown op, a version
 *   that is not an int, an escaped member name; cdc/sink_events.py then decodes the record the
 *   general way (which raises its PoisonRecord or reads the other format), so this path never
 *   accepts what that one refuses.
 * copy_rows(pairs, names, kinds, nested, rest) -> bytes: the COPY text lines of
 *   sinks/sql/copy_rows.py's formatter for the (key JSON, SinkEvent) pairs whose after is JSON
 *   bytes; the pairs with a decoded after are appended to the list rest, for the Python loop;
 *   kinds has a byte per column: 'v' a value, 'j' a json column, 'x' skipped (NULL). nested(span)
 *   gives the text of an object or array value and of any json column's value (orjson there, so
 *   the bytes are the formatter's); floats are written as repr writes them.
 * unknown_names(afters, names, loads) -> set of the member names of the after objects not in
 *   names (loads, orjson.loads, decodes a name with escapes).
 * ------------------------------------------------------------------------------------------- */

#define MAX_DEPTH 1000

typedef struct {
    const unsigned char *p, *end;
} Scan;

static void
skip_ws(Scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

static int
hex4(const unsigned char *p, unsigned int *out)
{
    unsigned int v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return 0;
    }
    *out = v;
    return 1;
}

/* Length of a valid UTF-8 sequence at p (first byte >= 0x80), 0 if invalid. */
static int
utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    int n;
    unsigned int cp;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if (end - p < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return n;
}

/* s->p at '"': checks the string, moves past its closing quote; *escaped when it has a backslash. */
static int
scan_string(Scan *s, int *escaped)
{
    const unsigned char *p = s->p + 1, *end = s->end;
    *escaped = 0;
    while (p < end) {
        unsigned char c = *p;
        if (c == '"') {
            s->p = p + 1;
            return 1;
        }
        if (c < 0x20)
            return 0;
        if (c == '\\') {
            *escaped = 1;
            if (p + 1 >= end) return 0;
            unsigned char e = p[1];
            if (e == 'u') {
                unsigned int u, low;
                if (end - p < 6 || !hex4(p + 2, &u)) return 0;
                p += 6;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &low) || low < 0xDC00 || low > 0xDFFF)
                        return 0;
                    p += 6;
                } else if (u >= 0xDC00 && u <= 0xDFFF) {
                    return 0;
                }
                continue;
            }
            if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't')
                return 0;
            p += 2;
            continue;
        }
        if (c >= 0x80) {
            int n = utf8_len(p, end);
            if (!n) return 0;
            p += n;
            continue;
        }
        p++;
    }
    return 0;
}

/* An integer literal orjson reads as an int (-2**63 .. 2**64-1)? */
static int
int_fits(const unsigned char *p, Py_ssize_t n)
{
    int neg = p[0] == '-';
    const unsigned char *d = p + neg;
    Py_ssize_t len = n - neg;
    const char *limit = neg ? "9223372036854775808" : "18446744073709551615";
    if (len < 19 || (len == 19 && neg == 0)) return 1;
    if (len > (Py_ssize_t)strlen(limit)) return 0;
    if (len < (Py_ssize_t)strlen(limit)) return 1;
    return memcmp(d, limit, len) <= 0;
}

/* The double of a number literal (which orjson reads as a float); 0 if it is out of range. */
static int
number_double(const unsigned char *p, Py_ssize_t n, double *out)
{
    char buf[128];
    char *heap = NULL, *text = buf;
    if (n >= (Py_ssize_t)sizeof(buf)) {
        if ((heap = PyMem_Malloc(n + 1)) == NULL) return 0;
        text = heap;
    }
    memcpy(text, p, n);
    text[n] = 0;
    char *stop;
    double d = PyOS_string_to_double(text, &stop, NULL);
    int ok = !(d == -1.0 && PyErr_Occurred()) && !Py_IS_INFINITY(d) && stop == text + n;
    if (PyErr_Occurred()) PyErr_Clear();
    PyMem_Free(heap);
    *out = d;
    return ok;
}

/* s->p at a number: checks it; *is_int when orjson reads it as an int. */
static int
scan_number(Scan *s, int *is_int)
{
    const unsigned char *start = s->p, *p = s->p, *end = s->end;
    int integral = 1;
    if (p < end && *p == '-') p++;
    if (p >= end) return 0;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < end && *p >= '0' && *p <= '9') p++; }
    else return 0;
    if (p < end && *p == '.') {
        integral = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    if (integral && int_fits(start, p - start)) {
        *is_int = 1;
        return 1;
    }
    *is_int = 0;
    double d;
    return number_double(start, p - start, &d);
}

static int
scan_value(Scan *s, int depth)
{
    int flag;
    skip_ws(s);
    if (s->p >= s->end) return 0;
    unsigned char c = *s->p;
    if (c == '"') return scan_string(s, &flag);
    if (c == '{' || c == '[') {
        unsigned char close = c == '{' ? '}' : ']';
        if (depth >= MAX_DEPTH) return 0;
        s->p++;
        skip_ws(s);
        if (s->p < s->end && *s->p == close) { s->p++; return 1; }
        for (;;) {
            if (c == '{') {
                skip_ws(s);
                if (s->p >= s->end || *s->p != '"' || !scan_string(s, &flag)) return 0;
                skip_ws(s);
                if (s->p >= s->end || *s->p != ':') return 0;
                s->p++;
            }
            if (!scan_value(s, depth + 1)) return 0;
            skip_ws(s);
            if (s->p >= s->end) return 0;
            if (*s->p == ',') { s->p++; continue; }
            if (*s->p == close) { s->p++; return 1; }
            return 0;
        }
    }
    if (c == 't' || c == 'f' || c == 'n') {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(word);
        if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0) return 0;
        s->p += n;
        return 1;
    }
    return scan_number(s, &flag);
}

/* One member of an object: its name (raw, between the quotes) and its value's span. */
typedef struct {
    const unsigned char *name;
    Py_ssize_t name_len;
    int escaped;
    const unsigned char *value, *value_end;
} Member;

typedef struct {
    Member *items;
    Py_ssize_t len, cap;
} Members;

/* The members of the object at s->p (checked); 0 if it is not a valid object. */
static int
scan_object(Scan *s, Members *m)
{
    m->len = 0;
    skip_ws(s);
    if (s->p >= s->end || *s->p != '{') return 0;
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; return 1; }
    for (;;) {
        skip_ws(s);
        if (s->p >= s->end || *s->p != '"') return 0;
        Member item;
        item.name = s->p + 1;
        if (!scan_string(s, &item.escaped)) return 0;
        item.name_len = s->p - 1 - item.name;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':') return 0;
        s->p++;
        skip_ws(s);
        item.value = s->p;
        if (!scan_value(s, 1)) return 0;
        item.value_end = s->p;
        if (m->len == m->cap) {
            Py_ssize_t cap = m->cap ? m->cap * 2 : 16;
            Member *grown = PyMem_Realloc(m->items, cap * sizeof(Member));
            if (grown == NULL) { PyErr_NoMemory(); return -1; }
            m->items = grown;
            m->cap = cap;
        }
        m->items[m->len++] = item;
        skip_ws(s);
        if (s->p >= s->end) return 0;
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == '}') { s->p++; return 1; }
        return 0;
    }
}

static int
name_is(const Member *m, const char *name)
{
    size_t n = strlen(name);
    return !m->escaped && (size_t)m->name_len == n && memcmp(m->name, name, n) == 0;
}

static PyObject *
span_bytes(const Member *m)
{
    return PyBytes_FromStringAndSize((const char *)m->value, m->value_end - m->value);
}

/* The last names and string values of a source block, reused while the next has the same bytes
 * at the same place (a table's events repeat connector, name, db, table ...). */
#define SOURCE_CACHE 32
typedef struct {
    PyObject *name[SOURCE_CACHE], *text[SOURCE_CACHE];
    Py_ssize_t name_len[SOURCE_CACHE], text_len[SOURCE_CACHE];
} SourceCache;

static void
source_cache_clear(SourceCache *c)
{
    for (int i = 0; i < SOURCE_CACHE; i++) {
        Py_CLEAR(c->name[i]);
        Py_CLEAR(c->text[i]);
    }
}

/* A str for the checked, unescaped UTF-8 bytes [p, p+n), from the cache slot when it matches. */
static PyObject *
cached_str(PyObject **slot, Py_ssize_t *slot_len, const unsigned char *p, Py_ssize_t n)
{
    if (*slot != NULL && *slot_len == n) {
        Py_ssize_t len;
        const char *have = PyUnicode_AsUTF8AndSize(*slot, &len);
        if (have != NULL && len == n && memcmp(have, p, n) == 0)
            return Py_NewRef(*slot);
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (s == NULL) return NULL;
    Py_XSETREF(*slot, Py_NewRef(s));
    *slot_len = n;
    return s;
}

/* One member value of a source block as orjson gives it; loads() for anything but plain
 * strings, integers of 64 bits, true, false and null. */
static PyObject *
member_value(const Member *m, PyObject *loads, SourceCache *cache, int index)
{
    const unsigned char *p = m->value;
    Py_ssize_t n = m->value_end - p;
    switch (*p) {
    case '"':
        if (!memchr(p, '\\', n)) {
            if (index < SOURCE_CACHE)
                return cached_str(&cache->text[index], &cache->text_len[index], p + 1, n - 2);
            return PyUnicode_DecodeUTF8((const char *)p + 1, n - 2, NULL);
        }
        break;
    case 't': Py_RETURN_TRUE;
    case 'f': Py_RETURN_FALSE;
    case 'n': Py_RETURN_NONE;
    case '{': case '[': break;
    default:
        if (n < 19 && !memchr(p, '.', n) && !memchr(p, 'e', n) && !memchr(p, 'E', n)) {
            long long v = 0;
            int neg = *p == '-';
            for (Py_ssize_t i = neg; i < n; i++) v = v * 10 + (p[i] - '0');
            return PyLong_FromLongLong(neg ? -v : v);
        }
    }
    PyObject *span = span_bytes(m);
    if (span == NULL) return NULL;
    PyObject *value = PyObject_CallOneArg(loads, span);
    Py_DECREF(span);
    return value;
}

/* The dict of the members `m` holds (checked), as orjson makes it: names and values from `cache`
 * while they repeat, a name with escapes by loads, a name given twice taking its last value; NULL
 * with an error. */
static PyObject *
members_dict(const Members *m, PyObject *loads, SourceCache *cache)
{
    PyObject *dict = _PyDict_NewPresized(m->len);  /* a source block's ~10 members: no resize */
    if (dict == NULL) return NULL;
    for (Py_ssize_t i = 0; i < m->len; i++) {
        const Member *item = &m->items[i];
        PyObject *name;
        if (item->escaped) {
            PyObject *span = PyBytes_FromStringAndSize((const char *)item->name - 1, item->name_len + 2);
            if (span == NULL) { Py_DECREF(dict); return NULL; }
            name = PyObject_CallOneArg(loads, span);
            Py_DECREF(span);
        } else if (i < SOURCE_CACHE) {
            name = cached_str(&cache->name[i], &cache->name_len[i], item->name, item->name_len);
        } else {
            name = PyUnicode_DecodeUTF8((const char *)item->name, item->name_len, NULL);
        }
        if (name == NULL) { Py_DECREF(dict); return NULL; }
        PyObject *value = member_value(item, loads, cache, (int)i);
        if (value == NULL || PyDict_SetItem(dict, name, value) < 0) {
            Py_DECREF(name); Py_XDECREF(value); Py_DECREF(dict);
            return NULL;
        }
        Py_DECREF(name);
        Py_DECREF(value);
    }
    return dict;
}

/* The dict of a (checked) source object, or NULL with an error. */
static PyObject *
source_dict(const Member *source, PyObject *loads, Members *m, SourceCache *cache)
{
    Scan s = {source->value, source->value_end};
    int ok = scan_object(&s, m);
    if (ok < 0) return NULL;
    return members_dict(m, loads, cache);
}

/* The dict of a key's bytes when they are one JSON object (checked as the envelope is), as orjson
 * makes it (members_dict); Py_None when they are anything else (loads decides then), NULL with an
 * error. */
static PyObject *
scanned_key(const char *data, Py_ssize_t size, PyObject *loads, Members *m, SourceCache *cache)
{
    Scan s = {(const unsigned char *)data, (const unsigned char *)data + size};
    int ok = scan_object(&s, m);
    if (ok < 0) return NULL;
    skip_ws(&s);
    if (!ok || s.p != s.end)
        Py_RETURN_NONE;
    return members_dict(m, loads, cache);
}

/* The record key as decode_key gives it for a plain JSON object key; Py_None (a new reference)
 * when it is anything else (Avro, Connect JSON, not an object, not JSON): the general path then.
 * A key object is made by scanned_key, anything else by loads. */
static PyObject *
plain_key(PyObject *key, PyObject *loads, Members *km, SourceCache *kc)
{
    if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) == 0 || PyBytes_AS_STRING(key)[0] == 0)
        Py_RETURN_NONE;
    PyObject *value = scanned_key(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), loads, km, kc);
    if (value == NULL)
        return NULL;
    if (value == Py_None) {
        Py_DECREF(value);
        value = PyObject_CallOneArg(loads, key);
    }
    if (value == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!PyDict_CheckExact(value) || (PyDict_GET_SIZE(value) == 2 && PyDict_GetItemString(value, "payload") &&
                                      PyDict_GetItemString(value, "schema"))) {
        Py_DECREF(value);
        Py_RETURN_NONE;
    }
    return value;
}

/* A tombstone's SinkEvent (no op, no version, an empty source), or Py_None when its key is not a
 * plain JSON object (the general path then). */
/* ---- record headers (cdc/headers.py) --------------------------------------------------------
 * A record's headers come as confluent-kafka's list of (name, value) pairs (a LogRecord's last
 * field) or packed (the bulk reader's bytes, cdc/_rdconsume.c: per header a little-endian int32
 * name length, the name, an int32 value length, -1 for null, the value). Only a tombstone's are
 * read here: its version is the VERSION_HEADER's value (the last one, as Kafka looks a header
 * up), decimal digits as cdc/headers.version_of reads them. */

typedef struct {
    PyObject *list;         /* borrowed: the pairs, Py_None, or NULL when packed */
    const char *packed;     /* packed headers (NULL: none) */
    Py_ssize_t packed_len;
} HeadersRef;

/* '-'? then 1 to 19 ASCII digits within int64: 1 with *out set, 0 when not that. */
static int
version_digits(const char *p, Py_ssize_t n, long long *out)
{
    int negative = n > 0 && p[0] == '-';
    p += negative;
    n -= negative;
    if (n < 1 || n > 19)
        return 0;
    unsigned long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        v = v * 10 + (unsigned long long)(p[i] - '0');
    }
    if (v > (negative ? 9223372036854775808ULL : 9223372036854775807ULL))
        return 0;
    *out = negative ? (v == 9223372036854775808ULL ? INT64_MIN : -(long long)v) : (long long)v;
    return 1;
}

static int32_t
le_int32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (int32_t)((uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24);
}

/* The next packed header from *at: 1 (name, value; value NULL: null), 0 at the end, -1 damaged. */
static int
packed_header(const char **at, const char *end, const char **name, Py_ssize_t *name_len, const char **value,
              Py_ssize_t *value_len)
{
    const char *p = *at;
    if (p == end)
        return 0;
    if (end - p < 4 || (*name_len = le_int32(p)) < 0 || end - p - 4 < *name_len)
        return -1;
    *name = p + 4;
    p += 4 + *name_len;
    if (end - p < 4)
        return -1;
    *value_len = le_int32(p);
    p += 4;
    if (*value_len < 0) {
        *value = NULL;
        *value_len = 0;
    } else {
        if (end - p < *value_len)
            return -1;
        *value = p;
        p += *value_len;
    }
    *at = p;
    return 1;
}

/* A tombstone's version from its headers: 1 with *out a new int or Py_None (no version header),
 * 0 when they are not what cdc/headers.py reads (the general path then says why), -1 on error. */
static int
tombstone_version(const HeadersRef *h, PyObject **out)
{
    const char *found = NULL;
    Py_ssize_t found_len = 0;
    int have = 0;
    if (h->list == NULL) {
        const char *at = h->packed, *end = at + h->packed_len, *name, *value;
        Py_ssize_t name_len, value_len;
        int got = 0;
        while (at != NULL && (got = packed_header(&at, end, &name, &name_len, &value, &value_len)) == 1) {
            if (name_len == LIT(VERSION_HEADER) && memcmp(name, VERSION_HEADER, LIT(VERSION_HEADER)) == 0) {
                if (value == NULL)
                    return 0;
                found = value;
                found_len = value_len;
                have = 1;
            }
        }
        if (at != NULL && got < 0)
            return 0;
    } else if (h->list != Py_None) {
        if (!PyList_Check(h->list))
            return 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(h->list); i++) {
            PyObject *pair = PyList_GET_ITEM(h->list, i);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)))
                return 0;
            PyObject *name = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
            if (PyUnicode_CompareWithASCIIString(name, VERSION_HEADER) != 0)
                continue;
            if (!PyBytes_CheckExact(value))
                return 0;
            found = PyBytes_AS_STRING(value);
            found_len = PyBytes_GET_SIZE(value);
            have = 1;
        }
    }
    if (!have) {
        *out = Py_NewRef(Py_None);
        return 1;
    }
    long long version;
    if (!version_digits(found, found_len, &version))
        return 0;
    return (*out = PyLong_FromLongLong(version)) == NULL ? -1 : 1;
}

/* Packed headers as confluent-kafka's list of (name, value) pairs (a new list), or NULL with an
 * error (ValueError when the bytes are not packed headers). */
static PyObject *
packed_headers_list(const char *p, Py_ssize_t n)
{
    PyObject *list = PyList_New(0);
    const char *at = p, *end = p + n, *name, *value;
    Py_ssize_t name_len, value_len;
    int got;
    while (list != NULL && (got = packed_header(&at, end, &name, &name_len, &value, &value_len)) == 1) {
        PyObject *pair = Py_BuildValue("(s#N)", name, name_len,
                                       value ? PyBytes_FromStringAndSize(value, value_len) : Py_NewRef(Py_None));
        if (pair == NULL || PyList_Append(list, pair) < 0)
            Py_CLEAR(list);
        Py_XDECREF(pair);
    }
    if (list != NULL && got < 0) {
        Py_DECREF(list);
        PyErr_SetString(PyExc_ValueError, "packed headers that run past their end");
        return NULL;
    }
    return list;
}

/* unpack_headers(data) -> cdc.headers.unpack(data), in C; pack_headers(headers) -> cdc.headers.pack. */
static PyObject *
speedups_unpack_headers(PyObject *self, PyObject *data)
{
    if (data == Py_None)
        Py_RETURN_NONE;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "unpack_headers takes bytes");
        return NULL;
    }
    return packed_headers_list(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
}

static PyObject *
speedups_pack_headers(PyObject *self, PyObject *headers)
{
    if (headers == Py_None || (PyList_Check(headers) && PyList_GET_SIZE(headers) == 0))
        Py_RETURN_NONE;
    PyObject *seq = PySequence_Fast(headers, "the headers are a list of (name, value) pairs");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), size = 0;
    PyObject *out = NULL;
    for (int pass = 0; pass < 2; pass++) {  /* measure, then write */
        char *w = out ? PyBytes_AS_STRING(out) : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(seq, i), *name, *value;
            Py_ssize_t name_len;
            const char *name_utf8;
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(name = PyTuple_GET_ITEM(pair, 0))
                    || ((value = PyTuple_GET_ITEM(pair, 1)) != Py_None && !PyBytes_Check(value))) {
                PyErr_SetString(PyExc_TypeError, "a header is a (str, bytes or None) pair");
                goto fail;
            }
            if ((name_utf8 = PyUnicode_AsUTF8AndSize(name, &name_len)) == NULL)
                goto fail;
            Py_ssize_t value_len = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
            if (name_len > INT32_MAX || value_len > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "a header of 2 GiB or more");
                goto fail;
            }
            if (w == NULL) {
                size += 8 + name_len + (value_len > 0 ? value_len : 0);
                continue;
            }
            for (int b = 0; b < 4; b++) w[b] = (char)((uint32_t)name_len >> (8 * b) & 0xff);
            memcpy(w + 4, name_utf8, name_len);
            w += 4 + name_len;
            for (int b = 0; b < 4; b++) w[b] = (char)((uint32_t)(int32_t)value_len >> (8 * b) & 0xff);
            w += 4;
            if (value_len > 0) {
                memcpy(w, PyBytes_AS_STRING(value), value_len);
                w += value_len;
            }
        }
        if (pass == 0 && (out = PyBytes_FromStringAndSize(NULL, size)) == NULL)
            goto fail;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* The event of a tombstone: its version from its headers (None when they carry none), Py_None
 * when the general path must decide, NULL with an error. */
static PyObject *
tombstone_event(PyObject *const *record, const HeadersRef *headers, PyTypeObject *event_type, PyObject *loads,
                Members *km, SourceCache *kc)
{
    PyObject *version;
    int got = tombstone_version(headers, &version);
    if (got <= 0)
        return got < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *key = plain_key(record[3], loads, km, kc);
    if (key == NULL || key == Py_None) {
        Py_DECREF(version);
        return key;
    }
    PyObject *source = PyDict_New();
    PyObject *event = source ? event_type->tp_alloc(event_type, 10) : NULL;
    if (event != NULL) {
        PyObject *items[10] = {record[0], record[1], record[2], key, Py_None, Py_None, Py_None, version, source,
                               Py_None};
        for (int i = 0; i < 10; i++)
            PyTuple_SET_ITEM(event, i, Py_NewRef(items[i]));
    }
    Py_XDECREF(source);
    Py_DECREF(key);
    Py_DECREF(version);
    return event;
}

/* The parser's scratch space, kept across the records of one call. */
typedef struct {
    Members m, sm, km;
    SourceCache cache, key_cache;
} Scratch;

static void
scratch_free(Scratch *x)
{
    PyMem_Free(x->m.items);
    PyMem_Free(x->sm.items);
    PyMem_Free(x->km.items);
    source_cache_clear(&x->cache);
    source_cache_clear(&x->key_cache);
}

/* A LogRecord's first five fields (topic, partition, offset, key, value), or NULL with an error
 * when `record` is not one; *headers its headers (the seventh field; None without one). */
static PyObject *const *
record_fields(PyObject *record, HeadersRef *headers)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 5) {
        PyErr_SetString(PyExc_TypeError, "a record is (topic, partition, offset, key, value, ...)");
        return NULL;
    }
    headers->list = PyTuple_GET_SIZE(record) > 6 ? PyTuple_GET_ITEM(record, 6) : Py_None;
    headers->packed = NULL;
    headers->packed_len = 0;
    return &PyTuple_GET_ITEM(record, 0);
}

/* The SinkEvent of one record (its fields: topic, partition, offset, key, value; a new reference),
 * Py_None when the general path must decide, or NULL with an error that is not the record's. The
 * one parser of the json envelope on the sink side: `raw` leaves an upsert's after as the bytes
 * of the row object, else loads makes its dict (decode_batch, decode_packed, decode_envelopes). */
static PyObject *
decode_one(PyObject *const *record, const HeadersRef *headers, PyTypeObject *event_type, PyObject *ops,
           PyObject *loads, int raw, Scratch *x)
{
    Members *m = &x->m;
    PyObject *value = record[4];
    if (value == Py_None)
        return tombstone_event(record, headers, event_type, loads, &x->km, &x->key_cache);
    if (!PyBytes_Check(value))
        Py_RETURN_NONE;
    Scan s = {(const unsigned char *)PyBytes_AS_STRING(value),
              (const unsigned char *)PyBytes_AS_STRING(value) + PyBytes_GET_SIZE(value)};
    int ok = scan_object(&s, m);
    if (ok < 0) return NULL;
    skip_ws(&s);
    if (!ok || s.p != s.end)
        Py_RETURN_NONE;
    const Member *op = NULL, *before = NULL, *after = NULL, *source = NULL, *ts = NULL;
    for (Py_ssize_t i = 0; i < m->len; i++) {  /* a name given twice: the last one, as orjson */
        const Member *item = &m->items[i];
        if (item->escaped)
            Py_RETURN_NONE;  /* an escaped name might be one of these: the general path */
        if (name_is(item, "op")) op = item;
        else if (name_is(item, "before")) before = item;
        else if (name_is(item, "after")) after = item;
        else if (name_is(item, "source")) source = item;
        else if (name_is(item, "ts_ms")) ts = item;
    }
    if (op == NULL || *op->value != '"' || source == NULL || *source->value != '{')
        Py_RETURN_NONE;
    if (memchr(op->value, '\\', op->value_end - op->value))
        Py_RETURN_NONE;
    if ((before && *before->value != '{' && *before->value != 'n') || (after && *after->value != '{' && *after->value != 'n'))
        Py_RETURN_NONE;
    PyObject *op_text = PyUnicode_DecodeUTF8((const char *)op->value + 1, op->value_end - op->value - 2, NULL);
    if (op_text == NULL) return NULL;
    PyObject *op_value = PyDict_GetItemWithError(ops, op_text);  /* borrowed */
    Py_DECREF(op_text);
    if (op_value == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;  /* not an op: the general path says so (a PoisonRecord) */
    }
    PyObject *ts_ms;
    if (ts == NULL || *ts->value == 'n') {
        ts_ms = Py_NewRef(Py_None);
    } else {
        Py_ssize_t n = ts->value_end - ts->value;
        char buf[32];
        if (n >= (Py_ssize_t)sizeof(buf) || memchr(ts->value, '.', n) || memchr(ts->value, 'e', n) ||
            memchr(ts->value, 'E', n) || *ts->value == '"' || *ts->value == '{' || *ts->value == '[' ||
            *ts->value == 't' || *ts->value == 'f' || !int_fits(ts->value, n))
            Py_RETURN_NONE;
        memcpy(buf, ts->value, n);
        buf[n] = 0;
        if ((ts_ms = PyLong_FromString(buf, NULL, 10)) == NULL)
            return NULL;
    }
    PyObject *key = NULL, *source_d = NULL, *before_d = NULL, *after_v = NULL, *event = NULL;
    if ((key = plain_key(record[3], loads, &x->km, &x->key_cache)) == NULL) goto done;
    if (key == Py_None) { event = Py_NewRef(Py_None); goto done; }
    if ((source_d = source_dict(source, loads, &x->sm, &x->cache)) == NULL) goto done;
    PyObject *version = PyDict_GetItemString(source_d, "version");  /* borrowed */
    if (version == NULL || !PyLong_CheckExact(version)) { event = Py_NewRef(Py_None); goto done; }
    if (before && *before->value == '{') {
        PyObject *span = span_bytes(before);
        if (span == NULL) goto done;
        before_d = PyObject_CallOneArg(loads, span);
        Py_DECREF(span);
        if (before_d == NULL) goto done;
    } else {
        before_d = Py_NewRef(Py_None);
    }
    if (after && *after->value == '{') {
        after_v = span_bytes(after);
        if (after_v != NULL && !raw)
            Py_SETREF(after_v, PyObject_CallOneArg(loads, after_v));
    } else {
        after_v = Py_NewRef(Py_None);
    }
    if (after_v == NULL) goto done;
    event = event_type->tp_alloc(event_type, 10);
    if (event == NULL) goto done;
    PyObject *items[10] = {record[0], record[1], record[2], key, op_value, before_d, after_v, version, source_d,
                           ts_ms};
    for (int i = 0; i < 10; i++)
        PyTuple_SET_ITEM(event, i, Py_NewRef(items[i]));
done:
    Py_XDECREF(key);
    Py_XDECREF(source_d);
    Py_XDECREF(before_d);
    Py_XDECREF(after_v);
    Py_DECREF(ts_ms);
    return event;
}

static PyObject *
speedups_decode_envelopes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 5 || !PyType_Check(args[1]) || !PyType_IsSubtype((PyTypeObject *)args[1], &PyTuple_Type) ||
        !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "decode_envelopes(records, SinkEvent, ops, loads, raw=True)");
        return NULL;
    }
    int raw = 1;
    if (nargs == 5 && (raw = PyObject_IsTrue(args[4])) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "records must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    Scratch x;
    memset(&x, 0, sizeof(x));
    if (out == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        HeadersRef headers;
        PyObject *const *fields = record_fields(PySequence_Fast_GET_ITEM(seq, i), &headers);
        PyObject *one = fields ? decode_one(fields, &headers, (PyTypeObject *)args[1], args[2], args[3], raw, &x)
                               : NULL;
        if (one == NULL) goto fail;
        PyList_SET_ITEM(out, i, one);
    }
    scratch_free(&x);
    Py_DECREF(seq);
    return out;
fail:
    scratch_free(&x);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

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
speedups_copy_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
speedups_unknown_names(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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

/* ---- decode_batch: cdc.sink_events.decode_batch's loop (LogRecords -> SinkEvents) ------------
 *
 * decode_batch(records, ends, raw_rows=False) -> (events, [(record, PoisonRecord)], bytes of values)
 * Each record through decode_one, the parser above (with `raw_rows`, an upsert's after stays the
 * row's JSON bytes); every record it does not take goes to `db_fallback`
 * (cdc.sink_events.decode_record), so what such a record decodes to, or which PoisonRecord it
 * raises, is the Python code's by construction. */

static PyObject *db_loads = NULL;          /* orjson.loads */
static PyObject *db_fallback = NULL;       /* decode_record(record) -> SinkEvent, raises PoisonRecord */
static PyObject *db_poison_type = NULL;    /* PoisonRecord */
static PyTypeObject *db_event_type = NULL; /* SinkEvent (a tuple subclass of 10 fields) */
static PyObject *db_ops = NULL;            /* {"c": Op.CREATE, ...} */
static PyObject *db_one = NULL;            /* 1 */

static PyObject *
decode_setup(PyObject *self, PyObject *args)
{
    PyObject *l, *f, *p, *t, *o;
    if (!PyArg_ParseTuple(args, "OOOO!O!", &l, &f, &p, &PyType_Type, &t, &PyDict_Type, &o))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)t, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "the event type must be a tuple subclass");
        return NULL;
    }
    Py_XSETREF(db_loads, Py_NewRef(l));
    Py_XSETREF(db_fallback, Py_NewRef(f));
    Py_XSETREF(db_poison_type, Py_NewRef(p));
    Py_XSETREF(db_event_type, (PyTypeObject *)Py_NewRef(t));
    Py_XSETREF(db_ops, Py_NewRef(o));
    if (db_one == NULL && (db_one = PyLong_FromLong(1)) == NULL)
        return NULL;
    Py_RETURN_NONE;
}

#define RECORD_FIELDS 7  /* a LogRecord: topic, partition, offset, key, value, timestamp_ms, headers */

/* A LogRecord of `fields`, whose references it takes (each one is dropped either way); NULL with
 * the error set when a field is NULL (its making failed) or the allocation does. */
static PyObject *
record_of(PyTypeObject *record_type, PyObject **fields)
{
    PyObject *record = NULL;
    int complete = 1;
    for (int f = 0; f < RECORD_FIELDS; f++)
        complete = complete && fields[f] != NULL;
    if (complete && (record = record_type->tp_alloc(record_type, RECORD_FIELDS)) != NULL) {
        for (int f = 0; f < RECORD_FIELDS; f++) {
            PyTuple_SET_ITEM(record, f, fields[f]);
            fields[f] = NULL;
        }
    }
    for (int f = 0; f < RECORD_FIELDS; f++)
        Py_XDECREF(fields[f]);
    return record;
}

/* One record of decode_batch / decode_packed: its SinkEvent appended to `events`, or, where the C
 * decoder leaves it to the general one (decode_record) and that refuses it as poison,
 * (record, the error) appended to `poisons`. 0, or -1 with an error set (any other error). */
static int db_general(PyObject *record, PyObject *events, PyObject *poisons);

static int
db_take(PyObject *record, int raw, Scratch *x, PyObject *events, PyObject *poisons)
{
    HeadersRef headers;
    PyObject *const *fields = record_fields(record, &headers);
    if (fields == NULL)
        return -1;
    PyObject *event = decode_one(fields, &headers, db_event_type, db_ops, db_loads, raw, x);
    if (event == Py_None) {
        Py_DECREF(event);
        return db_general(record, events, poisons);
    }
    if (event == NULL)
        return -1;
    int appended = PyList_Append(events, event);
    Py_DECREF(event);
    return appended;
}

/* The general way (decode_record) for a record the C decoder leaves to it. */
static int
db_general(PyObject *record, PyObject *events, PyObject *poisons)
{
    PyObject *event = PyObject_CallOneArg(db_fallback, record);
    if (event == NULL && PyErr_ExceptionMatches(db_poison_type)) {
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL)
            PyException_SetTraceback(exc, tb);
        PyObject *pair = PyTuple_Pack(2, record, exc);
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
        int kept = pair != NULL && PyList_Append(poisons, pair) == 0;
        Py_XDECREF(pair);
        return kept ? 0 : -1;
    }
    if (event == NULL)
        return -1;
    int appended = PyList_Append(events, event);
    Py_DECREF(event);
    return appended;
}

static PyObject *
speedups_decode_batch(PyObject *self, PyObject *args)
{
    PyObject *records, *ends;
    int raw = 0;
    if (!PyArg_ParseTuple(args, "O!O!|p", &PyList_Type, &records, &PyDict_Type, &ends, &raw))
        return NULL;
    if (db_loads == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cdc._speedups.decode_setup was not called");
        return NULL;
    }
    PyObject *events = PyList_New(0), *poisons = PyList_New(0);
    long long nbytes = 0;
    Scratch x;
    memset(&x, 0, sizeof(x));
    if (events == NULL || poisons == NULL)
        goto fail;
    Py_INCREF(records);  /* the list may not change under us (a callback could) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        Py_INCREF(record);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 5) {
            PyErr_SetString(PyExc_TypeError, "decode_batch takes LogRecords");
            goto fail_record;
        }
        PyObject *topic = PyTuple_GET_ITEM(record, 0), *partition = PyTuple_GET_ITEM(record, 1);
        PyObject *offset = PyTuple_GET_ITEM(record, 2), *value_data = PyTuple_GET_ITEM(record, 4);
        PyObject *where = PyTuple_Pack(2, topic, partition);
        PyObject *next = where ? PyNumber_Add(offset, db_one) : NULL;
        int stored = next ? PyDict_SetItem(ends, where, next) : -1;
        Py_XDECREF(where);
        Py_XDECREF(next);
        if (stored < 0)
            goto fail_record;
        if (value_data != Py_None) {
            Py_ssize_t size = PyObject_Length(value_data);
            if (size < 0)
                goto fail_record;
            nbytes += size;
        }
        if (db_take(record, raw, &x, events, poisons) < 0)
            goto fail_record;
        Py_DECREF(record);
        continue;
    fail_record:
        Py_DECREF(record);
        Py_DECREF(records);
        goto fail;
    }
    Py_DECREF(records);
    scratch_free(&x);
    return Py_BuildValue("(NNL)", events, poisons, nbytes);
fail:
    scratch_free(&x);
    Py_XDECREF(events);
    Py_XDECREF(poisons);
    return NULL;
}

/* decode_packed(data, count, topics, ends, raw, LogRecord) -> (events, poisons, bytes of values)
 *   decode_batch over a batch of the bulk reader (cdc/_rdconsume.c: `count` records packed in
 *   `data`, each a 36-byte head then its key's, value's and headers' bytes; `topics` the names
 *   its topic indexes point into): no confluent-kafka Message per record, and the LogRecord made here is dropped
 *   once its event is made (kept only in a poison pair). `ends` gets each partition's next offset,
 *   once per run of records of one partition. */
#define PACKED_HEAD 36  /* cdc/_rdconsume.c's HEADER */

static int
packed_end(PyObject *ends, PyObject *topic, int partition, long long offset)
{
    PyObject *where = Py_BuildValue("(Oi)", topic, partition);
    PyObject *next = where ? PyLong_FromLongLong(offset + 1) : NULL;
    int stored = next ? PyDict_SetItem(ends, where, next) : -1;
    Py_XDECREF(where);
    Py_XDECREF(next);
    return stored;
}

static PyObject *
speedups_decode_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1]) || !PyList_Check(args[2]) ||
            !PyDict_Check(args[3]) || !PyType_Check(args[5]) ||
            !PyType_IsSubtype((PyTypeObject *)args[5], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "decode_packed(data, count, topics, ends, raw, LogRecord)");
        return NULL;
    }
    if (db_loads == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cdc._speedups.decode_setup was not called");
        return NULL;
    }
    PyObject *data = args[0], *topics = args[2], *ends = args[3];
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    int raw = PyObject_IsTrue(args[4]);
    PyTypeObject *record_type = (PyTypeObject *)args[5];
    if (count < 0 || raw < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "decode_packed: a negative count");
        return NULL;
    }
    const char *at = PyBytes_AS_STRING(data), *end = at + PyBytes_GET_SIZE(data);
    PyObject *events = PyList_New(0), *poisons = PyList_New(0);
    long long nbytes = 0;
    Scratch x;
    memset(&x, 0, sizeof(x));
    PyObject *run_topic = NULL;  /* the partition of the run of records read last, and its last offset */
    int run_partition = 0;
    long long run_offset = -1;
    if (events == NULL || poisons == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t topic_index, partition, key_len, value_len, headers_len;
        int64_t offset, timestamp;
        if (end - at < PACKED_HEAD) goto short_data;
        memcpy(&topic_index, at, 4);
        memcpy(&partition, at + 4, 4);
        memcpy(&offset, at + 8, 8);
        memcpy(&timestamp, at + 16, 8);
        memcpy(&key_len, at + 24, 4);
        memcpy(&value_len, at + 28, 4);
        memcpy(&headers_len, at + 32, 4);
        at += PACKED_HEAD;
        if (topic_index < 0 || topic_index >= PyList_GET_SIZE(topics) ||
                end - at < (Py_ssize_t)(key_len > 0 ? key_len : 0) + (value_len > 0 ? value_len : 0)
                           + (headers_len > 0 ? headers_len : 0))
            goto short_data;
        PyObject *topic = PyList_GET_ITEM(topics, topic_index);
        if (run_topic != NULL && (run_topic != topic || run_partition != partition)) {
            if (packed_end(ends, run_topic, run_partition, run_offset) < 0)
                goto fail;
        }
        run_topic = topic;
        run_partition = partition;
        run_offset = offset;
        PyObject *fields[RECORD_FIELDS] = {
            Py_NewRef(topic), PyLong_FromLong(partition), PyLong_FromLongLong(offset),
            key_len < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize(at, key_len), NULL,
            PyLong_FromLongLong(timestamp), Py_NewRef(Py_None)};
        at += key_len > 0 ? key_len : 0;
        fields[4] = value_len < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize(at, value_len);
        at += value_len > 0 ? value_len : 0;
        if (value_len > 0)
            nbytes += value_len;
        HeadersRef headers = {NULL, headers_len < 0 ? NULL : at, headers_len < 0 ? 0 : headers_len};
        at += headers_len > 0 ? headers_len : 0;
        /* The record's LogRecord is made only for the general way (a record the C decoder leaves to
         * decode_record, or poison): the common record's event takes its fields as they are, and
         * only a tombstone's headers are read (for its version), where they lie. */
        int taken;
        PyObject *event = NULL;
        int complete = 1;
        for (int f = 0; f < RECORD_FIELDS; f++)
            complete = complete && fields[f] != NULL;
        if (complete)
            event = decode_one(fields, &headers, db_event_type, db_ops, db_loads, raw, &x);
        if (event != NULL && event != Py_None) {
            taken = PyList_Append(events, event);
            Py_DECREF(event);
            for (int f = 0; f < RECORD_FIELDS; f++)
                Py_DECREF(fields[f]);
        } else if (event == NULL && complete) {
            for (int f = 0; f < RECORD_FIELDS; f++)
                Py_DECREF(fields[f]);
            goto fail;
        } else {
            Py_XDECREF(event);
            if (fields[6] != NULL && headers.packed != NULL)
                Py_SETREF(fields[6], packed_headers_list(headers.packed, headers.packed_len));
            PyObject *record = record_of(record_type, fields);  /* takes the fields, NULL if one is */
            if (record == NULL)
                goto fail;
            taken = db_general(record, events, poisons);
            Py_DECREF(record);
        }
        if (taken < 0)
            goto fail;
    }
    if (run_topic != NULL && packed_end(ends, run_topic, run_partition, run_offset) < 0)
        goto fail;
    scratch_free(&x);
    return Py_BuildValue("(NNL)", events, poisons, nbytes);
short_data:
    PyErr_SetString(PyExc_ValueError, "decode_packed: the data ends inside a record (not a packed batch?)");
fail:
    scratch_free(&x);
    Py_XDECREF(events);
    Py_XDECREF(poisons);
    return NULL;
}

/* split_by_schema(events) -> parts, or None
 *   cdc.schema_order.split_by_schema's loop: `events` (SinkEvents) cut where a topic's
 *   source["schema_version"] changes, so that each part has one shape per topic; an event whose
 *   source is empty or names no shape never cuts. None (the Python loop decides) for anything
 *   but a list of SinkEvent-like tuples whose sources are dicts or empty. */
static PyObject *split_version_key = NULL;

static PyObject *
speedups_split_by_schema(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "split_by_schema(events: list)");
        return NULL;
    }
    if (split_version_key == NULL && (split_version_key = PyUnicode_InternFromString("schema_version")) == NULL)
        return NULL;
    PyObject *events = args[0];
    Py_ssize_t count = PyList_GET_SIZE(events), start = 0;
    PyObject *parts = PyList_New(0), *shapes = PyDict_New();
    if (parts == NULL || shapes == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *event = PyList_GET_ITEM(events, i);
        if (!PyTuple_Check(event) || PyTuple_GET_SIZE(event) < 9)
            goto python;
        PyObject *topic = PyTuple_GET_ITEM(event, 0), *source = PyTuple_GET_ITEM(event, 8);
        if (source == Py_None)
            continue;
        if (!PyDict_CheckExact(source))
            goto python;
        if (PyDict_GET_SIZE(source) == 0)
            continue;
        PyObject *version = PyDict_GetItemWithError(source, split_version_key);  /* borrowed */
        if (version == NULL) {
            if (PyErr_Occurred()) goto fail;
            continue;
        }
        if (version == Py_None)
            continue;
        PyObject *seen = PyDict_GetItemWithError(shapes, topic);  /* borrowed */
        if (seen == NULL && PyErr_Occurred())
            goto fail;
        if (seen != NULL && seen != Py_None) {
            int differs = PyObject_RichCompareBool(seen, version, Py_NE);
            if (differs < 0) goto fail;
            if (differs) {
                PyObject *part = PyList_GetSlice(events, start, i);
                int appended = part != NULL && PyList_Append(parts, part) == 0;
                Py_XDECREF(part);
                if (!appended) goto fail;
                start = i;
                PyDict_Clear(shapes);
            }
        }
        if (PyDict_SetItem(shapes, topic, version) < 0)
            goto fail;
    }
    PyObject *last = PyList_GetSlice(events, start, count);
    int appended = last != NULL && PyList_Append(parts, last) == 0;
    Py_XDECREF(last);
    if (!appended) goto fail;
    Py_DECREF(shapes);
    return parts;
python:
    Py_DECREF(parts);
    Py_DECREF(shapes);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(parts);
    Py_XDECREF(shapes);
    return NULL;
}


/* ---- log_records: cdc.log.kafka.log_records's loop (confluent-kafka Messages -> LogRecords) ----
 *
 * log_records(messages, start, out, LogRecord) -> the index of the first message from `start` on
 * that carries an error (len(messages) if none); the records of the messages before it are
 * appended to `out`. The caller handles that message (end of partition, a transient error, ...)
 * in Python and calls again after it. */

static PyObject *db_m_error, *db_m_topic, *db_m_partition, *db_m_offset, *db_m_key, *db_m_value, *db_m_timestamp,
    *db_m_headers;

static PyObject *
db_call0(PyObject *obj, PyObject *name)
{
    return PyObject_CallMethodNoArgs(obj, name);
}

static PyObject *
speedups_log_records(PyObject *self, PyObject *args)
{
    PyObject *messages, *out, *type;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!nO!O!", &PyList_Type, &messages, &start, &PyList_Type, &out, &PyType_Type, &type))
        return NULL;
    if (db_m_error == NULL) {
        db_m_error = PyUnicode_InternFromString("error");
        db_m_topic = PyUnicode_InternFromString("topic");
        db_m_partition = PyUnicode_InternFromString("partition");
        db_m_offset = PyUnicode_InternFromString("offset");
        db_m_key = PyUnicode_InternFromString("key");
        db_m_value = PyUnicode_InternFromString("value");
        db_m_timestamp = PyUnicode_InternFromString("timestamp");
        db_m_headers = PyUnicode_InternFromString("headers");
        if (!db_m_error || !db_m_topic || !db_m_partition || !db_m_offset || !db_m_key || !db_m_value || !db_m_timestamp
                || !db_m_headers)
            return NULL;
    }
    PyTypeObject *record_type = (PyTypeObject *)type;
    Py_ssize_t i = start < 0 ? 0 : start;
    if (i > PyList_GET_SIZE(messages))
        i = PyList_GET_SIZE(messages);
    for (; i < PyList_GET_SIZE(messages); i++) {
        PyObject *msg = PyList_GET_ITEM(messages, i);
        Py_INCREF(msg);
        PyObject *err = db_call0(msg, db_m_error);
        if (err == NULL)
            goto fail;
        Py_DECREF(err);
        if (err != Py_None) {
            Py_DECREF(msg);
            break;
        }
        PyObject *fields[RECORD_FIELDS] = {db_call0(msg, db_m_topic), db_call0(msg, db_m_partition),
                                           db_call0(msg, db_m_offset), db_call0(msg, db_m_key), db_call0(msg, db_m_value),
                                           NULL, db_call0(msg, db_m_headers)};
        PyObject *stamp = db_call0(msg, db_m_timestamp);
        if (stamp != NULL && PyTuple_Check(stamp) && PyTuple_GET_SIZE(stamp) == 2)
            fields[5] = Py_NewRef(PyTuple_GET_ITEM(stamp, 1));
        else if (stamp != NULL)
            PyErr_SetString(PyExc_TypeError, "Message.timestamp() is not a pair");
        Py_XDECREF(stamp);
        PyObject *record = record_of(record_type, fields);
        int appended = record != NULL && PyList_Append(out, record) == 0;
        Py_XDECREF(record);
        if (!appended)
            goto fail;
        Py_DECREF(msg);
        continue;
    fail:
        Py_DECREF(msg);
        return NULL;
    }
    return PyLong_FromSsize_t(i);
}

/* emit_rows(block, emit, when_room, topic, value_head, value_tail, key_head, key_tail, headers) -> bytes of values made
 *   The records of a block of snapshot rows (cdc.events.RowBlock) straight from its lines, with no
 *   event, dict or Fragment in between: each line `<key text>\t<row JSON>[\t...]\n` becomes
 *   emit(topic, value_head + row JSON + value_tail, key_head + key text + key_tail, headers),
 *   or when_room(...) on BufferError (the rows share a version, so every record the same headers). The block's maker checked its lines (RowBlock's docstring); a line without a tab
 *   here is a TypeError before anything of the block is handed over. A failure of emit propagates
 *   with the records before it handed over (the writer then never reports anything after them safe). */
static PyObject *
speedups_emit_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
    {"unpack_headers", speedups_unpack_headers, METH_O, "unpack_headers(data) -> cdc.headers.unpack(data)"},
    {"produce_positionally", speedups_produce_positionally, METH_O,
     "produce_positionally(Producer.produce) -> produce(topic, value, key, headers=None)"},
    {"pack_headers", speedups_pack_headers, METH_O, "pack_headers(headers) -> cdc.headers.pack(headers)"},
    {"log_records", speedups_log_records, METH_VARARGS,
     "log_records(messages, start, out, LogRecord) -> index of the first message with an error"},
    {"decode_setup", decode_setup, METH_VARARGS, "decode_setup(loads, decode_record, PoisonRecord, SinkEvent, ops)"},
    {"decode_batch", speedups_decode_batch, METH_VARARGS,
     "decode_batch(records, ends, raw_rows=False) -> (events, [(record, PoisonRecord)], bytes of values)"},
    {"decode_packed", (PyCFunction)(void (*)(void))speedups_decode_packed, METH_FASTCALL,
     "decode_packed(data, count, topics, ends, raw_rows, LogRecord) -> decode_batch's answer for a packed batch"},
    {"split_by_schema", (PyCFunction)(void (*)(void))speedups_split_by_schema, METH_FASTCALL,
     "split_by_schema(events) -> cdc.schema_order.split_by_schema's parts, or None (the Python loop decides)"},
    {"setup", speedups_setup, METH_VARARGS, "setup(dumps, Op.TRUNCATE, Op.DELETE, truncate_key)"},
    {"emit", (PyCFunction)(void (*)(void))speedups_emit, METH_FASTCALL,
     "emit(middle, events, emit, when_room, everywhere, now_ms, where, source_header) -> bytes of values made"},
    {"emit_rows", (PyCFunction)(void (*)(void))speedups_emit_rows, METH_FASTCALL,
     "emit_rows(block, emit, when_room, topic, value_head, value_tail, key_head, key_tail, headers) -> bytes of values made"},
    {"decode_envelopes", (PyCFunction)(void (*)(void))speedups_decode_envelopes, METH_FASTCALL,
     "decode_envelopes(records, SinkEvent, ops, loads, raw=True) -> per record a SinkEvent or None"},
    {"copy_rows", (PyCFunction)(void (*)(void))speedups_copy_rows, METH_FASTCALL,
     "copy_rows(pairs, names, kinds, nested, rest) -> COPY text of the (key JSON, event) pairs with JSON bytes"},
    {"unknown_names", (PyCFunction)(void (*)(void))speedups_unknown_names, METH_FASTCALL,
     "unknown_names(afters, names, loads) -> set of member names not in names"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._speedups", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "VERSION_HEADER", VERSION_HEADER) < 0)
        Py_CLEAR(m);
    return m;
}
