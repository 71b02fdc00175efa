/* A log record as the runtime holds it (cdc.log.base.LogRecord) and its headers packed as the
 * embedded log stores them and the bulk reader hands them out (cdc/log/packed_headers.py), for
 * cdc/_decode.c and cdc/_records.c (separate extensions, so each gets its own copy). */
#ifndef CDC_LOGRECORD_H
#define CDC_LOGRECORD_H

#include <Python.h>
#include <stdint.h>

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

#endif
