/* The one parser of a record on the sink side (decode_one, see cdc/_decode.c): the envelope, its
 * key, its source block and a tombstone's headers. */
#include "_decode.h"
#include "_logrecord.h"

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

void
decode_scratch_free(Scratch *x)
{
    PyMem_Free(x->m.items);
    PyMem_Free(x->sm.items);
    PyMem_Free(x->km.items);
    source_cache_clear(&x->cache);
    source_cache_clear(&x->key_cache);
}

/* The SinkEvent of one record (its fields: topic, partition, offset, key, value; a new reference),
 * Py_None when the general path must decide, or NULL with an error that is not the record's. The
 * one parser of the json envelope on the sink side: `raw` leaves an upsert's after as the bytes
 * of the row object, else loads makes its dict (decode_batch, decode_packed, decode_envelopes). */
PyObject *
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
