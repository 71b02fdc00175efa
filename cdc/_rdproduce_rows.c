/* The producer's produce_rows (cdc/_rdproduce.c): a RowBlock's lines to records, the block in one call. */
#include "_rdproduce.h"
#include "_rowblock.h"

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
        rdproduce_set_error(rd_kafka_last_error());
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
PyObject *
rdproduce_produce_rows(Producer *self, PyObject *const *args, Py_ssize_t nargs)
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
    if (rdproduce_enter(self) < 0) {
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
        rdproduce_set_error(err);
        return NULL;
    }
    return PyLong_FromLongLong(nbytes);
}
