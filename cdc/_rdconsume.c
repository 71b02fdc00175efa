/* A Kafka reader for bulk loads, over librdkafka, without a Python object per record
 * (cdc/log/kafka_bulk.py).
 *
 * A bulk rebuild (cdc/runtime/window_fill.py) reads whole topics from offset
 * 0 into a window (cdc/_window.c) that keeps the newest version per key. Through confluent-kafka
 * every record became a Message and then a LogRecord (about 2.3 us a record on the GIL's thread);
 * here a batch of records is copied, with the GIL released, into one bytes object the window
 * parses in place.
 *
 * Reader(config)                    config: {name: str} of librdkafka properties (a consumer)
 * assign([(topic, partition, offset)])
 * read(max_records, timeout_ms) -> (data, count, topics, events, logs)
 *                                   data: `count` records packed one after the other, each a
 *                                   HEADER (native byte order: int32 topic index into `topics`,
 *                                   int32 partition, int64 offset, int64 timestamp, int32 key
 *                                   length, int32 value length, int32 headers length; -1: null)
 *                                   then the key's, the value's and the headers' bytes (the
 *                                   record's headers as cdc/headers.py packs them: per header a
 *                                   little-endian int32 name length, the name, an int32 value
 *                                   length, -1 for null, the value). events: [(index, code, reason, topic,
 *                                   partition, offset, fatal)]: partition ends (code -191, offset
 *                                   the end) and errors, in order, `index` the number of records
 *                                   packed before it. logs: [(level, facility, text)] librdkafka
 *                                   logged since the last read, and its error callbacks as
 *                                   (-1, name, text); it logs from its own threads, so they
 *                                   wait here for Python.
 * close()
 *
 * Errors: librdkafka's codes are confluent-kafka's KafkaError codes; the caller classifies them.
 * A failing call raises Failure(code, reason).
 *
 * This links the system's librdkafka (apt's librdkafka-dev); confluent-kafka carries its own copy
 * under another soname. Python loads extensions with RTLD_LOCAL, so each module's rd_kafka_*
 * symbols resolve to its own library (tests/integration/test_kafka_bulk_reader.py uses both).
 *
 * Threading: one thread at a time (a call made while another runs raises).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define HEADER 36
#define MAX_TOPICS 4096
#define MAX_LOGS 1000   /* log lines held between reads; more are counted, not kept */

static PyObject *Failure;

typedef struct Log {
    struct Log *next;
    int level;
    char *facility, *text;
} Log;

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    char *topics[MAX_TOPICS];  /* names by index, as read() hands them out */
    int ntopics;
    PyObject *topic_list;      /* the same names, for Python */
    int busy;
    pthread_mutex_t lock;      /* guards the logs, filled from librdkafka's threads */
    Log *logs, *logs_tail;
    int nlogs, dropped;
} Reader;

/* ---- librdkafka's log and errors, held for the next read -------------------------------------- */

static void
hold_log(Reader *r, int level, const char *facility, const char *text)
{
    pthread_mutex_lock(&r->lock);
    if (r->nlogs >= MAX_LOGS) {
        r->dropped++;
    } else {
        Log *log = calloc(1, sizeof(Log));
        if (log != NULL && (log->facility = strdup(facility)) != NULL && (log->text = strdup(text)) != NULL) {
            log->level = level;
            if (r->logs_tail) r->logs_tail->next = log; else r->logs = log;
            r->logs_tail = log;
            r->nlogs++;
        } else if (log != NULL) {
            free(log->facility);
            free(log);
        }
    }
    pthread_mutex_unlock(&r->lock);
}

static void
on_log(const rd_kafka_t *rk, int level, const char *facility, const char *text)
{
    Reader *r = rd_kafka_opaque(rk);
    if (r != NULL) hold_log(r, level, facility, text);
}

static void
on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    Reader *r = opaque;
    if (r != NULL) hold_log(r, err == RD_KAFKA_RESP_ERR__FATAL ? -2 : -1, rd_kafka_err2name(err), reason);
}

