/* A snapshot block of a table keyed by one integer column, read in C (see _copyjson.c). */
#include "_copyjson.h"

/* The next line of an integer-keyed block from p: its end (the '\n'), with *tab at the tab after
 * the key, or NULL when the line is not the common case (no '\n' before end, min_chars bytes or
 * more, a key that is not 1-19 plain decimal digits with an optional '-'; with canonical, also a
 * key orjson would not write so: a leading zero or "-0"). */
static const char *
int_key_line(const char *p, const char *end, Py_ssize_t min_chars, int canonical, const char **tab)
{
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (eol == NULL || eol - p >= min_chars)
        return NULL;
    const char *t = memchr(p, '\t', (size_t)(eol - p));
    if (t == NULL || t == p || t - p > 19)
        return NULL;
    const char *q = p;
    if (*q == '-')
        q++;
    if (q == t || (canonical && *q == '0' && (t - q > 1 || q > p)))
        return NULL;
    for (; q < t; q++)
        if (*q < '0' || *q > '9')
            return NULL;
    *tab = t;
    return eol;
}

/* int_key_events(block, new_event, head, key_name, fragment, tail, min_chars) -> list | None
 *   The snapshot's events of a block of the statement's lines (key text, row JSON, TOAST fields)
 *   for a table keyed by one integer column, in C: per line the event
 *     new_event(head + ({key_name: int(key)}, None, fragment(row JSON)) + tail)
 *   i.e. tuple.__new__(ChangeEvent, ...), as SnapshotRows.plan's build_batch makes it. None when
 *   the block is not the common case (a backslash anywhere, a line of min_chars bytes or more, a
 *   key that is not plain decimal digits): build_batch and the line-by-line path take it then. */
PyObject *
copyjson_int_key_events(PyObject *self, PyObject *args)
{
    Py_buffer block;
    PyObject *new_event, *head, *key_name, *fragment, *tail;
    Py_ssize_t min_chars;
    if (!PyArg_ParseTuple(args, "y*OO!UOO!n", &block, &new_event, &PyTuple_Type, &head, &key_name, &fragment,
                          &PyTuple_Type, &tail, &min_chars))
        return NULL;
    const char *p = block.buf, *end = p + block.len;
    PyObject *events = NULL;
    if (memchr(p, '\\', (size_t)block.len) != NULL)
        goto refuse;
    Py_ssize_t nhead = PyTuple_GET_SIZE(head), ntail = PyTuple_GET_SIZE(tail), size = nhead + 3 + ntail;
    if ((events = PyList_New(0)) == NULL)
        goto error;
    while (p < end) {
        const char *tab, *eol = int_key_line(p, end, min_chars, 0, &tab);
        if (eol == NULL)
            goto refuse;
        const char *json = tab + 1, *json_end = memchr(json, '\t', (size_t)(eol - json));
        if (json_end == NULL)
            json_end = eol;
        char digits[24];
        memcpy(digits, p, (size_t)(tab - p));
        digits[tab - p] = 0;
        PyObject *key_value = PyLong_FromString(digits, NULL, 10);
        PyObject *key = key_value ? PyDict_New() : NULL;
        if (key == NULL || PyDict_SetItem(key, key_name, key_value) < 0) {
            Py_XDECREF(key_value);
            Py_XDECREF(key);
            goto error;
        }
        Py_DECREF(key_value);
        PyObject *text = PyBytes_FromStringAndSize(json, json_end - json);
        PyObject *after = text ? PyObject_CallOneArg(fragment, text) : NULL;
        Py_XDECREF(text);
        PyObject *items = after ? PyTuple_New(size) : NULL;
        if (items == NULL) {
            Py_DECREF(key);
            Py_XDECREF(after);
            goto error;
        }
        for (Py_ssize_t i = 0; i < nhead; i++)
            PyTuple_SET_ITEM(items, i, Py_NewRef(PyTuple_GET_ITEM(head, i)));
        PyTuple_SET_ITEM(items, nhead, key);
        PyTuple_SET_ITEM(items, nhead + 1, Py_NewRef(Py_None));
        PyTuple_SET_ITEM(items, nhead + 2, after);
        for (Py_ssize_t i = 0; i < ntail; i++)
            PyTuple_SET_ITEM(items, nhead + 3 + i, Py_NewRef(PyTuple_GET_ITEM(tail, i)));
        PyObject *event = PyObject_CallOneArg(new_event, items);
        Py_DECREF(items);
        if (event == NULL)
            goto error;
        int appended = PyList_Append(events, event);
        Py_DECREF(event);
        if (appended < 0)
            goto error;
        p = eol + 1;
    }
    PyBuffer_Release(&block);
    return events;
refuse:
    Py_XDECREF(events);
    PyBuffer_Release(&block);
    Py_RETURN_NONE;
error:
    Py_XDECREF(events);
    PyBuffer_Release(&block);
    return NULL;
}

/* int_key_rows(block, min_chars) -> number of lines | None
 *   Whether a block can go to the log as it is (cdc.events.RowBlock): int_key_events would take it
 *   (no backslash, every line shorter than min_chars with a key of decimal digits) and every key is
 *   written as orjson writes the int (no leading zero, no "-0"), so that the key text is the
 *   record key's digits. The number of lines, or None when not. */
PyObject *
copyjson_int_key_rows(PyObject *self, PyObject *args)
{
    Py_buffer block;
    Py_ssize_t min_chars, lines = 0;
    if (!PyArg_ParseTuple(args, "y*n", &block, &min_chars))
        return NULL;
    const char *p = block.buf, *end = p + block.len;
    if (block.len == 0 || memchr(p, '\\', (size_t)block.len) != NULL)
        goto refuse;
    while (p < end) {
        const char *tab, *eol = int_key_line(p, end, min_chars, 1, &tab);
        if (eol == NULL)
            goto refuse;
        lines++;
        p = eol + 1;
    }
    PyBuffer_Release(&block);
    return PyLong_FromSsize_t(lines);
refuse:
    PyBuffer_Release(&block);
    Py_RETURN_NONE;
}
