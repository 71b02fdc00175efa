/* ---- COPY TO STDOUT read in blocks, off psycopg2's connection (copy_out.py) ----
 *
 * psycopg2's copy_expert calls the file's write() once per row (libpq's PQgetCopyData hands out
 * one row per call): a GIL round trip, a bytes object and a Python call per row. copy_out runs the
 * same libpq loop without the GIL and hands whole blocks of lines to Python. Built only where
 * libpq's headers are (setup.py defines CDC_WITH_LIBPQ), linked to the system's libpq; the PGconn
 * it is given must be of that same libpq, which copy_out.py checks before it calls. */
#include "_copyjson.h"
#ifdef CDC_WITH_LIBPQ
#include <libpq-fe.h>

/* What went wrong, copied out of libpq while it is still there. */
typedef struct {
    char sqlstate[6];
    int has_state, bad;
    char *message;  /* malloc'd */
} Failure;

static void
failure_from(Failure *f, PGconn *conn, PGresult *res)
{
    const char *state = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *text = res != NULL ? PQresultErrorMessage(res) : NULL;
    if (text == NULL || text[0] == 0)
        text = PQerrorMessage(conn);
    if (state != NULL && strlen(state) == 5) {
        memcpy(f->sqlstate, state, 6);
        f->has_state = 1;
    }
    f->message = strdup(text != NULL ? text : "");
    f->bad = PQstatus(conn) == CONNECTION_BAD;
}

/* The results after the COPY data (its end, or its error), each read to the end as PQexec does. */
static void
finish_results(Failure *f, PGconn *conn)
{
    PGresult *res;
    while ((res = PQgetResult(conn)) != NULL) {
        if (PQresultStatus(res) != PGRES_COMMAND_OK && f->message == NULL)
            failure_from(f, conn, res);
        PQclear(res);
    }
}

/* copy_out(conn, sql, emit, lines, spec) -> (rows, bytes, sqlstate, message, connection_bad)
 *   conn: the PGconn* (psycopg2's connection.pgconn_ptr), of the libpq this module is linked to;
 *   sql: the COPY ... TO STDOUT statement (bytes); emit(block, rewritten) is called per block of up
 *   to `lines` whole lines; spec: None, or (kinds, heads, keys, toast, min_chars) as rewrite()
 *   takes them: each block is rewritten here, without the GIL, and emitted with rewritten True,
 *   or as read with rewritten False where rewrite() would have returned None.
 *   Returns the rows and bytes read; message is None when the COPY completed, else the error as
 *   libpq put it (sqlstate None when the server sent none: connection_bad tells whether the
 *   connection broke). An exception from emit leaves the COPY where it stopped, as psycopg2's
 *   copy_expert does when the file's write raises. */
PyObject *
copyjson_copy_out(PyObject *self, PyObject *args)
{
    unsigned long long conn_ptr;
    const char *sql;
    PyObject *emit, *spec_args;
    Py_ssize_t lines;
    if (!PyArg_ParseTuple(args, "KyOnO", &conn_ptr, &sql, &emit, &lines, &spec_args))
        return NULL;
    if (conn_ptr == 0 || lines < 1) {
        PyErr_SetString(PyExc_ValueError, "no connection, or blocks of no lines");
        return NULL;
    }
    PGconn *conn = (PGconn *)(uintptr_t)conn_ptr;

    Spec spec;
    memset(&spec, 0, sizeof(spec));
    Py_buffer kinds = {0};
    int rewriting = spec_args != Py_None;
    if (rewriting) {
        PyObject *heads, *keys_tuple, *toast_tuple;
        Py_ssize_t min_chars;
        if (!PyArg_ParseTuple(spec_args, "y*O!OOn", &kinds, &PyTuple_Type, &heads, &keys_tuple, &toast_tuple,
                              &min_chars))
            return NULL;
        if (copyjson_spec_init(&spec, &kinds, heads, keys_tuple, toast_tuple, min_chars) < 0) {
            copyjson_spec_free(&spec);
            PyBuffer_Release(&kinds);
            return NULL;
        }
    }

    PyObject *result = NULL;
    Buf in = {NULL, 0, 0}, out = {NULL, 0, 0};
    Failure failure = {{0}, 0, 0, NULL};
    long long rows = 0, nbytes = 0;
    int oom = 0, len = 0;
    PGresult *res;

    Py_BEGIN_ALLOW_THREADS
    res = PQexec(conn, sql);
    if (PQresultStatus(res) != PGRES_COPY_OUT)
        failure_from(&failure, conn, res);
    PQclear(res);  /* PQclear(NULL) is a no-op */
    Py_END_ALLOW_THREADS
    if (failure.message != NULL)
        goto finished;

    while (1) {
        Py_ssize_t n = 0;
        int taken = 0;
        in.len = 0;
        Py_BEGIN_ALLOW_THREADS
        while (n < lines) {
            char *data = NULL;
            len = PQgetCopyData(conn, &data, 0);
            if (len <= 0)
                break;  /* -1: the COPY is done; -2: an error; 0 only happens in async mode */
            if (copyjson_grow(&in, len) < 0) {
                PQfreemem(data);
                oom = 1;
                break;
            }
            memcpy(in.data + in.len, data, (size_t)len);
            in.len += len;
            PQfreemem(data);
            n++;
        }
        if (n > 0 && rewriting && !oom) {
            out.len = 0;
            taken = copyjson_spec_rewrite(&out, &spec, in.data, in.data + in.len);
            if (taken < 0)
                oom = 1;
        }
        Py_END_ALLOW_THREADS
        if (oom) {
            PyErr_NoMemory();
            goto done;
        }
        if (n > 0) {
            rows += n;
            nbytes += in.len;
            PyObject *block = taken > 0 ? PyBytes_FromStringAndSize(out.data, out.len)
                                        : PyBytes_FromStringAndSize(in.data, in.len);
            if (block == NULL)
                goto done;
            PyObject *called = PyObject_CallFunctionObjArgs(emit, block, taken > 0 ? Py_True : Py_False, NULL);
            Py_DECREF(block);
            if (called == NULL)
                goto done;
            Py_DECREF(called);
        }
        if (len <= 0)
            break;
    }
    Py_BEGIN_ALLOW_THREADS
    if (len == -1)
        finish_results(&failure, conn);  /* the COPY's end, or the error that ended it */
    else
        failure_from(&failure, conn, NULL);
    Py_END_ALLOW_THREADS

finished:
    if (failure.message == NULL) {
        result = Py_BuildValue("LLOOO", rows, nbytes, Py_None, Py_None, Py_False);
    } else {
        PyObject *state = failure.has_state ? PyUnicode_FromString(failure.sqlstate) : Py_NewRef(Py_None);
        PyObject *text = state ? PyUnicode_DecodeUTF8(failure.message, (Py_ssize_t)strlen(failure.message),
                                                      "replace") : NULL;
        if (text != NULL)
            result = Py_BuildValue("LLNNO", rows, nbytes, state, text, failure.bad ? Py_True : Py_False);
        else
            Py_XDECREF(state);
    }
done:
    free(failure.message);
    free(in.data);
    free(out.data);
    copyjson_spec_free(&spec);
    if (rewriting)
        PyBuffer_Release(&kinds);
    return result;
}

/* libpq_version() -> PQlibVersion() of the libpq this module is linked to. */
PyObject *
copyjson_libpq_version(PyObject *self, PyObject *args)
{
    return PyLong_FromLong(PQlibVersion());
}
#endif /* CDC_WITH_LIBPQ */
