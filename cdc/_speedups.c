/* The encoding loop of cdc.serde.EnvelopeEncoder.emit, in C.
 *
 * Optional: cdc/serde.py uses it when it was built (setup.py, `optional=True`) and otherwise
 * runs its own Python loop, which stays the reference. Both make the same bytes
 * (tests/unit/test_speedups.py compares them on generated events). Rows, keys and fields are
 * still serialized by orjson.dumps; what moves to C is the per-event work around it: unpacking
 * the event, the cache lookups, assembling the value from its pieces and calling `emit`.
 *
 * emit(middle, events, emit, when_room, everywhere, now_ms, where) -> bytes of values made
 *   middle(table, op, snapshot, now_ms) -> (topic, b',"op":...,"ts_ms":'), cached per call.
 *   On failure `where` (a list of two) is set to [topic or None, bytes made so far] and the
 *   exception propagates; serde.py wraps it in an EmitError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *dumps = NULL;        /* orjson.dumps */
static PyObject *op_truncate = NULL;  /* Op.TRUNCATE */
static PyObject *op_delete = NULL;    /* Op.DELETE */
static PyObject *truncate_key = NULL; /* b"{}" */

static const char HEAD_BEFORE[] = "{\"before\":";
static const char HEAD_AFTER[] = ",\"after\":";
static const char VERSION[] = ",\"version\":";
static const char TX_NULL[] = ",\"transaction\":null}";
static const char TX_ID[] = ",\"transaction\":{\"id\":";
static const char TX_TOTAL[] = ",\"total_order\":";
static const char TX_DCO[] = ",\"data_collection_order\":";
#define LIT(s) (sizeof(s) - 1)

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

/* Call f(a, b, c); on BufferError call room(a, b, c) instead. A new reference or NULL. */
static PyObject *
call_with_room(PyObject *f, PyObject *room, PyObject *a, PyObject *b, PyObject *c)
{
    PyObject *args[3] = {a, b, c};
    PyObject *r = PyObject_Vectorcall(f, args, 3, NULL);
    if (r == NULL && PyErr_ExceptionMatches(PyExc_BufferError)) {
        PyErr_Clear();
        r = PyObject_Vectorcall(room, args, 3, NULL);
    }
    return r;
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
    Py_XSETREF(dumps, Py_NewRef(d));
    Py_XSETREF(op_truncate, Py_NewRef(t));
    Py_XSETREF(op_delete, Py_NewRef(del));
    Py_XSETREF(truncate_key, Py_NewRef(k));
    Py_RETURN_NONE;
}

static PyObject *
speedups_emit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "emit takes 7 arguments");
        return NULL;
    }
    if (dumps == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cdc._speedups.setup was not called");
        return NULL;
    }
    PyObject *middle_fn = args[0], *events = args[1], *emit = args[2], *room = args[3];
    PyObject *everywhere = args[4], *now_ms = args[5], *where = args[6];
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

        if (op == op_truncate) {
            PyObject *targs[3] = {topic, value, truncate_key};
            r = PyObject_Vectorcall(everywhere, targs, 3, NULL);
            if (r == NULL)
                goto fail_event;
        } else {
            if ((key_json = dump(key)) == NULL)
                goto fail_event;
            if ((r = call_with_room(emit, room, topic, value, key_json)) == NULL)
                goto fail_event;
            if (op == op_delete) {
                Py_DECREF(r);
                if ((r = call_with_room(emit, room, topic, Py_None, key_json)) == NULL)
                    goto fail_event;
            }
        }
        Py_DECREF(r);
        Py_XDECREF(before_json);
        Py_DECREF(after_json);
        Py_XDECREF(key_json);
        Py_DECREF(value);
        Py_DECREF(event);
        continue;
    fail_event:
        Py_XDECREF(before_json);
        Py_XDECREF(after_json);
        Py_XDECREF(key_json);
        Py_XDECREF(value);
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


/* ---- decode_batch: cdc.sink_events.decode_batch's loop (LogRecords -> SinkEvents) ------------
 *
 * Only the common case is decoded here: a JSON key object and a JSON envelope (or a null value:
 * a tombstone), neither Avro nor Connect JSON, with a known op and an integer source.version.
 * Every other record goes to `fallback` (cdc.sink_events.decode_record), so what such a record
 * decodes to, or which PoisonRecord it raises, is the Python code's by construction. */