/* The held lines as [(level, facility, text)], emptied. */
static PyObject *
take_logs(Reader *r)
{
    pthread_mutex_lock(&r->lock);
    Log *log = r->logs;
    int dropped = r->dropped;
    r->logs = r->logs_tail = NULL;
    r->nlogs = r->dropped = 0;
    pthread_mutex_unlock(&r->lock);
    PyObject *out = PyList_New(0);
    while (log != NULL) {
        Log *next = log->next;
        if (out != NULL) {
            PyObject *item = Py_BuildValue("(iss)", log->level, log->facility, log->text);
            if (item == NULL || PyList_Append(out, item) < 0) Py_CLEAR(out);
            Py_XDECREF(item);
        }
        free(log->facility);
        free(log->text);
        free(log);
        log = next;
    }
    if (out != NULL && dropped) {
        PyObject *item = Py_BuildValue("(iss)", 4, "LOG", "(more log lines than were kept)");
        if (item == NULL || PyList_Append(out, item) < 0) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    return out;
}

static PyObject *
failure(rd_kafka_resp_err_t err, const char *reason)
{
    PyObject *args = Py_BuildValue("(is)", (int)err, reason ? reason : rd_kafka_err2str(err));
    if (args != NULL) PyErr_SetObject(Failure, args);
    Py_XDECREF(args);
    return NULL;
}

static int
enter(Reader *r)
{
    if (r->busy) {
        PyErr_SetString(PyExc_RuntimeError, "a Reader is used by one thread at a time");
        return 0;
    }
    if (r->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the Reader is closed");
        return 0;
    }
    r->busy = 1;
    return 1;
}

/* ---- the type ----------------------------------------------------------------------------------- */

static int
reader_init(Reader *r, PyObject *args, PyObject *kwds)
{
    PyObject *config;
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &config)) return -1;
    if (r->rk != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Reader is made once");
        return -1;
    }
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    PyObject *name, *value;
    Py_ssize_t at = 0;
    while (PyDict_Next(config, &at, &name, &value)) {
        const char *n = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
        const char *v = PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : NULL;
        if (n == NULL || v == NULL) {
            rd_kafka_conf_destroy(conf);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "config: names and values are str");
            return -1;
        }
        if (rd_kafka_conf_set(conf, n, v, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK) {
            rd_kafka_conf_destroy(conf);
            PyErr_Format(PyExc_ValueError, "%s", errstr);
            return -1;
        }
    }
    rd_kafka_conf_set_opaque(conf, r);
    rd_kafka_conf_set_log_cb(conf, on_log);
    rd_kafka_conf_set_error_cb(conf, on_error);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (rk == NULL) {  /* conf is still ours */
        rd_kafka_conf_destroy(conf);
        PyErr_Format(PyExc_ValueError, "%s", errstr);
        return -1;
    }
    rd_kafka_poll_set_consumer(rk);
    r->rk = rk;
    r->topic_list = PyList_New(0);
    return r->topic_list != NULL ? 0 : -1;
}

static PyObject *
reader_assign(Reader *r, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "assign([(topic, partition, offset)])");
    if (seq == NULL) return NULL;
    if (!enter(r)) { Py_DECREF(seq); return NULL; }
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new((int)PySequence_Fast_GET_SIZE(seq));
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        const char *topic;
        int partition;
        long long offset;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "siL", &topic, &partition, &offset)) goto done;
        rd_kafka_topic_partition_list_add(list, topic, partition)->offset = offset;
    }
    rd_kafka_resp_err_t err;
    Py_BEGIN_ALLOW_THREADS
    err = rd_kafka_assign(r->rk, list);
    Py_END_ALLOW_THREADS
    if (err) { failure(err, NULL); goto done; }
    /* Ask for the assigned topics' metadata now: a topic the client has no metadata for yet (it
     * connected before the assignment named it) is otherwise only looked up by librdkafka's
     * topic scan, once a second, and nothing is fetched until then (up to a second lost at
     * every start). One request for every topic the client knows (the assignment made them
     * known), at most 2 s when the broker is away. A hint only: an error here leaves that scan
     * to find the topics as before. */
    const struct rd_kafka_metadata *md = NULL;
    Py_BEGIN_ALLOW_THREADS
    if (rd_kafka_metadata(r->rk, 0, NULL, &md, 2000) == RD_KAFKA_RESP_ERR_NO_ERROR && md != NULL)
        rd_kafka_metadata_destroy(md);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    rd_kafka_topic_partition_list_destroy(list);
    Py_DECREF(seq);
    r->busy = 0;
    return result;
}

