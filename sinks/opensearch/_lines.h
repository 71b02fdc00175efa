/* What the translation units of sinks.opensearch._lines share (see _lines.c): the rows as JSON
 * bytes of _lines_raw.c, and the functions one unit calls in another. */
#ifndef OPENSEARCH_LINES_H
#define OPENSEARCH_LINES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* the version field's name as a JSON string (set by setup) */
extern PyObject *lines_version_key_json;

typedef struct {
    const char *name;        /* between the quotes, unescaped */
    Py_ssize_t name_len;
    const char *value;       /* the value's bytes */
    Py_ssize_t value_len;
    const char *field;       /* the field name's JSON (quotes included) */
    Py_ssize_t field_len;
} RawMember;

typedef struct {
    RawMember *items;
    Py_ssize_t len, cap;
    Py_ssize_t *slots;       /* the hash set of names (duplicate check) */
    Py_ssize_t nslots;
} RawMembers;

/* The layout, unpacked once per encode call. */
typedef struct {
    int keep_unknown;
    Py_ssize_t count;
    const char **names;
    Py_ssize_t *name_lens;
    PyObject **renamed;      /* borrowed: bytes or Py_None */
} RawFields;

/* _lines_raw.c */
int lines_raw_fields_of(PyObject *fields, RawFields *f);
void lines_raw_fields_free(RawFields *f);
PyObject *lines_raw_body(PyObject *row, const RawFields *f, RawMembers *m);
PyObject *lines_raw_document(PyObject *body, const char *digits, Py_ssize_t ndigits);

/* _lines.c */
PyObject *lines_with_version(const char *data, Py_ssize_t size, int empty, const char *digits, Py_ssize_t ndigits);

/* _lines_reduce.c */
PyObject *lines_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
