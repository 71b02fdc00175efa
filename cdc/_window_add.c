/* The window's add and add_packed (cdc/_window.c): records into the window, in order. */
#include "_window.h"
#include "_logrecord.h"

typedef struct {
    const char *key, *value;
    Py_ssize_t key_len, value_len;
    int64_t offset;
    int32_t topic, partition;
    char fallback;
    char versioned;   /* a tombstone whose cdc.version header gives its delete's version */
    int64_t version;
    PyObject *topic_name;  /* borrowed; NULL: the record named none the window could read */
} Item;

/* A cdc.version header's value (cdc/headers.py, version_of: "-" then 1 to 19 ASCII digits, an
 * int64): 1 and *version, 0 when it is not that. */
static int
decimal_version(const unsigned char *p, Py_ssize_t len, int64_t *version)
{
    int negative = len > 0 && p[0] == '-';
    p += negative;
    len -= negative;
    if (len < 1 || len > 19) return 0;
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX + negative) return 0;
    *version = negative ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

static int32_t
le32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* The last cdc.version header among headers packed as cdc/log/packed_headers.py packs them:
 * 1 and *version, 0 when there is none, -1 when the bytes or the value are not what they should
 * be (the general decoder then names the fault). */
static int
packed_version(const unsigned char *p, Py_ssize_t len, int64_t *version)
{
    const unsigned char *end = p + len, *value = NULL;
    int32_t value_len = 0;
    int seen = 0;
    while (p < end) {
        if (end - p < 4) return -1;
        int32_t name_len = le32(p);
        p += 4;
        if (name_len < 0 || end - p < name_len + 4) return -1;
        const unsigned char *name = p;
        p += name_len;
        int32_t n = le32(p);
        p += 4;
        if (n < -1 || end - p < (n > 0 ? n : 0)) return -1;
        if (name_len == 11 && memcmp(name, "cdc.version", 11) == 0) {
            seen = 1;
            value = n < 0 ? NULL : p;
            value_len = n;
        }
        p += n > 0 ? n : 0;
    }
    if (!seen) return 0;
    return value != NULL && decimal_version(value, value_len, version) ? 1 : -1;
}

/* As packed_version, for headers as a list of (name, value) pairs (a LogRecord's). */
static int
listed_version(PyObject *headers, int64_t *version)
{
    if (!PyList_Check(headers)) return -1;
    PyObject *value = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        PyObject *pair = PyList_GET_ITEM(headers, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)))
            return -1;
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(pair, 0), "cdc.version") == 0)
            value = PyTuple_GET_ITEM(pair, 1);
    }
    if (value == NULL) return 0;
    if (!PyBytes_Check(value)) return -1;
    return decimal_version((const unsigned char *)PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value), version) ? 1
                                                                                                                : -1;
}

/* A tombstone's headers read: versioned and its version set, or fallback where they are not
 * readable here. */
static void
tombstone_headers(Item *it, int found, int64_t version)
{
    if (found < 0) it->fallback = 1;
    it->versioned = found > 0;
    it->version = version;
}

static PyObject *reduce_items(Window *w, Item *items, Py_ssize_t n, PyObject *ends, PyObject *resolve);

/* The topic id of `topic` in `topics` ({name: id}), added if new; -1 with an exception set. */
static Py_ssize_t
topic_id(Window *w, PyObject *topics, PyObject *topic)
{
    PyObject *id = PyDict_GetItemWithError(topics, topic);
    if (id == NULL) {
        if (PyErr_Occurred()) return -1;
        id = PyLong_FromSsize_t(PyDict_GET_SIZE(topics));
        if (id == NULL || PyDict_SetItem(topics, topic, id) < 0) { Py_XDECREF(id); return -1; }
        Py_DECREF(id);
    }
    Py_ssize_t tid = PyLong_AsSsize_t(id);
    if (tid < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a topic id is >= 0");
        return -1;
    }
    return window_ensure_topics(w, tid + 1) ? tid : -1;
}