static void
put_le32(char *out, int32_t v)
{
    uint32_t u = (uint32_t)v;
    out[0] = (char)(u & 0xff);
    out[1] = (char)(u >> 8 & 0xff);
    out[2] = (char)(u >> 16 & 0xff);
    out[3] = (char)(u >> 24 & 0xff);
}

/* A message's headers packed at `out` (NULL: only measure); their length, -1 when it has none. */
static int32_t
pack_headers(rd_kafka_message_t *msg, char *out)
{
    rd_kafka_headers_t *headers;
    if (rd_kafka_message_headers(msg, &headers) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return -1;
    size_t total = 0, i = 0;
    const char *name;
    const void *value;
    size_t size;
    while (rd_kafka_header_get_all(headers, i++, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        size_t name_len = strlen(name);
        if (out != NULL) {
            put_le32(out + total, (int32_t)name_len);
            memcpy(out + total + 4, name, name_len);
            put_le32(out + total + 4 + name_len, value ? (int32_t)size : -1);
            if (value) memcpy(out + total + 8 + name_len, value, size);
        }
        total += 8 + name_len + (value ? size : 0);
    }
    return (int32_t)total;
}

/* The index of a topic's name, added if new; -1 when there are too many. */
static int
topic_index(Reader *r, const char *name, int *added)
{
    for (int i = r->ntopics - 1; i >= 0; i--)
        if (strcmp(r->topics[i], name) == 0) return i;
    if (r->ntopics == MAX_TOPICS || (r->topics[r->ntopics] = strdup(name)) == NULL) return -1;
    *added = 1;
    return r->ntopics++;
}

static PyObject *
reader_read(Reader *r, PyObject *args)
{
    Py_ssize_t max_records;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "ni", &max_records, &timeout_ms)) return NULL;
    if (max_records < 1) max_records = 1;
    if (!enter(r)) return NULL;
    rd_kafka_message_t **msgs = PyMem_Malloc((size_t)max_records * sizeof(*msgs));
    PyObject *result = NULL, *data = NULL, *events = NULL, *logs = NULL;
    Py_ssize_t n = 0, count = 0, size = 0;
    if (msgs == NULL) { PyErr_NoMemory(); goto done; }
    /* The first record may wait up to the timeout; the rest are what is queued already, so a
     * read returns as soon as librdkafka's queue is empty rather than waiting for a full batch. */
    Py_BEGIN_ALLOW_THREADS
    rd_kafka_message_t *m = rd_kafka_consumer_poll(r->rk, timeout_ms);
    while (m != NULL) {
        msgs[n++] = m;
        if (n == max_records) break;
        m = rd_kafka_consumer_poll(r->rk, 0);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!msgs[i]->err) {
            int32_t headers_len = pack_headers(msgs[i], NULL);
            size += HEADER + msgs[i]->key_len + msgs[i]->len + (headers_len > 0 ? headers_len : 0);
        }
    Py_END_ALLOW_THREADS
    events = PyList_New(0);
    data = PyBytes_FromStringAndSize(NULL, size);
    if (events == NULL || data == NULL) goto done;
    char *out = PyBytes_AS_STRING(data);
    int topics_added = 0, too_many = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        rd_kafka_message_t *msg = msgs[i];
        if (msg->err) continue;
        int32_t topic = topic_index(r, rd_kafka_topic_name(msg->rkt), &topics_added);
        if (topic < 0) { too_many = 1; break; }
        int32_t partition = msg->partition;
        int64_t offset = msg->offset, timestamp = rd_kafka_message_timestamp(msg, NULL);
        int32_t key_len = msg->key ? (int32_t)msg->key_len : -1, value_len = msg->payload ? (int32_t)msg->len : -1;
        char *head = out;
        memcpy(out, &topic, 4);
        memcpy(out + 4, &partition, 4);
        memcpy(out + 8, &offset, 8);
        memcpy(out + 16, &timestamp, 8);
        memcpy(out + 24, &key_len, 4);
        memcpy(out + 28, &value_len, 4);
        out += HEADER;
        if (key_len > 0) { memcpy(out, msg->key, key_len); out += key_len; }
        if (value_len > 0) { memcpy(out, msg->payload, value_len); out += value_len; }
        int32_t headers_len = pack_headers(msg, out);
        memcpy(head + 32, &headers_len, 4);
        if (headers_len > 0) out += headers_len;
    }
    Py_END_ALLOW_THREADS
    if (too_many) { PyErr_SetString(PyExc_ValueError, "more topics than a Reader names"); goto done; }
    for (; topics_added && PyList_GET_SIZE(r->topic_list) < r->ntopics;) {
        PyObject *name = PyUnicode_FromString(r->topics[PyList_GET_SIZE(r->topic_list)]);
        if (name == NULL || PyList_Append(r->topic_list, name) < 0) { Py_XDECREF(name); goto done; }
        Py_DECREF(name);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        rd_kafka_message_t *msg = msgs[i];
        if (!msg->err) { count++; continue; }
        const char *topic = msg->rkt ? rd_kafka_topic_name(msg->rkt) : "";
        const char *reason = msg->err == RD_KAFKA_RESP_ERR__PARTITION_EOF ? "end of partition" : rd_kafka_message_errstr(msg);
        PyObject *event = Py_BuildValue("(nissiLi)", count, (int)msg->err, reason ? reason : "", topic,
                                        (int)msg->partition, (long long)msg->offset,
                                        msg->err == RD_KAFKA_RESP_ERR__FATAL);
        if (event == NULL || PyList_Append(events, event) < 0) { Py_XDECREF(event); goto done; }
        Py_DECREF(event);
    }
    logs = take_logs(r);
    if (logs == NULL) goto done;
    result = Py_BuildValue("(OnOOO)", data, count, r->topic_list, events, logs);
