/* cdc._rdproduce: a block of snapshot rows to Kafka in one call, through librdkafka directly.
 *
 * confluent-kafka produces one message per Python call (argument parsing, a per-message state of
 * its own) and frees that state through a delivery trampoline that takes the GIL for every
 * acknowledged message. A snapshot row needs none of that: its key and value are made from the
 * lines of a RowBlock (cdc/events.py), the same bytes cdc/_encode.c emit_rows makes, and handed
 * to rd_kafka_producev() here with the block's headers (cdc/headers.py: its rows share one
 * version), the whole block with the GIL released. Delivery reports are counted
 * in C (no Python call per message); the first failure is kept for the writer to raise
 * (cdc/log/block_producer.py). librdkafka's log lines and error events are served by poll/flush
 * and handed to Python callables, with the GIL taken only for them.
 *
 * This links the system's librdkafka (apt's librdkafka-dev), a copy other than the one bundled in
 * confluent-kafka's wheel; each extension resolves its own (both are loaded RTLD_LOCAL), and
 * tests/integration/test_block_producer.py uses both in one process.
 *
 * Threading: one thread calls a producer's methods at a time (the writer's); a call made while
 * another runs with the GIL released raises RuntimeError rather than race. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <librdkafka/rdkafka.h>

#include "_rowblock.h"

static PyObject *ProduceError;  /* args: (code, name, description) */

static void
set_produce_error(rd_kafka_resp_err_t err)
{
    PyObject *args = Py_BuildValue("(iss)", err, rd_kafka_err2name(err), rd_kafka_err2str(err));
    if (args != NULL) {
        PyErr_SetObject(ProduceError, args);
        Py_DECREF(args);
    }
}

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    PyObject *topics;      /* name -> PyCapsule of its rd_kafka_topic_t */
    PyObject *on_log;      /* callable(level, facility, message) or None */
    PyObject *on_error;    /* callable(code, reason) or None */
    long long acked, failed;
    int error_code;        /* the first failed delivery's (0: none yet) */
    int error_partition;
    char error_topic[256];
    int busy;              /* a call runs without the GIL */
    char *value, *key;     /* scratch buffers for the record being made */
    size_t value_size, key_size;
} Producer;

/* --- callbacks (served on the thread that polls; no GIL held there) ---------------------------- */

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
    Producer *self = opaque;
    if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        self->acked++;
        return;
    }
    if (self->failed++ == 0) {
        self->error_code = msg->err;
        self->error_partition = msg->partition;
        snprintf(self->error_topic, sizeof self->error_topic, "%s", msg->rkt ? rd_kafka_topic_name(msg->rkt) : "?");
    }
}

static void
call_python(PyObject *callable, const char *format, ...)
{
    if (callable == NULL || callable == Py_None)
        return;
    PyGILState_STATE state = PyGILState_Ensure();
    va_list va;
    va_start(va, format);
    PyObject *args = Py_VaBuildValue(format, va);
    va_end(va);
    PyObject *result = args ? PyObject_CallObject(callable, args) : NULL;
    Py_XDECREF(args);
    if (result == NULL)
        PyErr_WriteUnraisable(callable);  /* a failing log handler must not stop the producer */
    Py_XDECREF(result);
    PyGILState_Release(state);
}

static void
on_log(const rd_kafka_t *rk, int level, const char *facility, const char *message)
{
    Producer *self = rd_kafka_opaque(rk);
    if (self != NULL)
        call_python(self->on_log, "(iss)", level, facility, message);
}

static void
on_error(rd_kafka_t *rk, int code, const char *reason, void *opaque)
{
    Producer *self = opaque;
    call_python(self->on_error, "(is)", code, reason);
}

/* --- the type ----------------------------------------------------------------------------------- */

static int
enter(Producer *self)
{
    if (self->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the block producer is closed");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the block producer is in use by another thread");
        return -1;
    }
    self->busy = 1;
    return 0;
}

