/* The row JSON of the PostgreSQL snapshot, made from plain COPY text in the reader instead of
 * by the server's row_to_json.
 *
 * Optional, like cdc/_encode.c: sources/postgres/copy_json.py holds the Python twin (the
 * reference, and the fallback where this was not built) and builds the spec. The C path never
 * raises on bad input: on anything it does not take (a line with the wrong number of fields, an
 * escape the server does not print, a bool that is not t/f, a bytea not in hex) it returns None
 * and the Python twin converts the block again and raises its DecodeError naming the line.
 * tests/unit/test_pg_copy_json.py compares the two; tests/integration/test_pg_copy_json.py compares
 * both with what the server prints.
 *
 * rewrite(block, kinds, heads, keys, toast, min_chars) -> bytes | None
 *   block: whole lines of `COPY (SELECT <every column> ...) TO STDOUT`, each ending in "\n".
 *   kinds: bytes, one kind per column (K_* below); heads: tuple of bytes, what goes before each
 *   column's value in the row JSON ('{"id":', ',"name":'), COPY-escaped; keys, toast: tuples of
 *   column indexes. Each line becomes what the server prints for
 *     SELECT <key columns>, row_to_json(<the json expressions>),
 *            CASE WHEN length(concat(<toast column>)) >= min_chars THEN concat(...) ELSE '' END ...
 *   (sources/postgres/snapshot.py): the key fields as they were, the row JSON escaped as COPY
 *   escapes text, then per toast column its field when the value has min_chars characters or more,
 *   else nothing.
 *
 * The extension's other units: _copyjson_out.c (the COPY read loop over libpq) and
 * _copyjson_keys.c (blocks of integer-keyed tables); _copyjson.h declares what they share.
 */
#include "_copyjson.h"

/* Kept equal to KINDS in copy_json.py. */
enum { K_RAW = 1, K_FLOAT, K_BOOL, K_STRING, K_TIMESTAMP, K_TIMESTAMPTZ, K_BYTEA };

#define PUT(b, src, n) do { if (copyjson_grow((b), (n)) < 0) goto error; \
                            memcpy((b)->data + (b)->len, (src), (size_t)(n)); (b)->len += (n); } while (0)
#define PUTC(b, c) do { if (copyjson_grow((b), 1) < 0) goto error; (b)->data[(b)->len++] = (char)(c); } while (0)

/* PostgreSQL's IsValidJsonNumber: what row_to_json prints bare for a float's output text. */
static int
json_number(const char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0')
        i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    else
        return 0;
    if (i < n && s[i] == '.') {
        i++;
        if (i == n || s[i] < '0' || s[i] > '9')
            return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i == n || s[i] < '0' || s[i] > '9')
            return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    return i == n;
}

static const char HEX[] = "0123456789abcdef";

/* One character of a value as escape_json writes it, then as COPY escapes that text (only its
 * backslashes: the JSON holds no control characters). */
static int
put_json_char(Buf *b, unsigned char c)
{
    switch (c) {
    case '\b': PUT(b, "\\\\b", 3); break;
    case '\f': PUT(b, "\\\\f", 3); break;
    case '\n': PUT(b, "\\\\n", 3); break;
    case '\r': PUT(b, "\\\\r", 3); break;
    case '\t': PUT(b, "\\\\t", 3); break;
    case '"': PUT(b, "\\\\\"", 3); break;
    case '\\': PUT(b, "\\\\\\\\", 4); break;
    default:
        if (c < ' ') {
            char u[7] = {'\\', '\\', 'u', '0', '0', HEX[c >> 4], HEX[c & 15]};
            PUT(b, u, 7);
        } else {
            PUTC(b, c);
        }
    }
    return 0;
error:
    return -1;
}

/* A field's COPY text as a JSON string: 1 done, 0 an escape the server does not write, -1 error. */
static int
put_string(Buf *b, const char *s, Py_ssize_t n)
{
    PUTC(b, '"');
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') {
            if (++i == n)
                return 0;
            switch (s[i]) {
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'v': c = '\v'; break;
            case '\\': c = '\\'; break;
            default: return 0;  /* octal, hex, or anything COPY TO never prints */
            }
        }
        if (put_json_char(b, c) < 0)
            return -1;
    }
    PUTC(b, '"');
    return 1;