done:
    for (Py_ssize_t i = 0; i < n; i++) rd_kafka_message_destroy(msgs[i]);
    PyMem_Free(msgs);
    Py_XDECREF(data);
    Py_XDECREF(events);
    Py_XDECREF(logs);
    r->busy = 0;
    return result;
}

static PyObject *
reader_logs(Reader *r, PyObject *unused)
{
    return take_logs(r);
}

static void
close_handle(Reader *r)
{
    rd_kafka_t *rk = r->rk;
    r->rk = NULL;
    if (rk == NULL) return;
    Py_BEGIN_ALLOW_THREADS
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    Py_END_ALLOW_THREADS
}

static PyObject *
reader_close(Reader *r, PyObject *unused)
{
    if (r->busy) {
        PyErr_SetString(PyExc_RuntimeError, "a Reader is used by one thread at a time");
        return NULL;
    }
    close_handle(r);
    Py_RETURN_NONE;
}

static PyObject *
reader_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Reader *r = (Reader *)type->tp_alloc(type, 0);
    if (r != NULL) pthread_mutex_init(&r->lock, NULL);
    return (PyObject *)r;
}

static void
reader_dealloc(Reader *r)
{
    close_handle(r);
    Py_XDECREF(take_logs(r));
    for (int i = 0; i < r->ntopics; i++) free(r->topics[i]);
    Py_XDECREF(r->topic_list);
    pthread_mutex_destroy(&r->lock);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef reader_methods[] = {
    {"assign", (PyCFunction)reader_assign, METH_O, "assign([(topic, partition, offset)])"},
    {"read", (PyCFunction)reader_read, METH_VARARGS,
     "read(max_records, timeout_ms) -> (data, count, topics, events, logs)"},
    {"logs", (PyCFunction)reader_logs, METH_NOARGS, "logs() -> [(level, facility, text)] held since the last read"},
    {"close", (PyCFunction)reader_close, METH_NOARGS, "close()"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc._rdconsume.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A librdkafka consumer that reads batches of records into one bytes object (see the source).",
    .tp_new = reader_new,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
};

static PyObject *
version(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(rd_kafka_version_str());
}

static PyMethodDef module_methods[] = {
    {"version", version, METH_NOARGS, "the linked librdkafka's version"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._rdconsume", NULL, -1, module_methods};

PyMODINIT_FUNC
PyInit__rdconsume(void)
{
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Failure = PyErr_NewException("cdc._rdconsume.Failure", NULL, NULL);
    if (Failure == NULL || PyModule_AddObjectRef(m, "Failure", Failure) < 0 ||
            PyModule_AddObjectRef(m, "Reader", (PyObject *)&ReaderType) < 0 ||
            PyModule_AddIntConstant(m, "HEADER", HEADER) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