static void
destroy(Producer *self)
{
    rd_kafka_t *rk = self->rk;
    if (rk == NULL)
        return;
    PyObject *topics = self->topics;
    self->topics = NULL;
    if (topics != NULL) {
        PyObject *name, *capsule;
        Py_ssize_t at = 0;
        while (PyDict_Next(topics, &at, &name, &capsule))
            rd_kafka_topic_destroy(PyCapsule_GetPointer(capsule, NULL));
        Py_DECREF(topics);
    }
    self->rk = NULL;
    Py_BEGIN_ALLOW_THREADS
    rd_kafka_destroy(rk);  /* joins librdkafka's threads: never with the GIL held */
    Py_END_ALLOW_THREADS
}

static void
Producer_dealloc(Producer *self)
{
    if (self->rk != NULL) {
        rd_kafka_purge(self->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        destroy(self);
    }
    Py_XDECREF(self->on_log);
    Py_XDECREF(self->on_error);
    free(self->value);
    free(self->key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Producer(config: dict[str, str], on_log=None, on_error=None) */
static int
Producer_init(Producer *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"config", "on_log", "on_error", NULL};
    PyObject *config, *log = Py_None, *error = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|OO", names, &PyDict_Type, &config, &log, &error))
        return -1;
    if (self->rk != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the block producer is made already");
        return -1;
    }
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    PyObject *key, *value;
    Py_ssize_t at = 0;
    while (PyDict_Next(config, &at, &key, &value)) {
        const char *k = PyUnicode_AsUTF8(key), *v = k ? PyUnicode_AsUTF8(value) : NULL;
        if (v == NULL) {
            rd_kafka_conf_destroy(conf);
            PyErr_SetString(PyExc_TypeError, "the producer settings must be str: str");
            return -1;
        }
        if (rd_kafka_conf_set(conf, k, v, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
            rd_kafka_conf_destroy(conf);
            PyErr_Format(PyExc_ValueError, "producer setting %s=%s: %s", k, v, errstr);
            return -1;
        }
    }
    /* Logs wait in a queue served by poll/flush (rather than being called on librdkafka's own
     * threads, which rd_kafka_destroy joins while this thread may want the GIL). */
    if (rd_kafka_conf_set(conf, "log.queue", "true", errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
        rd_kafka_conf_destroy(conf);
        PyErr_Format(PyExc_ValueError, "log.queue: %s", errstr);
        return -1;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_conf_set_log_cb(conf, on_log);
    rd_kafka_conf_set_error_cb(conf, on_error);
    rd_kafka_conf_set_opaque(conf, self);
    Py_INCREF(log);
    Py_XSETREF(self->on_log, log);
    Py_INCREF(error);
    Py_XSETREF(self->on_error, error);
    self->topics = PyDict_New();
    if (self->topics == NULL) {
        rd_kafka_conf_destroy(conf);
        return -1;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);  /* owns conf if made */
    if (rk == NULL) {
        rd_kafka_conf_destroy(conf);
        PyErr_Format(PyExc_ValueError, "the producer could not be made: %s", errstr);
        return -1;
    }
    rd_kafka_set_log_queue(rk, NULL);  /* onto the main queue, which poll serves */
    self->rk = rk;
    return 0;
}

static rd_kafka_topic_t *
topic_handle(Producer *self, PyObject *name)
{
    PyObject *capsule = PyDict_GetItemWithError(self->topics, name);
    if (capsule != NULL)
        return PyCapsule_GetPointer(capsule, NULL);
    if (PyErr_Occurred())
        return NULL;
    const char *text = PyUnicode_AsUTF8(name);
    if (text == NULL)
        return NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(self->rk, text, NULL);  /* the partitioner of the config */
    if (rkt == NULL) {
        set_produce_error(rd_kafka_last_error());
        return NULL;
    }
    capsule = PyCapsule_New(rkt, NULL, NULL);
    if (capsule == NULL || PyDict_SetItem(self->topics, name, capsule) < 0) {
        Py_XDECREF(capsule);
        rd_kafka_topic_destroy(rkt);
        return NULL;
    }
    Py_DECREF(capsule);
    return rkt;
}

static int
grow(char **buffer, size_t *size, size_t need)
{
    if (need <= *size)
        return 0;
    size_t size2 = need < 4096 ? 4096 : need * 2;
    char *grown = realloc(*buffer, size2);
    if (grown == NULL)
        return -1;
    *buffer = grown;
    *size = size2;
    return 0;
}

/* The headers of a record (a list of (str, bytes or None) pairs, or None: none) for librdkafka; a
 * new list (NULL for none), or NULL with an error. */
static int
c_headers(PyObject *pairs, rd_kafka_headers_t **out)
{
    *out = NULL;
    if (pairs == Py_None)
        return 0;
    if (!PyList_Check(pairs)) {
        PyErr_SetString(PyExc_TypeError, "produce_rows: the headers are a list of (str, bytes) pairs");
        return -1;
    }
    rd_kafka_headers_t *headers = rd_kafka_headers_new((size_t)PyList_GET_SIZE(pairs));
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pairs); i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        const char *name;
        Py_ssize_t name_len;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))
                || (PyTuple_GET_ITEM(pair, 1) != Py_None && !PyBytes_Check(PyTuple_GET_ITEM(pair, 1)))) {
            PyErr_SetString(PyExc_TypeError, "produce_rows: the headers are a list of (str, bytes) pairs");
            rd_kafka_headers_destroy(headers);
            return -1;
        }
        if ((name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &name_len)) == NULL) {
            rd_kafka_headers_destroy(headers);
            return -1;
        }
        PyObject *value = PyTuple_GET_ITEM(pair, 1);
        rd_kafka_header_add(headers, name, name_len, value == Py_None ? NULL : PyBytes_AS_STRING(value),
                            value == Py_None ? 0 : PyBytes_GET_SIZE(value));
    }
    *out = headers;
    return 0;
}

