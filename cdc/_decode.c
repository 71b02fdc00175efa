/* Sink decoding: plain json envelopes read without building their rows (issue #18), for
 * cdc/sink_events.py (its Python loops are the reference; tests/unit/test_sink_decode_batch.py and
 * test_raw_rows.py compare), and the cut of a batch by shape (cdc/schema_order.py).
 *
 * decode_envelopes(records, SinkEvent, ops, loads, raw=True) -> list, per LogRecord its SinkEvent
 *   (with `raw`, an upsert's `after` left as the bytes of the row object; else its dict), or None.
 *   One parser (decode_one, in _decode_one.c) serves this and decode_batch further down. The value
 *   is checked as strictly as orjson.loads checks it (UTF-8, escapes and surrogate pairs, numbers
 *   that fit a double, no trailing bytes); the source block and the key object are built here
 *   (their names and repeated strings reused from the record before), a key that is no object, a
 *   delete's before and (without `raw`) the after by loads (orjson.loads). A tombstone (null value)
 *   with a plain JSON key is an event too. None for anything else: not JSON, not an object, Connect
 *   JSON or Avro, an unknown op, a version that is not an int, an escaped member name;
 *   cdc/sink_events.py then decodes the record the general way (which raises its PoisonRecord or
 *   reads the other format), so this path never accepts what that one refuses.
 */
#include "_decode.h"
#include "_logrecord.h"

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
        PyObject *const *fields = decode_record_fields(PySequence_Fast_GET_ITEM(seq, i), &headers);
        PyObject *one = fields ? decode_one(fields, &headers, (PyTypeObject *)args[1], args[2], args[3], raw, &x)
                               : NULL;
        if (one == NULL) goto fail;
        PyList_SET_ITEM(out, i, one);
    }
    decode_scratch_free(&x);
    Py_DECREF(seq);
    return out;
fail:
    decode_scratch_free(&x);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- decode_batch: cdc.sink_events.decode_batch's loop (LogRecords -> SinkEvents) ------------
 *
 * decode_batch(records, ends, raw_rows=False) -> (events, [(record, PoisonRecord)], bytes of values)
 * Each record through decode_one, the parser of _decode_one.c (with `raw_rows`, an upsert's after
 * stays the row's JSON bytes); every record it does not take goes to `db_fallback`
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
    PyObject *const *fields = decode_record_fields(record, &headers);
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
    decode_scratch_free(&x);
    return Py_BuildValue("(NNL)", events, poisons, nbytes);
fail:
    decode_scratch_free(&x);
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
    decode_scratch_free(&x);
    return Py_BuildValue("(NNL)", events, poisons, nbytes);
short_data:
    PyErr_SetString(PyExc_ValueError, "decode_packed: the data ends inside a record (not a packed batch?)");
fail:
    decode_scratch_free(&x);
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