error:
    return -1;
}

/* Characters of a field's value (escapes count one, UTF-8 continuation bytes none). */
static Py_ssize_t
char_length(const char *s, Py_ssize_t n)
{
    Py_ssize_t chars = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\')
            i++;
        if ((c & 0xC0) != 0x80)
            chars++;
    }
    return chars;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int
hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* bytea's hex text ("\\x0001ff" as COPY prints it) as a base64 JSON string: 1, 0 not hex, -1. */
static int
put_bytea(Buf *b, const char *s, Py_ssize_t n)
{
    if (n < 3 || s[0] != '\\' || s[1] != '\\' || s[2] != 'x' || (n - 3) % 2)
        return 0;
    const char *h = s + 3;
    Py_ssize_t bytes = (n - 3) / 2;
    if (copyjson_grow(b, (bytes + 2) / 3 * 4 + 2) < 0)
        return -1;
    char *w = b->data + b->len;
    *w++ = '"';
    for (Py_ssize_t i = 0; i < bytes; i += 3) {
        int v[3] = {0, 0, 0};
        Py_ssize_t take = bytes - i < 3 ? bytes - i : 3;
        for (Py_ssize_t j = 0; j < take; j++) {
            int hi = hex_value(h[2 * (i + j)]), lo = hex_value(h[2 * (i + j) + 1]);
            if (hi < 0 || lo < 0)
                return 0;
            v[j] = hi << 4 | lo;
        }
        unsigned int triple = (unsigned int)(v[0] << 16 | v[1] << 8 | v[2]);
        *w++ = B64[triple >> 18 & 63];
        *w++ = B64[triple >> 12 & 63];
        *w++ = take > 1 ? B64[triple >> 6 & 63] : '=';
        *w++ = take > 2 ? B64[triple & 63] : '=';
    }
    *w++ = '"';
    b->len = w - b->data;
    return 1;
}

/* A timestamp's text as the snapshot's expression reshapes it: spaces to 'T' unless it ends in
 * 'C' (BC); timestamptz: only when it ends in '+00', which becomes 'Z'. 1, 0 (an escape), -1. */
static int
put_timestamp(Buf *b, const char *s, Py_ssize_t n, int with_zone)
{
    if (memchr(s, '\\', (size_t)n) != NULL)
        return 0;
    int reshape;
    Py_ssize_t keep = n;
    if (with_zone) {
        reshape = n >= 3 && s[n - 3] == '+' && s[n - 2] == '0' && s[n - 1] == '0';
        if (reshape)
            keep = n - 3;
    } else {
        reshape = !(n >= 1 && s[n - 1] == 'C');
    }
    if (copyjson_grow(b, keep + 3) < 0)
        return -1;
    char *w = b->data + b->len;
    *w++ = '"';
    for (Py_ssize_t i = 0; i < keep; i++)
        *w++ = reshape && s[i] == ' ' ? 'T' : s[i];
    if (with_zone && reshape)
        *w++ = 'Z';
    *w++ = '"';
    b->len = w - b->data;
    return 1;
}

/* Column indexes from a tuple of ints (each below ncols); -1 with an error set. */
static int
indexes(PyObject *tuple, Py_ssize_t ncols, Py_ssize_t **out, Py_ssize_t *count)
{
    if (!PyTuple_Check(tuple)) {
        PyErr_SetString(PyExc_TypeError, "keys and toast must be tuples of column indexes");
        return -1;
    }
    *count = PyTuple_GET_SIZE(tuple);
    *out = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(*count + 1));
    if (*out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *count; i++) {
        Py_ssize_t v = PyLong_AsSsize_t(PyTuple_GET_ITEM(tuple, i));
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 0 || v >= ncols) {
            PyErr_SetString(PyExc_ValueError, "a column index is out of range");
            return -1;
        }
        (*out)[i] = v;
    }
    return 0;
}

/* The loop of rewrite(), without the GIL (it touches no Python object): 1 done, 0 a line it does
 * not take, -1 out of memory. */
