/* The newest version per key over a window of log records, in C (cdc/bulk_window.py).
 *
 * A bulk load of a fresh generation (cdc/runtime/sink_runner.py, "bulk rebuild") reads the topics
 * from offset 0 and keeps, per (topic, key), only the record with the highest source.version, by
 * version and never by offset (a replay after a crash can put an older version at a later
 * offset). This is cdc/sink_events.py's decoding and sinks' per-batch reduction (e.g.
 * sinks/sql/reduce.py) for the common record, done without the GIL and without a Python object
 * per record: each record's key and value are parsed in place, and the window copies only the
 * key and the newest row's bytes.
 *
 * Window(SinkEvent, ops)            ops: {"c": Op.CREATE, ...}
 * add(records, topics, ends, resolve)
 *                                   records: LogRecords (topic, partition, offset, key, value, ...);
 *                                   topics: {topic: id}, ids added for new topics; ends[(topic,
 *                                   partition)]: set to the offset after its last record. A record
 *                                   it does not take (see below) is handed to resolve(index), in its
 *                                   place in the order, which decodes it the general way and says
 *                                   what to keep (see window_add).
 * add_packed(data, count, names, topics, ends, resolve)
 *                                   the same for `count` records packed in `data` (bytes) as
 *                                   cdc/_rdconsume.c packs them, topic indexes into `names`
 * truncate(topic_id, version)       drops what is older; later records older than it are ignored
 * stats() -> (keys, bytes, read)    what the window holds (bytes: keys, rows and bookkeeping), and
 *                                   the bytes of the values of the records it took
 * shapes(topic_id) -> [schema_version or None]
 * take(topic_id, schema_version, topic, source, loads, start, limit) -> (upserts, deletes, next)
 *                                   at most `limit` of the keys from entry `start` on (next: where
 *                                   to go on, -1 at the end) whose newest record names that schema version:
 *                                   [(key JSON, SinkEvent)], after/before as bytes, the key
 *                                   decoded by loads (None: left None)
 * tombstones(topic_id) -> [key JSON] keys whose last word is a tombstone
 * truncated(topic_id) -> the newest truncate's version, or None
 * key_hashes() -> bytes             the 64-bit hash of every (topic id, key) held, sorted (native
 *                                   uint64s): for hashes_meet/hashes_union below
 * clear()
 *
 * hashes_meet(a, b) -> bool         whether two sorted hash arrays share a value
 * hashes_union(a, b) -> bytes       their sorted union (a value in both once)
 *                                   (a staged bulk load, cdc/runtime/sink_runner.py, checks that a
 *                                   window holds no key an earlier window loaded: a shared hash,
 *                                   even a collision, only sends the window the guarded way)
 *
 * Per key the semantics are reduce.py's over one batch as large as the window: the newest
 * version wins; a tombstone marks the key until a newer version arrives; the result is an upsert
 * (newest r/c/u, no tombstone after it), a delete (newest d; remembered by the sink), or a
 * tombstone (the key's row, if any, goes). A tombstone whose cdc.version header (cdc/headers.py)
 * gives its delete's version is taken as that delete.
 *
 * Records it does not take, for the general decoder: a value that is not a plain JSON envelope
 * (Connect JSON, Avro, malformed: maybe poison), a tombstone whose headers are not readable or
 * whose cdc.version is not a decimal int64, a truncate, a missing or non-integer version,
 * an upsert whose after is not an object, and a key that is not JSON in orjson's compact form
 * (the key JSON is what the sink stores in remembered deletes, so it must be the bytes
 * orjson.dumps makes of the decoded key; a compact key of strings and integers already is).
 *
 * Threading: one thread uses a window at a time (a call made while another runs raises); `add`
 * releases the GIL while it parses and reduces.
 *
 * The extension's units: this one (the type, take and the module), _window_add.c (add and
 * add_packed: the reduce loop), _window_scan.c (a record's key and envelope read in place) and
 * _window_table.c (the hash table); _window.h declares what they share.
 */
#include "_window.h"

/* ---- the type ----------------------------------------------------------------------------------- */

int
window_enter(Window *w)
{
    if (w->busy) {
        PyErr_SetString(PyExc_RuntimeError, "a Window is used by one thread at a time");
        return 0;
    }
    w->busy = 1;
    return 1;
}

int
window_ensure_topics(Window *w, Py_ssize_t n)
{
    if (n <= w->ntopics) return 1;
    int64_t *t = realloc(w->truncates, (size_t)n * sizeof(int64_t));
    if (t == NULL) { PyErr_NoMemory(); return 0; }
    for (Py_ssize_t i = w->ntopics; i < n; i++) t[i] = INT64_MIN;
    w->truncates = t;
    w->ntopics = n;
    return 1;
}