static PyObject *loads = NULL;          /* orjson.loads */
static PyObject *fallback = NULL;       /* decode_record(record) -> SinkEvent, raises PoisonRecord */
static PyObject *poison_type = NULL;    /* PoisonRecord */
static PyTypeObject *event_type = NULL; /* SinkEvent (a tuple subclass of 10 fields) */
static PyObject *ops = NULL;            /* {"c": Op.CREATE, ...} */
static PyObject *one = NULL;            /* 1 */
static PyObject *s_op, *s_source, *s_version, *s_before, *s_after, *s_ts_ms, *s_payload;

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
    Py_XSETREF(loads, Py_NewRef(l));
    Py_XSETREF(fallback, Py_NewRef(f));
    Py_XSETREF(poison_type, Py_NewRef(p));
    Py_XSETREF(event_type, (PyTypeObject *)Py_NewRef(t));
    Py_XSETREF(ops, Py_NewRef(o));
    if (s_op == NULL) {
        s_op = PyUnicode_InternFromString("op");
        s_source = PyUnicode_InternFromString("source");
        s_version = PyUnicode_InternFromString("version");
        s_before = PyUnicode_InternFromString("before");
        s_after = PyUnicode_InternFromString("after");
        s_ts_ms = PyUnicode_InternFromString("ts_ms");
        s_payload = PyUnicode_InternFromString("payload");
        one = PyLong_FromLong(1);
        if (!one || !s_op || !s_source || !s_version || !s_before || !s_after || !s_ts_ms || !s_payload)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* orjson.loads(data) if it is a dict that is not Connect JSON's wrapper; NULL (no error set)
 * when the fallback should decide. -1: an error that is not the data's (out of memory). */
static PyObject *
load_object(PyObject *data, int *failed)
{
    if (!PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) == 0 || PyBytes_AS_STRING(data)[0] != '{')
        return NULL;
    PyObject *obj = PyObject_CallOneArg(loads, data);
    if (obj == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) {  /* orjson.JSONDecodeError: the fallback says why */
            PyErr_Clear();
        } else {
            *failed = 1;
        }
        return NULL;
    }
    if (!PyDict_CheckExact(obj) || (PyDict_GET_SIZE(obj) == 2 && PyDict_GetItemWithError(obj, s_payload))) {
        Py_DECREF(obj);
        if (PyErr_Occurred())
            *failed = 1;
        return NULL;
    }
    return obj;
}

/* The SinkEvent of a record in the common case (a new reference); NULL with no error set: the
 * fallback decides; NULL with an error: a failure that is not the record's. */
static PyObject *
decode_one(PyObject *record, PyObject *topic, PyObject *partition, PyObject *offset)
{
    int failed = 0;
    PyObject *key_data = PyTuple_GET_ITEM(record, 3), *value_data = PyTuple_GET_ITEM(record, 4);
    if (key_data == Py_None)
        return NULL;
    PyObject *key = load_object(key_data, &failed);
    if (key == NULL)
        return NULL;
    PyObject *op = Py_None, *before = Py_None, *after = Py_None, *version = Py_None, *ts_ms = Py_None;
    PyObject *source = NULL, *value = NULL;
    if (value_data == Py_None) {
        if ((source = PyDict_New()) == NULL)
            goto fail;
    } else {
        if ((value = load_object(value_data, &failed)) == NULL)
            goto fail;
        PyObject *op_code = PyDict_GetItemWithError(value, s_op);
        if (op_code == NULL || !PyUnicode_CheckExact(op_code))
            goto fail;
        if ((op = PyDict_GetItemWithError(ops, op_code)) == NULL)
            goto fail;
        source = PyDict_GetItemWithError(value, s_source);
        if (source == NULL || !PyDict_CheckExact(source))
            goto fail;
        version = PyDict_GetItemWithError(source, s_version);
        if (version == NULL || !PyLong_Check(version))
            goto fail;
        Py_INCREF(source);
        PyObject *got;
        if ((got = PyDict_GetItemWithError(value, s_before)) != NULL)
            before = got;
        if ((got = PyDict_GetItemWithError(value, s_after)) != NULL)
            after = got;
        if ((got = PyDict_GetItemWithError(value, s_ts_ms)) != NULL)
            ts_ms = got;
        if (PyErr_Occurred()) {
            Py_DECREF(source);
            source = NULL;
            goto fail;
        }
    }
    PyObject *event = event_type->tp_alloc(event_type, 10);
    if (event == NULL) {
        Py_DECREF(source);
        goto fail;
    }
    PyObject *fields[10] = {topic, partition, offset, key, op, before, after, version, source, ts_ms};
    for (int i = 0; i < 10; i++) {
        Py_INCREF(fields[i]);
        PyTuple_SET_ITEM(event, i, fields[i]);
    }
    Py_DECREF(source);
    Py_DECREF(key);
    Py_XDECREF(value);
    return event;
fail:
    Py_DECREF(key);
    Py_XDECREF(value);
    return NULL;
}