/* produce_rows(topic, block, value_head, value_tail, key_head, key_tail, headers) -> bytes of values made
 *   One record per line `<key text>\t<row JSON>[\t...]\n` of block: value = value_head + row JSON +
 *   value_tail, key = key_head + key text + key_tail (what cdc/_encode.c emit_rows makes), each
 *   with `headers` (a list of (str, bytes) pairs, or None), to
 *   `topic` through the partitioner of the config. Waits for room when librdkafka's queue is full.
 *   Every line is checked before anything is produced (TypeError); a record librdkafka refuses
 *   raises ProduceError with the records before it produced. */
static PyObject *
Producer_produce_rows(Producer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "produce_rows takes 7 arguments");
        return NULL;
    }
    if (!PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "produce_rows: the topic must be a str");
        return NULL;
    }
    for (int i = 2; i < 6; i++)
        if (!PyBytes_Check(args[i])) {
            PyErr_SetString(PyExc_TypeError, "produce_rows: the heads and tails must be bytes");
            return NULL;
        }
    rd_kafka_headers_t *headers;
    if (c_headers(args[6], &headers) < 0)
        return NULL;
    if (enter(self) < 0) {
        if (headers != NULL)
            rd_kafka_headers_destroy(headers);
        return NULL;
    }
    rd_kafka_topic_t *rkt = topic_handle(self, args[0]);
    Py_buffer block;
    if (rkt == NULL || PyObject_GetBuffer(args[1], &block, PyBUF_SIMPLE) < 0) {
        if (headers != NULL)
            rd_kafka_headers_destroy(headers);
        self->busy = 0;
        return NULL;
    }
    const char *start = block.buf, *end = start + block.len, *p;
    size_t longest;
    if (rowblock_check(start, end, &longest, "produce_rows") < 0) {
        PyBuffer_Release(&block);
        if (headers != NULL)
            rd_kafka_headers_destroy(headers);
        self->busy = 0;
        return NULL;
    }
    /* The heads and tails are immutable bytes the caller holds for the call. */
    const char *vh = PyBytes_AS_STRING(args[2]), *vt = PyBytes_AS_STRING(args[3]);
    const char *kh = PyBytes_AS_STRING(args[4]), *kt = PyBytes_AS_STRING(args[5]);
    size_t nvh = (size_t)PyBytes_GET_SIZE(args[2]), nvt = (size_t)PyBytes_GET_SIZE(args[3]);
    size_t nkh = (size_t)PyBytes_GET_SIZE(args[4]), nkt = (size_t)PyBytes_GET_SIZE(args[5]);
    if (grow(&self->value, &self->value_size, nvh + longest + nvt) < 0
            || grow(&self->key, &self->key_size, nkh + longest + nkt) < 0) {
        PyBuffer_Release(&block);
        if (headers != NULL)
            rd_kafka_headers_destroy(headers);
        self->busy = 0;
        return PyErr_NoMemory();
    }
    char *v = self->value, *k = self->key;
    memcpy(v, vh, nvh);
    memcpy(k, kh, nkh);
    long long nbytes = 0;
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    Py_BEGIN_ALLOW_THREADS
    int since_poll = 0;
    for (p = start; p < end;) {
        RowLine line;
        p = rowblock_line(p, end, &line);
        size_t nk = line.nkey, nj = line.njson;
        memcpy(v + nvh, line.json, nj);
        memcpy(v + nvh + nj, vt, nvt);
        memcpy(k + nkh, line.key, nk);
        memcpy(k + nkh + nk, kt, nkt);
        /* librdkafka owns a record's headers once it took the record, so each gets its copy. */
        rd_kafka_headers_t *copy = headers != NULL ? rd_kafka_headers_copy(headers) : NULL;
        while ((err = rd_kafka_producev(self->rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_PARTITION(RD_KAFKA_PARTITION_UA),
                                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_VALUE(v, nvh + nj + nvt),
                                        RD_KAFKA_V_KEY(k, nkh + nk + nkt), RD_KAFKA_V_HEADERS(copy),
                                        RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
            rd_kafka_poll(self->rk, 100);  /* the backpressure: serve acknowledgements until there is room */
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (copy != NULL)
                rd_kafka_headers_destroy(copy);
            break;
        }
        nbytes += (long long)(nvh + nj + nvt);
        if (++since_poll == 1000) {  /* keep the delivery reports from piling up */
            since_poll = 0;
            rd_kafka_poll(self->rk, 0);
        }
    }
    rd_kafka_poll(self->rk, 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&block);
    if (headers != NULL)
        rd_kafka_headers_destroy(headers);
    self->busy = 0;
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        set_produce_error(err);
        return NULL;
    }
    return PyLong_FromLongLong(nbytes);
}