static int
rewrite_block(Buf *out, const char *p, const char *end, const unsigned char *kind, Py_ssize_t ncols,
              const char **head, const Py_ssize_t *head_len, const Py_ssize_t *keys, Py_ssize_t nkeys,
              const Py_ssize_t *toast, Py_ssize_t ntoast, Py_ssize_t min_chars, const char **start, Py_ssize_t *size)
{
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL)
            return 0;  /* not whole lines */
        /* The fields: COPY TO escapes every tab inside a value, so each raw tab separates two. */
        Py_ssize_t n = 0;
        const char *f = p;
        while (1) {
            const char *tab = memchr(f, '\t', (size_t)(eol - f));
            const char *stop = tab != NULL ? tab : eol;
            if (n == ncols)
                return 0;
            start[n] = f;
            size[n++] = stop - f;
            if (tab == NULL)
                break;
            f = tab + 1;
        }
        if (n != ncols)
            return 0;
        for (Py_ssize_t k = 0; k < nkeys; k++) {
            PUT(out, start[keys[k]], size[keys[k]]);
            PUTC(out, '\t');
        }
        for (Py_ssize_t i = 0; i < ncols; i++) {
            PUT(out, head[i], head_len[i]);
            const char *s = start[i];
            Py_ssize_t len = size[i];
            if (len == 2 && s[0] == '\\' && s[1] == 'N') {
                PUT(out, "null", 4);
                continue;
            }
            int done = 1;
            switch (kind[i]) {
            case K_RAW:
                if (memchr(s, '\\', (size_t)len) != NULL || len == 0)
                    return 0;
                PUT(out, s, len);
                break;
            case K_FLOAT:
                if (json_number(s, len))
                    PUT(out, s, len);
                else
                    done = put_string(out, s, len);
                break;
            case K_BOOL:
                if (len == 1 && s[0] == 't')
                    PUT(out, "true", 4);
                else if (len == 1 && s[0] == 'f')
                    PUT(out, "false", 5);
                else
                    return 0;
                break;
            case K_STRING:
                done = put_string(out, s, len);
                break;
            case K_TIMESTAMP:
            case K_TIMESTAMPTZ:
                done = put_timestamp(out, s, len, kind[i] == K_TIMESTAMPTZ);
                break;
            case K_BYTEA:
                done = put_bytea(out, s, len);
                break;
            default:
                return 0;  /* checked before the loop */
            }
            if (done <= 0)
                return done;
        }
        PUTC(out, '}');
        for (Py_ssize_t t = 0; t < ntoast; t++) {
            PUTC(out, '\t');
            const char *s = start[toast[t]];
            Py_ssize_t len = size[toast[t]];
            int null = len == 2 && s[0] == '\\' && s[1] == 'N';
            if (!null && char_length(s, len) >= min_chars)
                PUT(out, s, len);
        }
        PUTC(out, '\n');
        p = eol + 1;
    }
    return 1;
error:
    return -1;
}

void
copyjson_spec_free(Spec *spec)
{
    PyMem_Free(spec->start);
    PyMem_Free(spec->size);
    PyMem_Free(spec->head);
    PyMem_Free(spec->head_len);
    PyMem_Free(spec->keys);
    PyMem_Free(spec->toast);
    memset(spec, 0, sizeof(*spec));
}

/* kinds (a buffer the caller keeps alive), heads (a tuple of bytes alive with the call), keys,
 * toast, min_chars. -1 with an error set (copyjson_spec_free it anyway). */
