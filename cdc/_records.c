/* Kafka records in C: confluent-kafka's Messages to LogRecords (log_records, the reference is
 * cdc/log/kafka_reader.py), its Producer.produce called positionally (cdc/log/kafka_writer.py),
 * record headers packed and unpacked (cdc/log/packed_headers.py), and a key's partition by the Java
 * client's murmur2 (cdc/log/partitioner.py). Optional, as every extension
 * here: cdc.native loads it where setup.py built it; tests compare each with its Python twin. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <stdint.h>

#include "_logrecord.h"

/* produce_positionally(produce) -> f(topic, value, key, headers=None): confluent-kafka's
 * Producer.produce(topic, value, key, partition, callback, on_delivery, timestamp, headers) with
 * the headers in their place and the arguments before them at their defaults (any partition, the
 * producer's delivery callback, now). A keyword call costs about 0.45 us more there: its
 * argument parser makes a str for every keyword it looks up. */
static PyObject *minus_one = NULL, *zero = NULL;

static PyObject *
positional_produce(PyObject *produce, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "produce(topic, value, key, headers=None)");
        return NULL;
    }
    PyObject *full[8] = {args[0], args[1], args[2], minus_one, Py_None, Py_None, zero,
                         nargs == 4 ? args[3] : Py_None};
    return PyObject_Vectorcall(produce, full, 8, NULL);
}

static PyMethodDef positional_produce_def = {
    "produce", (PyCFunction)(void (*)(void))positional_produce, METH_FASTCALL,
    "produce(topic, value, key, headers=None): Producer.produce with the headers in their place"};

static PyObject *
py_produce_positionally(PyObject *self, PyObject *produce)
{
    if (minus_one == NULL && ((minus_one = PyLong_FromLong(-1)) == NULL || (zero = PyLong_FromLong(0)) == NULL))
        return NULL;
    return PyCFunction_New(&positional_produce_def, produce);
}

/* unpack_headers(data) -> cdc.headers.unpack(data), in C; pack_headers(headers) -> cdc.headers.pack. */
static PyObject *
py_unpack_headers(PyObject *self, PyObject *data)
{
    if (data == Py_None)
        Py_RETURN_NONE;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "unpack_headers takes bytes");
        return NULL;
    }
    return packed_headers_list(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
}

static PyObject *
py_pack_headers(PyObject *self, PyObject *headers)
{
    if (headers == Py_None || (PyList_Check(headers) && PyList_GET_SIZE(headers) == 0))
        Py_RETURN_NONE;
    PyObject *seq = PySequence_Fast(headers, "the headers are a list of (name, value) pairs");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), size = 0;
    PyObject *out = NULL;
    for (int pass = 0; pass < 2; pass++) {  /* measure, then write */
        char *w = out ? PyBytes_AS_STRING(out) : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(seq, i), *name, *value;
            Py_ssize_t name_len;
            const char *name_utf8;
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(name = PyTuple_GET_ITEM(pair, 0))
                    || ((value = PyTuple_GET_ITEM(pair, 1)) != Py_None && !PyBytes_Check(value))) {
                PyErr_SetString(PyExc_TypeError, "a header is a (str, bytes or None) pair");
                goto fail;
            }
            if ((name_utf8 = PyUnicode_AsUTF8AndSize(name, &name_len)) == NULL)
                goto fail;
            Py_ssize_t value_len = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
            if (name_len > INT32_MAX || value_len > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "a header of 2 GiB or more");
                goto fail;
            }
            if (w == NULL) {
                size += 8 + name_len + (value_len > 0 ? value_len : 0);
                continue;
            }
            for (int b = 0; b < 4; b++) w[b] = (char)((uint32_t)name_len >> (8 * b) & 0xff);
            memcpy(w + 4, name_utf8, name_len);
            w += 4 + name_len;
            for (int b = 0; b < 4; b++) w[b] = (char)((uint32_t)(int32_t)value_len >> (8 * b) & 0xff);
            w += 4;
            if (value_len > 0) {
                memcpy(w, PyBytes_AS_STRING(value), value_len);
                w += value_len;
            }
        }
        if (pass == 0 && (out = PyBytes_FromStringAndSize(NULL, size)) == NULL)
            goto fail;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- log_records: cdc.log.kafka.log_records's loop (confluent-kafka Messages -> LogRecords) ----
 *
 * log_records(messages, start, out, LogRecord) -> the index of the first message from `start` on
 * that carries an error (len(messages) if none); the records of the messages before it are
 * appended to `out`. The caller handles that message (end of partition, a transient error, ...)
 * in Python and calls again after it. */

static PyObject *msg_error, *msg_topic, *msg_partition, *msg_offset, *msg_key, *msg_value, *msg_timestamp,
    *msg_headers;