/* poll(timeout) -> events served: delivery reports (counted), log lines and errors (to Python). */
static PyObject *
Producer_poll(Producer *self, PyObject *arg)
{
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (enter(self) < 0)
        return NULL;
    int served;
    Py_BEGIN_ALLOW_THREADS
    served = rd_kafka_poll(self->rk, (int)(timeout * 1000));
    Py_END_ALLOW_THREADS
    self->busy = 0;
    return PyLong_FromLong(served);
}

/* flush(timeout) -> records still unacknowledged (0: every record produced is acknowledged or
 * failed, and every report served). Sends lingering batches at once. */
static PyObject *
Producer_flush(Producer *self, PyObject *arg)
{
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (enter(self) < 0)
        return NULL;
    int left;
    Py_BEGIN_ALLOW_THREADS
    rd_kafka_flush(self->rk, (int)(timeout * 1000));
    rd_kafka_poll(self->rk, 0);
    left = rd_kafka_outq_len(self->rk);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    return PyLong_FromLong(left);
}

/* first_error() -> None, or (code, name, description, topic, partition) of the first record not
 * acknowledged. */
static PyObject *
Producer_first_error(Producer *self, PyObject *unused)
{
    if (self->failed == 0)
        Py_RETURN_NONE;
    rd_kafka_resp_err_t err = self->error_code;
    return Py_BuildValue("(isssi)", err, rd_kafka_err2name(err), rd_kafka_err2str(err), self->error_topic,
                         self->error_partition);
}

