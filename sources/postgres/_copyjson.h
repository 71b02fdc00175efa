/* What the translation units of sources.postgres._copyjson share (see _copyjson.c): the growing
 * buffer, a rewrite's spec, and the functions one unit calls in another. */
#ifndef COPYJSON_H
#define COPYJSON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static inline int
copyjson_grow(Buf *b, Py_ssize_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap * 2;
    if (cap < b->len + more)
        cap = b->len + more + 4096;
    char *data = realloc(b->data, (size_t)cap);  /* not PyMem_: runs without the GIL */
    if (data == NULL)
        return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

/* A rewrite's spec (the arguments of rewrite() after the block), parsed once per call. */
typedef struct {
    Py_ssize_t ncols, nkeys, ntoast, min_chars;
    const unsigned char *kind;
    const char **head;
    Py_ssize_t *head_len, *keys, *toast;
    const char **start;  /* per column, scratch of rewrite_block */
    Py_ssize_t *size;
} Spec;

int copyjson_spec_init(Spec *spec, Py_buffer *kinds, PyObject *heads, PyObject *keys_tuple, PyObject *toast_tuple,
                       Py_ssize_t min_chars);
void copyjson_spec_free(Spec *spec);
int copyjson_spec_rewrite(Buf *out, const Spec *spec, const char *p, const char *end);

/* _copyjson_out.c */
#ifdef CDC_WITH_LIBPQ
PyObject *copyjson_copy_out(PyObject *self, PyObject *args);
PyObject *copyjson_libpq_version(PyObject *self, PyObject *args);
#endif

/* _copyjson_keys.c */
PyObject *copyjson_int_key_events(PyObject *self, PyObject *args);
PyObject *copyjson_int_key_rows(PyObject *self, PyObject *args);

#endif