static PyObject *
window_truncate(Window *w, PyObject *args)
{
    Py_ssize_t topic;
    long long version;
    if (!PyArg_ParseTuple(args, "nL", &topic, &version)) return NULL;
    if (topic < 0) { PyErr_SetString(PyExc_ValueError, "a topic id is >= 0"); return NULL; }
    if (!window_enter(w)) return NULL;
    if (!window_ensure_topics(w, topic + 1)) { w->busy = 0; return NULL; }
    window_truncate_topic(w, topic, version);
    w->busy = 0;
    Py_RETURN_NONE;
}

static PyObject *
window_stats(Window *w, PyObject *unused)
{
    return Py_BuildValue("nnL", w->count, w->bytes, w->read_bytes);
}

static PyObject *
window_shapes(Window *w, PyObject *args)
{
    Py_ssize_t topic;
    if (!PyArg_ParseTuple(args, "n", &topic)) return NULL;
    PyObject *found = PySet_New(NULL);
    for (Py_ssize_t i = 0; found != NULL && i < w->count; i++) {
        Entry *e = &w->entries[i];
        if (e->topic != topic || !e->op) continue;
        PyObject *v = e->schema_version == NO_SCHEMA ? Py_NewRef(Py_None) : PyLong_FromLongLong(e->schema_version);
        if (v == NULL || PySet_Add(found, v) < 0) Py_CLEAR(found);
        Py_XDECREF(v);
    }
    if (found == NULL) return NULL;
    PyObject *list = PySequence_List(found);
    Py_DECREF(found);
    return list;
}

/* A SinkEvent (topic, partition, offset, key, op, before, after, version, source, ts_ms). */
static PyObject *
make_event(Window *w, Entry *e, PyObject *topic, PyObject *source, PyObject *loads)
{
    PyObject *op = w->op_objects[(unsigned char)e->op];
    if (op == NULL) {
        PyErr_Format(PyExc_KeyError, "op %c", e->op);
        return NULL;
    }
    PyObject *key;
    if (loads != Py_None) {
        PyObject *bytes = PyBytes_FromStringAndSize(e->key, e->key_len);
        key = bytes ? PyObject_CallOneArg(loads, bytes) : NULL;
        Py_XDECREF(bytes);
        if (key == NULL) return NULL;
    } else {
        key = Py_NewRef(Py_None);
    }
    PyObject *row = e->row ? PyBytes_FromStringAndSize(e->row, e->row_len) : Py_NewRef(Py_None);
    PyObject *fields[10] = {Py_NewRef(topic), PyLong_FromLong(e->partition), PyLong_FromLongLong(e->offset), key,
                            Py_NewRef(op), e->op == 'd' ? row : Py_NewRef(Py_None),
                            e->op == 'd' ? Py_NewRef(Py_None) : row, PyLong_FromLongLong(e->version),
                            Py_NewRef(source), Py_NewRef(Py_None)};
    PyTypeObject *type = (PyTypeObject *)w->event_type;
    PyObject *event = NULL;
    int ok = 1;
    for (int f = 0; f < 10; f++) ok = ok && fields[f] != NULL;
    if (ok && (event = type->tp_alloc(type, 10)) != NULL) {
        for (int f = 0; f < 10; f++) {
            PyTuple_SET_ITEM(event, f, fields[f]);
            fields[f] = NULL;
        }
    }
    for (int f = 0; f < 10; f++) Py_XDECREF(fields[f]);
    return event;
}

static PyObject *
window_take(Window *w, PyObject *args)
{
    Py_ssize_t topic, start, limit;
    PyObject *schema, *topic_name, *source, *loads;
    if (!PyArg_ParseTuple(args, "nOUO!Onn", &topic, &schema, &topic_name, &PyDict_Type, &source, &loads, &start,
                          &limit))
        return NULL;
    int64_t wanted = NO_SCHEMA;
    if (schema != Py_None && (wanted = PyLong_AsLongLong(schema)) == -1 && PyErr_Occurred()) return NULL;
    PyObject *upserts = PyList_New(0), *deletes = PyList_New(0), *result = NULL;
    if (upserts == NULL || deletes == NULL) goto done;
    Py_ssize_t i = start < 0 ? 0 : start, taken = 0;
    for (; i < w->count && taken < limit; i++) {
        Entry *e = &w->entries[i];
        if (e->topic != topic || !e->op || e->schema_version != wanted) continue;
        int is_delete = e->op == 'd';
        if (!is_delete && e->tombstoned) continue;  /* the tombstone after it wins */
        PyObject *event = make_event(w, e, topic_name, source, loads);
        if (event == NULL) goto done;
        PyObject *key = PyBytes_FromStringAndSize(e->key, e->key_len);
        PyObject *pair = key ? PyTuple_Pack(2, key, event) : NULL;
        Py_XDECREF(key);
        Py_DECREF(event);
        if (pair == NULL || PyList_Append(is_delete ? deletes : upserts, pair) < 0) { Py_XDECREF(pair); goto done; }
        Py_DECREF(pair);
        taken++;
    }
    result = Py_BuildValue("OOn", upserts, deletes, i < w->count ? i : (Py_ssize_t)-1);
done:
    Py_XDECREF(upserts);
    Py_XDECREF(deletes);
    return result;
}

