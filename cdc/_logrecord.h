/* A log record as the runtime holds it (cdc.log.base.LogRecord), its headers packed as the
 * embedded log stores them and the bulk reader hands them out (cdc/log/packed_headers.py), and the
 * head of a record in a batch of the bulk reader (cdc/_rdconsume.c), for cdc/_decode.c,
 * cdc/_records.c and cdc/_window.c (separate extensions, so each gets its own copy). */
#ifndef CDC_LOGRECORD_H
#define CDC_LOGRECORD_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef CDC_SHARED
#define CDC_SHARED static __attribute__((unused))  /* one copy in each extension that includes it */
#endif

#define VERSION_HEADER "cdc.version"  /* cdc/headers.py's VERSION (tests/unit/test_encode.py) */
#define LIT(s) (sizeof(s) - 1)  /* the length of a string literal */

CDC_SHARED int32_t
le_int32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (int32_t)((uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24);
}

/* The next packed header from *at: 1 (name, value; value NULL: null), 0 at the end, -1 damaged. */
CDC_SHARED int
packed_header(const char **at, const char *end, const char **name, Py_ssize_t *name_len, const char **value,
              Py_ssize_t *value_len)
{
    const char *p = *at;
    if (p == end)
        return 0;
    if (end - p < 4 || (*name_len = le_int32(p)) < 0 || end - p - 4 < *name_len)
        return -1;
    *name = p + 4;
    p += 4 + *name_len;
    if (end - p < 4)
        return -1;
    *value_len = le_int32(p);
    p += 4;
    if (*value_len < 0) {
        *value = NULL;
        *value_len = 0;
    } else {
        if (end - p < *value_len)
            return -1;
        *value = p;
        p += *value_len;
    }
    *at = p;
    return 1;
}

/* Packed headers as confluent-kafka's list of (name, value) pairs (a new list), or NULL with an
 * error (ValueError when the bytes are not packed headers). */
CDC_SHARED PyObject *
packed_headers_list(const char *p, Py_ssize_t n)
{
    PyObject *list = PyList_New(0);
    const char *at = p, *end = p + n, *name, *value;
    Py_ssize_t name_len, value_len;
    int got;
    while (list != NULL && (got = packed_header(&at, end, &name, &name_len, &value, &value_len)) == 1) {
        PyObject *pair = Py_BuildValue("(s#N)", name, name_len,
                                       value ? PyBytes_FromStringAndSize(value, value_len) : Py_NewRef(Py_None));
        if (pair == NULL || PyList_Append(list, pair) < 0)
            Py_CLEAR(list);
        Py_XDECREF(pair);
    }
    if (list != NULL && got < 0) {
        Py_DECREF(list);
        PyErr_SetString(PyExc_ValueError, "packed headers that run past their end");
        return NULL;
    }
    return list;
}

#define RECORD_FIELDS 7  /* a LogRecord: topic, partition, offset, key, value, timestamp_ms, headers */

/* A LogRecord of `fields`, whose references it takes (each one is dropped either way); NULL with
 * the error set when a field is NULL (its making failed) or the allocation does. */
CDC_SHARED PyObject *
record_of(PyTypeObject *record_type, PyObject **fields)
{
    PyObject *record = NULL;
    int complete = 1;
    for (int f = 0; f < RECORD_FIELDS; f++)
        complete = complete && fields[f] != NULL;
    if (complete && (record = record_type->tp_alloc(record_type, RECORD_FIELDS)) != NULL) {
        for (int f = 0; f < RECORD_FIELDS; f++) {
            PyTuple_SET_ITEM(record, f, fields[f]);
            fields[f] = NULL;
        }
    }
    for (int f = 0; f < RECORD_FIELDS; f++)
        Py_XDECREF(fields[f]);
    return record;
}

/* The head of a record in a batch of cdc/_rdconsume.c's Reader.read (its HEADER, native-endian):
 * topic index, partition, offset, timestamp, and the lengths of the key, value and headers that
 * follow it (-1: null). */
#define PACKED_HEAD 36
typedef struct {
    int32_t topic, partition, key_len, value_len, headers_len;
    int64_t offset, timestamp;
} PackedHead;

/* The head at *at into *h, *at moved past it; 0 (nothing moved) when fewer bytes are left. */
CDC_SHARED int
packed_head(const char **at, const char *end, PackedHead *h)
{
    const char *p = *at;
    if (end - p < PACKED_HEAD)
        return 0;
    memcpy(&h->topic, p, 4);
    memcpy(&h->partition, p + 4, 4);
    memcpy(&h->offset, p + 8, 8);
    memcpy(&h->timestamp, p + 16, 8);
    memcpy(&h->key_len, p + 24, 4);
    memcpy(&h->value_len, p + 28, 4);
    memcpy(&h->headers_len, p + 32, 4);
    *at = p + PACKED_HEAD;
    return 1;
}

/* The bytes a record's key, value and headers take after its head. */
CDC_SHARED Py_ssize_t
packed_body(const PackedHead *h)
{
    return (Py_ssize_t)(h->key_len > 0 ? h->key_len : 0) + (h->value_len > 0 ? h->value_len : 0)
           + (h->headers_len > 0 ? h->headers_len : 0);
}

#endif
