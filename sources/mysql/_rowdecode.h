/* What the translation units of sources.mysql._rowdecode share (see _rowdecode.c): the column
 * kinds, a column's op, the Program type, and the reading of a row image (_rowdecode_image.c). */
#ifndef ROWDECODE_H
#define ROWDECODE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { K_INT = 1, K_FLOAT, K_DOUBLE, K_YEAR, K_DECIMAL, K_DATE, K_DATETIME2, K_TIMESTAMP2, K_STR, K_ENUM, K_BIT,
       K_SET, K_PYFIXED };

typedef struct {
    int kind, nullable, a, b;
    PyObject *conv;  /* borrowed from the Program's ops tuple */
} Op;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    Op *ops;
    PyObject *ops_tuple;   /* keeps the conv objects alive */
    PyObject *names;       /* tuple of str */
    Py_ssize_t nkey;
    Py_ssize_t *key_index;
    PyObject *event_type, *tx_type, *op_create, *op_update, *op_delete, *streamed;
} Program;

/* _rowdecode_image.c */
int rowdecode_image(Program *prog, const unsigned char *data, Py_ssize_t *pp, Py_ssize_t end, PyObject **values);

#endif