static PyObject *
speedups_decode_batch(PyObject *self, PyObject *args)
{
    PyObject *records, *ends;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &records, &PyDict_Type, &ends))
        return NULL;
    if (loads == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cdc._speedups.decode_setup was not called");
        return NULL;
    }
    PyObject *events = PyList_New(0), *poisons = PyList_New(0);
    long long nbytes = 0;
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
        PyObject *next = where ? PyNumber_Add(offset, one) : NULL;
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
        PyObject *event = decode_one(record, topic, partition, offset);
        if (event == NULL) {
            if (PyErr_Occurred())
                goto fail_record;
            event = PyObject_CallOneArg(fallback, record);
            if (event == NULL) {
                if (!PyErr_ExceptionMatches(poison_type))
                    goto fail_record;
                PyObject *type, *exc, *tb;
                PyErr_Fetch(&type, &exc, &tb);
                PyErr_NormalizeException(&type, &exc, &tb);
                if (tb != NULL)
                    PyException_SetTraceback(exc, tb);
                PyObject *pair = PyTuple_Pack(2, record, exc);
                Py_XDECREF(type);
                Py_XDECREF(exc);
                Py_XDECREF(tb);
                if (pair == NULL || PyList_Append(poisons, pair) < 0) {
                    Py_XDECREF(pair);
                    goto fail_record;
                }
                Py_DECREF(pair);
                Py_DECREF(record);
                continue;
            }
        }
        int appended = PyList_Append(events, event);
        Py_DECREF(event);
        if (appended < 0)
            goto fail_record;
        Py_DECREF(record);
        continue;
    fail_record:
        Py_DECREF(record);
        Py_DECREF(records);
        goto fail;
    }
    Py_DECREF(records);
    return Py_BuildValue("(NNL)", events, poisons, nbytes);
fail:
    Py_XDECREF(events);
    Py_XDECREF(poisons);
    return NULL;
}


/* ---- log_records: cdc.log.kafka.log_records's loop (confluent-kafka Messages -> LogRecords) ----
 *
 * log_records(messages, start, out, LogRecord) -> the index of the first message from `start` on
 * that carries an error (len(messages) if none); the records of the messages before it are
 * appended to `out`. The caller handles that message (end of partition, a transient error, ...)
 * in Python and calls again after it. */

static PyObject *m_error, *m_topic, *m_partition, *m_offset, *m_key, *m_value, *m_timestamp;

static PyObject *
call0(PyObject *obj, PyObject *name)
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
    if (m_error == NULL) {
        m_error = PyUnicode_InternFromString("error");
        m_topic = PyUnicode_InternFromString("topic");
        m_partition = PyUnicode_InternFromString("partition");
        m_offset = PyUnicode_InternFromString("offset");
        m_key = PyUnicode_InternFromString("key");
        m_value = PyUnicode_InternFromString("value");
        m_timestamp = PyUnicode_InternFromString("timestamp");
        if (!m_error || !m_topic || !m_partition || !m_offset || !m_key || !m_value || !m_timestamp)
            return NULL;
    }
    PyTypeObject *record_type = (PyTypeObject *)type;
    Py_ssize_t i = start < 0 ? 0 : start;
    if (i > PyList_GET_SIZE(messages))
        i = PyList_GET_SIZE(messages);
    for (; i < PyList_GET_SIZE(messages); i++) {
        PyObject *msg = PyList_GET_ITEM(messages, i);
        Py_INCREF(msg);
        PyObject *err = call0(msg, m_error);
        if (err == NULL)
            goto fail;
        Py_DECREF(err);
        if (err != Py_None) {
            Py_DECREF(msg);
            break;
        }
        PyObject *fields[6] = {call0(msg, m_topic), call0(msg, m_partition), call0(msg, m_offset),
                               call0(msg, m_key), call0(msg, m_value), NULL};
        PyObject *stamp = call0(msg, m_timestamp);
        if (stamp != NULL && PyTuple_Check(stamp) && PyTuple_GET_SIZE(stamp) == 2)
            fields[5] = Py_NewRef(PyTuple_GET_ITEM(stamp, 1));
        else if (stamp != NULL)
            PyErr_SetString(PyExc_TypeError, "Message.timestamp() is not a pair");
        Py_XDECREF(stamp);
        PyObject *record = NULL;
        if (fields[0] && fields[1] && fields[2] && fields[3] && fields[4] && fields[5]
                && (record = record_type->tp_alloc(record_type, 6)) != NULL) {
            for (int f = 0; f < 6; f++) {
                PyTuple_SET_ITEM(record, f, fields[f]);
                fields[f] = NULL;
            }
        }
        for (int f = 0; f < 6; f++)
            Py_XDECREF(fields[f]);
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

static PyMethodDef methods[] = {
    {"setup", speedups_setup, METH_VARARGS, "setup(dumps, Op.TRUNCATE, Op.DELETE, truncate_key)"},
    {"emit", (PyCFunction)(void (*)(void))speedups_emit, METH_FASTCALL,
     "emit(middle, events, emit, when_room, everywhere, now_ms, where) -> bytes of values made"},
    {"log_records", speedups_log_records, METH_VARARGS,
     "log_records(messages, start, out, LogRecord) -> index of the first message with an error"},
    {"decode_setup", decode_setup, METH_VARARGS, "decode_setup(loads, decode_record, PoisonRecord, SinkEvent, ops)"},
    {"decode_batch", speedups_decode_batch, METH_VARARGS,
     "decode_batch(records, ends) -> (events, [(record, PoisonRecord)], bytes of values)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._speedups", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