/* close(timeout) -> records dropped: waits up to timeout for those in flight, purges the rest. */
static PyObject *
Producer_close(Producer *self, PyObject *arg)
{
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (self->rk == NULL)
        return PyLong_FromLong(0);
    if (enter(self) < 0)
        return NULL;
    int left;
    Py_BEGIN_ALLOW_THREADS
    rd_kafka_flush(self->rk, (int)(timeout * 1000));
    left = rd_kafka_outq_len(self->rk);
    if (left) {
        rd_kafka_purge(self->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(self->rk, 0);
    }
    Py_END_ALLOW_THREADS
    self->busy = 0;
    destroy(self);
    return PyLong_FromLong(left);
}

static PyObject *
Producer_outstanding(Producer *self, void *unused)
{
    return PyLong_FromLong(self->rk == NULL ? 0 : rd_kafka_outq_len(self->rk));
}

static PyObject *
Producer_acked(Producer *self, void *unused)
{
    return PyLong_FromLongLong(self->acked);
}

static PyObject *
Producer_failed(Producer *self, void *unused)
{
    return PyLong_FromLongLong(self->failed);
}

static PyMethodDef Producer_methods[] = {
    {"produce_rows", (PyCFunction)(void (*)(void))Producer_produce_rows, METH_FASTCALL,
     "produce_rows(topic, block, value_head, value_tail, key_head, key_tail, headers) -> bytes of values made"},
    {"poll", (PyCFunction)Producer_poll, METH_O, "poll(timeout) -> events served"},
    {"flush", (PyCFunction)Producer_flush, METH_O, "flush(timeout) -> records still unacknowledged"},
    {"first_error", (PyCFunction)Producer_first_error, METH_NOARGS,
     "first_error() -> None or (code, name, description, topic, partition)"},
    {"close", (PyCFunction)Producer_close, METH_O, "close(timeout) -> records dropped"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Producer_getset[] = {
    {"outstanding", (getter)Producer_outstanding, NULL, "records not yet acknowledged (or failed)", NULL},
    {"acked", (getter)Producer_acked, NULL, "records acknowledged so far", NULL},
    {"failed", (getter)Producer_failed, NULL, "records not acknowledged so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ProducerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc._rdproduce.Producer",
    .tp_basicsize = sizeof(Producer),
    .tp_dealloc = (destructor)Producer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Producer(config: dict[str, str], on_log=None, on_error=None): a librdkafka producer for RowBlocks",
    .tp_methods = Producer_methods,
    .tp_getset = Producer_getset,
    .tp_init = (initproc)Producer_init,
    .tp_new = PyType_GenericNew,
};

static PyObject *
version(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(rd_kafka_version_str());
}

static PyMethodDef methods[] = {
    {"version", version, METH_NOARGS, "the linked librdkafka's version"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._rdproduce", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__rdproduce(void)
{
    if (PyType_Ready(&ProducerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    ProduceError = PyErr_NewException("cdc._rdproduce.ProduceError", NULL, NULL);
    if (ProduceError == NULL || PyModule_AddObject(m, "ProduceError", ProduceError) < 0) {
        Py_XDECREF(ProduceError);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(ProduceError);
    Py_INCREF(&ProducerType);
    if (PyModule_AddObject(m, "Producer", (PyObject *)&ProducerType) < 0) {
        Py_DECREF(&ProducerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