static PyObject *
window_tombstones(Window *w, PyObject *args)
{
    Py_ssize_t topic;
    if (!PyArg_ParseTuple(args, "n", &topic)) return NULL;
    PyObject *keys = PyList_New(0);
    for (Py_ssize_t i = 0; keys != NULL && i < w->count; i++) {
        Entry *e = &w->entries[i];
        if (e->topic != topic || !e->tombstoned) continue;
        PyObject *key = PyBytes_FromStringAndSize(e->key, e->key_len);
        if (key == NULL || PyList_Append(keys, key) < 0) Py_CLEAR(keys);
        Py_XDECREF(key);
    }
    return keys;
}

static PyObject *
window_truncated(Window *w, PyObject *args)
{
    Py_ssize_t topic;
    if (!PyArg_ParseTuple(args, "n", &topic)) return NULL;
    if (topic < 0 || topic >= w->ntopics || w->truncates[topic] == INT64_MIN) Py_RETURN_NONE;
    return PyLong_FromLongLong(w->truncates[topic]);
}

static int
compare_hashes(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static PyObject *
window_key_hashes(Window *w, PyObject *unused)
{
    if (!window_enter(w)) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, w->count * (Py_ssize_t)sizeof(uint64_t));
    if (out != NULL) {
        uint64_t *h = (uint64_t *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < w->count; i++) h[i] = w->entries[i].hash;
        Py_BEGIN_ALLOW_THREADS
        qsort(h, (size_t)w->count, sizeof(uint64_t), compare_hashes);
        Py_END_ALLOW_THREADS
    }
    w->busy = 0;
    return out;
}

static PyObject *
window_clear(Window *w, PyObject *unused)
{
    if (!window_enter(w)) return NULL;
    window_clear_all(w);
    w->busy = 0;
    Py_RETURN_NONE;
}

static int
window_init(Window *w, PyObject *args, PyObject *kwds)
{
    PyObject *type, *ops;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &type, &PyDict_Type, &ops)) return -1;
    Py_XSETREF(w->event_type, Py_NewRef(type));
    Py_XSETREF(w->ops, Py_NewRef(ops));
    memset(w->op_objects, 0, sizeof(w->op_objects));
    PyObject *code, *op;
    Py_ssize_t at = 0;
    while (PyDict_Next(ops, &at, &code, &op)) {
        Py_ssize_t n;
        const char *text = PyUnicode_Check(code) ? PyUnicode_AsUTF8AndSize(code, &n) : NULL;
        if (text != NULL && n == 1 && (unsigned char)text[0] < 128) w->op_objects[(unsigned char)text[0]] = op;
        PyErr_Clear();
    }
    return 0;
}

static void
window_dealloc(Window *w)
{
    window_clear_all(w);
    free(w->truncates);
    Py_XDECREF(w->event_type);
    Py_XDECREF(w->ops);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef window_methods[] = {
    {"add", (PyCFunction)window_add, METH_VARARGS, "add(records, topics, ends, resolve)"},
    {"add_packed", (PyCFunction)window_add_packed, METH_VARARGS, "add_packed(data, count, names, topics, ends, resolve)"},
    {"truncate", (PyCFunction)window_truncate, METH_VARARGS, "truncate(topic_id, version)"},
    {"stats", (PyCFunction)window_stats, METH_NOARGS, "stats() -> (keys, bytes, bytes of values read)"},
    {"shapes", (PyCFunction)window_shapes, METH_VARARGS, "shapes(topic_id) -> [schema_version or None]"},
    {"take", (PyCFunction)window_take, METH_VARARGS,
     "take(topic_id, schema_version, topic, source, loads, start, limit) -> (upserts, deletes, next)"},
    {"tombstones", (PyCFunction)window_tombstones, METH_VARARGS, "tombstones(topic_id) -> [key JSON]"},
    {"truncated", (PyCFunction)window_truncated, METH_VARARGS, "truncated(topic_id) -> version or None"},
    {"key_hashes", (PyCFunction)window_key_hashes, METH_NOARGS, "key_hashes() -> sorted uint64 hashes of the keys held"},
    {"clear", (PyCFunction)window_clear, METH_NOARGS, "clear()"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WindowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc._window.Window",
    .tp_basicsize = sizeof(Window),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The newest version per (topic, key) of the records added (see the module source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)window_init,
    .tp_dealloc = (destructor)window_dealloc,
    .tp_methods = window_methods,
};

/* columns_first(text) -> text: COPY text lines "key\tversion\tcolumns...\n" (cdc.api.raw_copy_rows)
 * as "columns...\tversion\n", for a plain COPY into the table itself. The key JSON holds no raw
 * tab or newline (JSON escapes them), and neither does a version. */
static PyObject *
columns_first(PyObject *self, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "columns_first(text): text is bytes");
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(arg), *end = p + PyBytes_GET_SIZE(arg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, PyBytes_GET_SIZE(arg));
    if (out == NULL) return NULL;
    char *o = PyBytes_AS_STRING(out);
    while (p < end) {
        const char *line_end = memchr(p, '\n', end - p);
        const char *key_end = memchr(p, '\t', (line_end ? line_end : end) - p);
        if (line_end == NULL || key_end == NULL) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_ValueError, "columns_first: a line without its key and version");
            return NULL;
        }
        const char *version = key_end + 1;
        const char *version_end = memchr(version, '\t', line_end - version);
        if (version_end == NULL) {  /* no columns */
            memcpy(o, version, line_end - version);
            o += line_end - version;
        } else {
            memcpy(o, version_end + 1, line_end - version_end - 1);
            o += line_end - version_end - 1;
            *o++ = '\t';
            memcpy(o, version, version_end - version);
            o += version_end - version;
        }
        *o++ = '\n';
        p = line_end + 1;
    }
    if (_PyBytes_Resize(&out, o - PyBytes_AS_STRING(out)) < 0) return NULL;
    return out;
}

