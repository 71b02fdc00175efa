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
 * another runs with the GIL released raises RuntimeError rather than race.
 *
 * produce_rows, the block to records, is in _rdproduce_rows.c; _rdproduce.h declares what the
 * two units share. */
#include "_rdproduce.h"

static PyObject *ProduceError;  /* args: (code, name, description) */

void
rdproduce_set_error(rd_kafka_resp_err_t err)
{
    PyObject *args = Py_BuildValue("(iss)", err, rd_kafka_err2name(err), rd_kafka_err2str(err));
    if (args != NULL) {
        PyErr_SetObject(ProduceError, args);
        Py_DECREF(args);
    }
}

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

int
rdproduce_enter(Producer *self)
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


/* poll(timeout) -> events served: delivery reports (counted), log lines and errors (to Python). */
static PyObject *
Producer_poll(Producer *self, PyObject *arg)
{
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (rdproduce_enter(self) < 0)
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
    if (rdproduce_enter(self) < 0)
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
    if (rdproduce_enter(self) < 0)
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
    {"produce_rows", (PyCFunction)(void (*)(void))rdproduce_produce_rows, METH_FASTCALL,
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
