/* Sink decoding: plain json envelopes read without building their rows (issue #18), for
 * cdc/sink_events.py (its Python loops are the reference; tests/unit/test_sink_decode_batch.py and
 * test_raw_rows.py compare), and the cut of a batch by shape (cdc/schema_order.py).
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <stdint.h>

#include "_jsonscan.h"
#include "_logrecord.h"

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
py_decode_envelopes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
py_decode_batch(PyObject *self, PyObject *args)
{
    PyObject *records, *ends;
    int raw = 0;
    if (!PyArg_ParseTuple(args, "O!O!|p", &PyList_Type, &records, &PyDict_Type, &ends, &raw))
        return NULL;
    if (db_loads == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cdc._decode.decode_setup was not called");
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
py_decode_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1]) || !PyList_Check(args[2]) ||
            !PyDict_Check(args[3]) || !PyType_Check(args[5]) ||
            !PyType_IsSubtype((PyTypeObject *)args[5], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "decode_packed(data, count, topics, ends, raw, LogRecord)");
        return NULL;
    }
    if (db_loads == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cdc._decode.decode_setup was not called");
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
        PackedHead h;
        if (!packed_head(&at, end, &h)) goto short_data;
        int32_t topic_index = h.topic, partition = h.partition, key_len = h.key_len, value_len = h.value_len,
                headers_len = h.headers_len;
        int64_t offset = h.offset, timestamp = h.timestamp;
        if (topic_index < 0 || topic_index >= PyList_GET_SIZE(topics) || end - at < packed_body(&h))
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
py_split_by_schema(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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

static PyMethodDef methods[] = {
    {"decode_setup", decode_setup, METH_VARARGS, "decode_setup(loads, decode_record, PoisonRecord, SinkEvent, ops)"},
    {"decode_batch", py_decode_batch, METH_VARARGS,
     "decode_batch(records, ends, raw_rows=False) -> (events, [(record, PoisonRecord)], bytes of values)"},
    {"decode_packed", (PyCFunction)(void (*)(void))py_decode_packed, METH_FASTCALL,
     "decode_packed(data, count, topics, ends, raw_rows, LogRecord) -> decode_batch's answer for a packed batch"},
    {"decode_envelopes", (PyCFunction)(void (*)(void))py_decode_envelopes, METH_FASTCALL,
     "decode_envelopes(records, SinkEvent, ops, loads, raw=True) -> per record a SinkEvent or None"},
    {"split_by_schema", (PyCFunction)(void (*)(void))py_split_by_schema, METH_FASTCALL,
     "split_by_schema(events) -> cdc.schema_order.split_by_schema's parts, or None (the Python loop decides)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._decode", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__decode(void)
{
    return PyModule_Create(&module);
}