PyObject *
window_add(Window *w, PyObject *args)
{
    PyObject *records, *topics, *ends, *resolve;
    if (!PyArg_ParseTuple(args, "O!O!O!O", &PyList_Type, &records, &PyDict_Type, &topics, &PyDict_Type, &ends,
                          &resolve))
        return NULL;
    if (!window_enter(w)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *result = NULL;
    Item *items = PyMem_Calloc(n ? n : 1, sizeof(Item));
    Py_INCREF(records);  /* its bytes are read without the GIL: they stay alive meanwhile */
    if (items == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        Item *it = &items[i];
        it->fallback = 1;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 5) continue;
        PyObject *topic = PyTuple_GET_ITEM(r, 0), *key = PyTuple_GET_ITEM(r, 3), *value = PyTuple_GET_ITEM(r, 4);
        Py_ssize_t tid = topic_id(w, topics, topic);
        if (tid < 0) goto done;
        long partition = PyLong_AsLong(PyTuple_GET_ITEM(r, 1));
        long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 2));
        if (PyErr_Occurred()) { PyErr_Clear(); continue; }
        it->topic = (int32_t)tid;
        it->partition = (int32_t)partition;
        it->offset = offset;
        it->topic_name = topic;
        if (!PyBytes_Check(key) || (value != Py_None && !PyBytes_Check(value))) continue;
        it->key = PyBytes_AS_STRING(key);
        it->key_len = PyBytes_GET_SIZE(key);
        it->value = value == Py_None ? NULL : PyBytes_AS_STRING(value);
        it->value_len = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
        w->read_bytes += it->value_len;
        it->fallback = 0;
        /* a tombstone with headers may carry its delete's version */
        if (value == Py_None && PyTuple_GET_SIZE(r) > 6 && PyTuple_GET_ITEM(r, 6) != Py_None) {
            int64_t version = 0;
            int found = listed_version(PyTuple_GET_ITEM(r, 6), &version);
            tombstone_headers(it, found, version);
        }
    }
    result = reduce_items(w, items, n, ends, resolve);
done:
    Py_DECREF(records);
    PyMem_Free(items);
    w->busy = 0;
    return result;
}

/* add_packed(data, count, names, topics, ends, resolve): as add, for `count` records packed in
 * `data` as cdc/_rdconsume.c's Reader.read packs them (a 36-byte header, then the key's, the
 * value's and the headers' bytes), whose topic indexes name `names`. */
PyObject *
window_add_packed(Window *w, PyObject *args)
{
    PyObject *data, *names, *topics, *ends, *resolve;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!nO!O!O!O", &PyBytes_Type, &data, &n, &PyList_Type, &names, &PyDict_Type, &topics,
                          &PyDict_Type, &ends, &resolve))
        return NULL;
    if (!window_enter(w)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t nnames = PyList_GET_SIZE(names);
    Item *items = PyMem_Calloc(n > 0 ? n : 1, sizeof(Item));
    Py_ssize_t *tids = PyMem_Calloc(nnames ? nnames : 1, sizeof(Py_ssize_t));
    Py_INCREF(data);
    Py_INCREF(names);
    if (items == NULL || tids == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t t = 0; t < nnames; t++)
        if ((tids[t] = topic_id(w, topics, PyList_GET_ITEM(names, t))) < 0) goto done;
    const char *p = PyBytes_AS_STRING(data), *end = p + PyBytes_GET_SIZE(data);
    for (Py_ssize_t i = 0; i < n; i++) {
        PackedHead h;
        if (!packed_head(&p, end, &h)) goto damaged;
        int32_t topic = h.topic, partition = h.partition, key_len = h.key_len, value_len = h.value_len,
                headers_len = h.headers_len;
        int64_t offset = h.offset;
        if (topic < 0 || topic >= nnames || key_len < -1 || value_len < -1 || headers_len < -1
                || end - p < packed_body(&h))
            goto damaged;
        Item *it = &items[i];
        it->topic = (int32_t)tids[topic];
        it->topic_name = PyList_GET_ITEM(names, topic);
        it->partition = partition;
        it->offset = offset;
        it->key = key_len < 0 ? NULL : p;
        it->key_len = key_len < 0 ? 0 : key_len;
        p += it->key_len;
        it->value = value_len < 0 ? NULL : p;
        it->value_len = value_len < 0 ? 0 : value_len;
        p += it->value_len;
        w->read_bytes += it->value_len;
        /* a record without a key: the general decoder names it */
        it->fallback = it->key == NULL;
        /* a tombstone with headers may carry its delete's version */
        if (value_len < 0 && headers_len >= 0) {
            int64_t version = 0;
            int found = packed_version((const unsigned char *)p, headers_len, &version);
            tombstone_headers(it, found, version);
        }
        p += headers_len > 0 ? headers_len : 0;
    }
    result = reduce_items(w, items, n, ends, resolve);
    goto done;
damaged:
    PyErr_SetString(PyExc_ValueError, "add_packed: the data is not `count` packed records");
done:
    Py_DECREF(data);
    Py_DECREF(names);
    PyMem_Free(items);
    PyMem_Free(tids);
    w->busy = 0;
    return result;
}