/* Two sorted uint64 arrays (bytes) as pointers and lengths; 0 with an exception set. */
static int
hash_arrays(PyObject *args, const char *name, const uint64_t **a, Py_ssize_t *na, const uint64_t **b, Py_ssize_t *nb)
{
    PyObject *x, *y;
    if (!PyArg_ParseTuple(args, "O!O!", &PyBytes_Type, &x, &PyBytes_Type, &y)) return 0;
    if (PyBytes_GET_SIZE(x) % sizeof(uint64_t) || PyBytes_GET_SIZE(y) % sizeof(uint64_t)) {
        PyErr_Format(PyExc_ValueError, "%s: arrays of 8-byte hashes", name);
        return 0;
    }
    *a = (const uint64_t *)PyBytes_AS_STRING(x);
    *na = PyBytes_GET_SIZE(x) / (Py_ssize_t)sizeof(uint64_t);
    *b = (const uint64_t *)PyBytes_AS_STRING(y);
    *nb = PyBytes_GET_SIZE(y) / (Py_ssize_t)sizeof(uint64_t);
    return 1;
}

static PyObject *
hashes_meet(PyObject *self, PyObject *args)
{
    const uint64_t *a, *b;
    Py_ssize_t na, nb, i = 0, j = 0;
    if (!hash_arrays(args, "hashes_meet", &a, &na, &b, &nb)) return NULL;
    int met = 0;
    Py_BEGIN_ALLOW_THREADS
    while (i < na && j < nb) {
        if (a[i] == b[j]) { met = 1; break; }
        if (a[i] < b[j]) i++; else j++;
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(met);
}

static PyObject *
hashes_union(PyObject *self, PyObject *args)
{
    const uint64_t *a, *b;
    Py_ssize_t na, nb, i = 0, j = 0, n = 0;
    if (!hash_arrays(args, "hashes_union", &a, &na, &b, &nb)) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (na + nb) * (Py_ssize_t)sizeof(uint64_t));
    if (out == NULL) return NULL;
    uint64_t *o = (uint64_t *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    while (i < na || j < nb) {
        uint64_t v = j >= nb || (i < na && a[i] <= b[j]) ? a[i] : b[j];
        while (i < na && a[i] == v) i++;
        while (j < nb && b[j] == v) j++;
        if (!n || o[n - 1] != v) o[n++] = v;
    }
    Py_END_ALLOW_THREADS
    if (_PyBytes_Resize(&out, n * (Py_ssize_t)sizeof(uint64_t)) < 0) return NULL;
    return out;
}

static PyMethodDef module_methods[] = {
    {"hashes_meet", hashes_meet, METH_VARARGS, "hashes_meet(a, b) -> whether two sorted uint64 arrays share a value"},
    {"hashes_union", hashes_union, METH_VARARGS, "hashes_union(a, b) -> the sorted union of two sorted uint64 arrays"},
    {"columns_first", columns_first, METH_O, "columns_first(COPY text) -> the lines without the key, version last"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._window", NULL, -1, module_methods};

PyMODINIT_FUNC
PyInit__window(void)
{
    if (PyType_Ready(&WindowType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Window", (PyObject *)&WindowType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