static PyObject *
call0(PyObject *obj, PyObject *name)
{
    return PyObject_CallMethodNoArgs(obj, name);
}

static PyObject *
py_log_records(PyObject *self, PyObject *args)
{
    PyObject *messages, *out, *type;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!nO!O!", &PyList_Type, &messages, &start, &PyList_Type, &out, &PyType_Type, &type))
        return NULL;
    if (msg_error == NULL) {
        msg_error = PyUnicode_InternFromString("error");
        msg_topic = PyUnicode_InternFromString("topic");
        msg_partition = PyUnicode_InternFromString("partition");
        msg_offset = PyUnicode_InternFromString("offset");
        msg_key = PyUnicode_InternFromString("key");
        msg_value = PyUnicode_InternFromString("value");
        msg_timestamp = PyUnicode_InternFromString("timestamp");
        msg_headers = PyUnicode_InternFromString("headers");
        if (!msg_error || !msg_topic || !msg_partition || !msg_offset || !msg_key || !msg_value || !msg_timestamp
                || !msg_headers)
            return NULL;
    }
    PyTypeObject *record_type = (PyTypeObject *)type;
    Py_ssize_t i = start < 0 ? 0 : start;
    if (i > PyList_GET_SIZE(messages))
        i = PyList_GET_SIZE(messages);
    for (; i < PyList_GET_SIZE(messages); i++) {
        PyObject *msg = PyList_GET_ITEM(messages, i);
        Py_INCREF(msg);
        PyObject *err = call0(msg, msg_error);
        if (err == NULL)
            goto fail;
        Py_DECREF(err);
        if (err != Py_None) {
            Py_DECREF(msg);
            break;
        }
        PyObject *fields[RECORD_FIELDS] = {call0(msg, msg_topic), call0(msg, msg_partition),
                                           call0(msg, msg_offset), call0(msg, msg_key), call0(msg, msg_value),
                                           NULL, call0(msg, msg_headers)};
        PyObject *stamp = call0(msg, msg_timestamp);
        if (stamp != NULL && PyTuple_Check(stamp) && PyTuple_GET_SIZE(stamp) == 2)
            fields[5] = Py_NewRef(PyTuple_GET_ITEM(stamp, 1));
        else if (stamp != NULL)
            PyErr_SetString(PyExc_TypeError, "Message.timestamp() is not a pair");
        Py_XDECREF(stamp);
        PyObject *record = record_of(record_type, fields);
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

/* partition_for(key, partitions) -> cdc.log.partitioner.partition_for(key, partitions), in C. */
static PyObject *
py_partition_for(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "partition_for(key, partitions)");
        return NULL;
    }
    long partitions = PyLong_AsLong(args[1]);
    if (partitions == -1 && PyErr_Occurred())
        return NULL;
    if (partitions <= 0) {
        PyErr_SetString(PyExc_ValueError, "partition_for: partitions must be positive");
        return NULL;
    }
    Py_buffer key;
    if (PyObject_GetBuffer(args[0], &key, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint32_t m = 0x5BD1E995;
    const unsigned char *d = key.buf;
    size_t len = (size_t)key.len, end = len & ~(size_t)3;
    uint32_t h = 0x9747B28Cu ^ (uint32_t)len;
    for (size_t i = 0; i < end; i += 4) {
        uint32_t k = (uint32_t)d[i] | ((uint32_t)d[i + 1] << 8) | ((uint32_t)d[i + 2] << 16)
                     | ((uint32_t)d[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h = (h * m) ^ k;
    }
    switch (len & 3) {
    case 3:
        h ^= (uint32_t)d[end + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)d[end + 1] << 8;
        /* fall through */
    case 1:
        h ^= d[end];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    PyBuffer_Release(&key);
    return PyLong_FromUnsignedLong((h & 0x7FFFFFFFu) % (unsigned long)partitions);
}

static PyMethodDef methods[] = {
    {"partition_for", (PyCFunction)(void (*)(void))py_partition_for, METH_FASTCALL,
     "partition_for(key, partitions) -> Kafka's toPositive(murmur2(key)) % partitions"},
    {"unpack_headers", py_unpack_headers, METH_O, "unpack_headers(data) -> cdc.headers.unpack(data)"},
    {"pack_headers", py_pack_headers, METH_O, "pack_headers(headers) -> cdc.headers.pack(headers)"},
    {"produce_positionally", py_produce_positionally, METH_O,
     "produce_positionally(Producer.produce) -> produce(topic, value, key, headers=None)"},
    {"log_records", py_log_records, METH_VARARGS,
     "log_records(messages, start, out, LogRecord) -> index of the first message with an error"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._records", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__records(void)
{
    return PyModule_Create(&module);
}