/* The records of `items` into the window, in order (see add). */
static PyObject *
reduce_items(Window *w, Item *items, Py_ssize_t n, PyObject *ends, PyObject *resolve)
{
    PyObject *result = NULL;
    int oom = 0;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_BEGIN_ALLOW_THREADS
        for (; i < n && !oom; i++) {
            Item *it = &items[i];
            if (it->fallback) break;
            if (!window_compact_key((const unsigned char *)it->key, it->key_len)) { it->fallback = 1; break; }
            if (it->value == NULL) {  /* a tombstone: with its delete's version, that delete */
                oom = !window_apply(w, it->topic, it->key, it->key_len, it->versioned ? 'd' : 0, it->version, NULL,
                                    0, NO_SCHEMA, it->partition, it->offset);
                continue;
            }
            Envelope env;
            if (!window_parse_envelope((const unsigned char *)it->value, it->value_len, &env)) {
                it->fallback = 1;
                break;
            }
            oom = !window_apply(w, it->topic, it->key, it->key_len, env.op, env.version, (const char *)env.row,
                                env.row_len, env.schema_version, it->partition, it->offset);
        }
        Py_END_ALLOW_THREADS
        if (oom || i >= n) break;
        /* A record for the general decoder, in its place (a tombstone's effect depends on order):
         * resolve(index) -> None (nothing to keep: poison), or (topic id, key JSON, op, version, row,
         * schema_version) with op "c" "u" "r" "d", None (a tombstone) or "t" (a truncate). */
        PyObject *index = PyLong_FromSsize_t(i);
        PyObject *action = index ? PyObject_CallOneArg(resolve, index) : NULL;
        Py_XDECREF(index);
        if (action == NULL) goto done;
        if (action != Py_None) {
            Py_ssize_t tid, key_len = 0, row_len = 0;
            const char *key = NULL, *op = NULL, *row = NULL;
            long long version = 0;
            PyObject *schema;
            if (!PyArg_ParseTuple(action, "ny#zLz#O", &tid, &key, &key_len, &op, &version, &row, &row_len, &schema)
                    || tid < 0 || !window_ensure_topics(w, tid + 1)) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a topic id is >= 0");
                Py_DECREF(action);
                goto done;
            }
            int64_t schema_version = NO_SCHEMA;
            if (schema != Py_None && (schema_version = PyLong_AsLongLong(schema)) == -1 && PyErr_Occurred()) {
                Py_DECREF(action);
                goto done;
            }
            if (op != NULL && op[0] == 't') {
                window_truncate_topic(w, tid, version);
            } else {
                oom = !window_apply(w, (int32_t)tid, key, key_len, op ? op[0] : 0, version, row, row_len,
                                    schema_version, items[i].partition, items[i].offset);
            }
        }
        Py_DECREF(action);
        i++;
    }
    if (oom) { PyErr_NoMemory(); goto done; }
    /* ends[(topic, partition)]: the offset after each partition's last record (from the back:
     * a partition's records are in order, and a batch has few partitions) */
    int32_t seen_topic[64], seen_partition[64];
    Py_ssize_t seen_count = 0;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        if (items[i].topic_name == NULL) continue;
        int seen = 0;
        for (Py_ssize_t j = 0; j < seen_count && !seen; j++)
            seen = seen_topic[j] == items[i].topic && seen_partition[j] == items[i].partition;
        if (seen) continue;
        PyObject *partition = PyLong_FromLong(items[i].partition);
        PyObject *tp = partition ? PyTuple_Pack(2, items[i].topic_name, partition) : NULL;
        Py_XDECREF(partition);
        PyObject *end = PyLong_FromLongLong(items[i].offset + 1);
        int ok = tp != NULL && end != NULL;
        if (ok && seen_count == 64) {  /* more partitions than that: keep the greatest end */
            PyObject *had = PyDict_GetItemWithError(ends, tp);
            ok = !PyErr_Occurred();
            if (ok && had != NULL && PyLong_AsLongLong(had) >= items[i].offset + 1) {
                Py_DECREF(tp);
                Py_DECREF(end);
                continue;
            }
        } else if (ok) {
            seen_topic[seen_count] = items[i].topic;
            seen_partition[seen_count++] = items[i].partition;
        }
        ok = ok && PyDict_SetItem(ends, tp, end) == 0;
        Py_XDECREF(tp);
        Py_XDECREF(end);
        if (!ok) goto done;
    }
    result = Py_NewRef(Py_None);
done:
    return result;
}