int
copyjson_spec_init(Spec *spec, Py_buffer *kinds, PyObject *heads, PyObject *keys_tuple, PyObject *toast_tuple,
          Py_ssize_t min_chars)
{
    memset(spec, 0, sizeof(*spec));
    Py_ssize_t ncols = spec->ncols = kinds->len;
    spec->kind = kinds->buf;
    spec->min_chars = min_chars;
    spec->start = PyMem_Malloc(sizeof(char *) * (size_t)(ncols + 1));
    spec->size = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(ncols + 1));
    spec->head = PyMem_Malloc(sizeof(char *) * (size_t)(ncols + 1));
    spec->head_len = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(ncols + 1));
    if (spec->start == NULL || spec->size == NULL || spec->head == NULL || spec->head_len == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (!PyTuple_Check(heads) || PyTuple_GET_SIZE(heads) != ncols) {
        PyErr_SetString(PyExc_ValueError, "one head per column");
        return -1;
    }
    for (Py_ssize_t i = 0; i < ncols; i++) {
        PyObject *h = PyTuple_GET_ITEM(heads, i);
        if (!PyBytes_Check(h)) {
            PyErr_SetString(PyExc_TypeError, "heads must be bytes");
            return -1;
        }
        if (spec->kind[i] < K_RAW || spec->kind[i] > K_BYTEA) {
            PyErr_Format(PyExc_ValueError, "unknown column kind %d", spec->kind[i]);
            return -1;
        }
        spec->head[i] = PyBytes_AS_STRING(h);
        spec->head_len[i] = PyBytes_GET_SIZE(h);
    }
    if (indexes(keys_tuple, ncols, &spec->keys, &spec->nkeys) < 0 ||
        indexes(toast_tuple, ncols, &spec->toast, &spec->ntoast) < 0)
        return -1;
    return 0;
}

int
copyjson_spec_rewrite(Buf *out, const Spec *spec, const char *p, const char *end)
{
    return rewrite_block(out, p, end, spec->kind, spec->ncols, spec->head, spec->head_len, spec->keys, spec->nkeys,
                         spec->toast, spec->ntoast, spec->min_chars, spec->start, spec->size);
}

static PyObject *
copyjson_rewrite(PyObject *self, PyObject *args)
{
    Py_buffer block, kinds;
    PyObject *heads, *keys_tuple, *toast_tuple;
    Py_ssize_t min_chars;
    if (!PyArg_ParseTuple(args, "y*y*O!OOn", &block, &kinds, &PyTuple_Type, &heads, &keys_tuple, &toast_tuple,
                          &min_chars))
        return NULL;
    PyObject *result = NULL;
    Buf out = {NULL, 0, 0};
    Spec spec;
    if (copyjson_spec_init(&spec, &kinds, heads, keys_tuple, toast_tuple, min_chars) < 0)
        goto done;
    out.cap = block.len * 2 + 4096;
    if ((out.data = malloc((size_t)out.cap)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int taken;
    /* Without the GIL: a reader thread makes its block's JSON while the publishing thread runs. */
    Py_BEGIN_ALLOW_THREADS
    taken = copyjson_spec_rewrite(&out, &spec, block.buf, (const char *)block.buf + block.len);
    Py_END_ALLOW_THREADS
    if (taken < 0)
        PyErr_NoMemory();
    else if (taken == 0)
        result = Py_NewRef(Py_None);
    else
        result = PyBytes_FromStringAndSize(out.data, out.len);
done:
    free(out.data);
    copyjson_spec_free(&spec);
    PyBuffer_Release(&block);
    PyBuffer_Release(&kinds);
    return result;
}

static PyMethodDef methods[] = {
    {"int_key_events", copyjson_int_key_events, METH_VARARGS,
     "int_key_events(block, new_event, head, key_name, fragment, tail, min_chars) -> list, or None"},
    {"int_key_rows", copyjson_int_key_rows, METH_VARARGS,
     "int_key_rows(block, min_chars) -> number of lines, or None for a block that cannot go to the log as it is"},
#ifdef CDC_WITH_LIBPQ
    {"copy_out", copyjson_copy_out, METH_VARARGS,
     "copy_out(conn, sql, emit, lines, spec) -> (rows, bytes, sqlstate, message, connection_bad)"},
    {"libpq_version", copyjson_libpq_version, METH_NOARGS, "libpq_version() -> PQlibVersion() of the linked libpq"},
#endif
    {"rewrite", copyjson_rewrite, METH_VARARGS,
     "rewrite(block, kinds, heads, keys, toast, min_chars) -> bytes, or None for a block it does not take"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sources.postgres._copyjson", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__copyjson(void)
{
    return PyModule_Create(&module);
}
