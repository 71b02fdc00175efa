/* What the translation units of cdc._window share (see cdc/_window.c): the window's entry and
 * type, a parsed envelope, and the functions one unit calls in another. */
#ifndef CDC_WINDOW_H
#define CDC_WINDOW_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NO_SCHEMA INT64_MIN

typedef struct {
    uint64_t hash;
    char *key;               /* key JSON, malloc'd */
    char *row;               /* after (upsert) or before (delete) JSON, malloc'd; NULL: none */
    int64_t version;
    int64_t schema_version;  /* NO_SCHEMA: the record named none */
    int64_t offset;
    uint32_t key_len, row_len;
    int32_t topic, partition;
    char op;                 /* 'c' 'u' 'r' 'd'; 0: only a tombstone seen */
    char tombstoned;
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *entries;          /* dense, in the order keys were first seen */
    uint32_t *slots;         /* open addressing: 1 + an index into entries; 0: empty */
    Py_ssize_t capacity, count, allocated;
    Py_ssize_t bytes;
    long long read_bytes;    /* of the record values added since the last clear */
    int64_t *truncates;      /* per topic id: newest truncate version, INT64_MIN if none */
    Py_ssize_t ntopics;
    int busy;
    PyObject *event_type, *ops;
    PyObject *op_objects[128];  /* borrowed from ops: op code -> Op */
} Window;

/* The parts of a plain JSON envelope; 1 if it is one the window takes (see the top). */
typedef struct {
    char op;
    int64_t version, schema_version;
    const unsigned char *row;  /* after for c/u/r, before (or NULL) for d */
    Py_ssize_t row_len;
} Envelope;

/* _window_table.c: the hash table of (topic, key) */
int window_apply(Window *w, int32_t topic, const char *key, Py_ssize_t key_len, char op, int64_t version,
                 const char *row, Py_ssize_t row_len, int64_t schema_version, int32_t partition, int64_t offset);
void window_truncate_topic(Window *w, Py_ssize_t topic, int64_t version);
void window_clear_all(Window *w);

/* _window_scan.c: a record's key and value, read in place */
int window_compact_key(const unsigned char *p, Py_ssize_t n);
int window_parse_envelope(const unsigned char *p, Py_ssize_t n, Envelope *env);

/* _window_add.c: the methods add and add_packed */
PyObject *window_add(Window *w, PyObject *args);
PyObject *window_add_packed(Window *w, PyObject *args);

/* _window.c */
int window_enter(Window *w);
int window_ensure_topics(Window *w, Py_ssize_t n);

#endif
