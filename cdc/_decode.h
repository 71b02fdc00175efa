/* What the translation units of cdc._decode share (see cdc/_decode.c): the parser's scratch space,
 * a record's headers, and the one parser of a record (_decode_one.c). */
#ifndef CDC_DECODE_H
#define CDC_DECODE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <stdint.h>

#include "_jsonscan.h"

/* The last names and string values of a source block, reused while the next has the same bytes
 * at the same place (a table's events repeat connector, name, db, table ...). */
#define SOURCE_CACHE 32
typedef struct {
    PyObject *name[SOURCE_CACHE], *text[SOURCE_CACHE];
    Py_ssize_t name_len[SOURCE_CACHE], text_len[SOURCE_CACHE];
} SourceCache;

/* A record's headers (see "record headers" in _decode_one.c). */
typedef struct {
    PyObject *list;         /* borrowed: the pairs, Py_None, or NULL when packed */
    const char *packed;     /* packed headers (NULL: none) */
    Py_ssize_t packed_len;
} HeadersRef;

/* The parser's scratch space, kept across the records of one call. */
typedef struct {
    Members m, sm, km;
    SourceCache cache, key_cache;
} Scratch;

/* A LogRecord's first five fields (topic, partition, offset, key, value), or NULL with an error
 * when `record` is not one; *headers its headers (the seventh field; None without one). */
static inline PyObject *const *
decode_record_fields(PyObject *record, HeadersRef *headers)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 5) {
        PyErr_SetString(PyExc_TypeError, "a record is (topic, partition, offset, key, value, ...)");
        return NULL;
    }
    headers->list = PyTuple_GET_SIZE(record) > 6 ? PyTuple_GET_ITEM(record, 6) : Py_None;
    headers->packed = NULL;
    headers->packed_len = 0;
    return &PyTuple_GET_ITEM(record, 0);
}

/* _decode_one.c */
PyObject *decode_one(PyObject *const *record, const HeadersRef *headers, PyTypeObject *event_type, PyObject *ops,
                     PyObject *loads, int raw, Scratch *x);
void decode_scratch_free(Scratch *x);

#endif
