/* What the translation units of cdc._rdproduce share (see cdc/_rdproduce.c): the producer type and
 * the functions one unit calls in another. */
#ifndef CDC_RDPRODUCE_H
#define CDC_RDPRODUCE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <librdkafka/rdkafka.h>

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    PyObject *topics;      /* name -> PyCapsule of its rd_kafka_topic_t */
    PyObject *on_log;      /* callable(level, facility, message) or None */
    PyObject *on_error;    /* callable(code, reason) or None */
    long long acked, failed;
    int error_code;        /* the first failed delivery's (0: none yet) */
    int error_partition;
    char error_topic[256];
    int busy;              /* a call runs without the GIL */
    char *value, *key;     /* scratch buffers for the record being made */
    size_t value_size, key_size;
} Producer;

/* _rdproduce.c */
void rdproduce_set_error(rd_kafka_resp_err_t err);
int rdproduce_enter(Producer *self);

/* _rdproduce_rows.c */
PyObject *rdproduce_produce_rows(Producer *self, PyObject *const *args, Py_ssize_t nargs);

#endif
