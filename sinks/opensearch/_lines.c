/* The OpenSearch sink's hot loops in C: a batch reduced to the newest action per document
 * (reduce, the twin of documents.reduce; in _lines_reduce.c), and the bulk items of one
 * topic's reduced actions with their NDJSON lines (encode).
 *
 * Optional: sinks/opensearch/lines.py uses it when setup.py built it and otherwise runs its own
 * Python loop, which is the reference: both make the same items and the same bytes
 * (tests/unit/test_opensearch_lines.py compares them). What moves to C is the per-document work
 * around orjson.dumps: unpacking the action, the action line, adding the version field to the
 * row's JSON (spliced in before its closing brace instead of copying the row into a new dict),
 * and making the Item.
 *
 * encode(actions, index, index_json, floor, body_of, items, lines, rest) -> None
 *   actions     Upsert / Delete / Tombstone tuples (documents.py); Tombstones are appended to
 *               `rest` for the caller (they need a lookup in the index first)
 *   index_json  the index name as a JSON string (bytes)
 *   floor       None or an int: upserts and deletes older than it are dropped (a truncate's)
 *   body_of     None (the row is the document) or the table layout's body(row)
 *   fields      for rows as JSON bytes: None (the row is the document) or the layout (see "rows
 *               as JSON bytes" in _lines_raw.c); such a row's Item.body is its document's JSON bytes
 *               (without the version field)
 *
 * _lines.h declares what the units of this extension share.
 */
#include "_lines.h"

static PyObject *dumps, *dumps_option, *dumps_kwnames, *upsert_type, *delete_type, *item_type;
static PyObject *tombstone_body, *version_key, *external, *loads;
PyObject *lines_version_key_json;

static PyObject *
lines_setup(PyObject *self, PyObject *args)
{
    PyObject *d, *o, *u, *del, *it, *tb, *vk, *ext, *l;
    if (!PyArg_ParseTuple(args, "OOOOOOUUO", &d, &o, &u, &del, &it, &tb, &vk, &ext, &l))
        return NULL;
    Py_XSETREF(loads, Py_NewRef(l));
    Py_XSETREF(dumps, Py_NewRef(d));
    Py_XSETREF(dumps_option, Py_NewRef(o));
    Py_XSETREF(upsert_type, Py_NewRef(u));
    Py_XSETREF(delete_type, Py_NewRef(del));
    Py_XSETREF(item_type, Py_NewRef(it));
    Py_XSETREF(tombstone_body, Py_NewRef(tb));
    Py_XSETREF(version_key, Py_NewRef(vk));
    Py_XSETREF(external, Py_NewRef(ext));
    /* Interned: orjson tells its keyword arguments apart by identity. */
    PyObject *option_name = PyUnicode_InternFromString("option");
    if (option_name == NULL)
        return NULL;
    Py_XSETREF(dumps_kwnames, PyTuple_Pack(1, option_name));
    Py_DECREF(option_name);
    if (dumps_kwnames == NULL)
        return NULL;
    PyObject *args1[1] = {version_key};
    Py_XSETREF(lines_version_key_json, PyObject_Vectorcall(dumps, args1, 1, NULL));
    if (lines_version_key_json == NULL)
        return NULL;
    Py_RETURN_NONE;
}

/* orjson.dumps(obj), or with option=OPT_NON_STR_KEYS where that fails (a dict with keys that are
 * not strings: rare, and the option costs about as much as the rest of the call); new bytes, or
 * NULL with an error. */
static PyObject *
dump(PyObject *obj)
{
    PyObject *args[2] = {obj, dumps_option};
    PyObject *out = PyObject_Vectorcall(dumps, args, 1, NULL);
    if (out == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        out = PyObject_Vectorcall(dumps, args, 1, dumps_kwnames);
    }
    if (out != NULL && !PyBytes_CheckExact(out)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "orjson.dumps returned no bytes");
        return NULL;
    }
    return out;
}

/* The JSON object data[0, size) (its closing brace last; `empty`: it has no member) with the
 * version field added as its last member: new bytes, or NULL with an error. */
PyObject *
lines_with_version(const char *data, Py_ssize_t size, int empty, const char *digits, Py_ssize_t ndigits)
{
    Py_ssize_t keylen = PyBytes_GET_SIZE(lines_version_key_json);
    PyObject *out = PyBytes_FromStringAndSize(NULL, size + (empty ? 0 : 1) + keylen + 1 + ndigits);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    memcpy(p, data, size - 1);
    p += size - 1;
    if (!empty)
        *p++ = ',';
    memcpy(p, PyBytes_AS_STRING(lines_version_key_json), keylen);
    p += keylen;
    *p++ = ':';
    memcpy(p, digits, ndigits);
    p += ndigits;
    *p = '}';
    return out;
}

/* The document's JSON: the body with the version field last. A body that is a dict without
 * that field gets it spliced into its JSON; any other one is copied into a new dict first, as
 * `{**body, VERSION_FIELD: version}` does. New bytes, or NULL with an error. */
static PyObject *
document_json(PyObject *body, PyObject *version, const char *digits, Py_ssize_t ndigits)
{
    if (PyDict_CheckExact(body)) {
        int has = PyDict_Contains(body, version_key);
        if (has < 0)
            return NULL;
        if (!has) {
            PyObject *json = dump(body);
            if (json == NULL)
                return NULL;
            Py_ssize_t size = PyBytes_GET_SIZE(json);
            PyObject *out = lines_with_version(PyBytes_AS_STRING(json), size, size == 2 /* "{}" */, digits, ndigits);
            Py_DECREF(json);
            return out;
        }
    }
    PyObject *copy = PyDict_New();
    if (copy == NULL)
        return NULL;
    if (PyDict_Update(copy, body) < 0 || PyDict_SetItem(copy, version_key, version) < 0) {
        Py_DECREF(copy);
        return NULL;
    }
    PyObject *json = dump(copy);
    Py_DECREF(copy);
    return json;
}

/* _id as a JSON string: quoted as is when it needs no escapes (the common case), else orjson's. */
static PyObject *
id_json(PyObject *doc_id)
{
    if (PyUnicode_CheckExact(doc_id) && PyUnicode_IS_ASCII(doc_id)) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(doc_id);
        const char *s = (const char *)PyUnicode_DATA(doc_id);
        Py_ssize_t i = 0;
        while (i < n && s[i] >= 0x20 && s[i] != '"' && s[i] != '\\' && s[i] != 0x7f)
            i++;
        if (i == n) {
            PyObject *out = PyBytes_FromStringAndSize(NULL, n + 2);
            if (out == NULL)
                return NULL;
            char *p = PyBytes_AS_STRING(out);
            p[0] = '"';
            memcpy(p + 1, s, n);
            p[n + 1] = '"';
            return out;
        }
    }
    PyObject *args[1] = {doc_id};
    return PyObject_Vectorcall(dumps, args, 1, NULL);
}

static const char HEAD[] = "{\"index\":{\"_index\":";
static const char ID[] = ",\"_id\":";
static const char VERSION[] = ",\"version\":";
static const char TAIL[] = ",\"version_type\":\"external\"}}\n";
#define LIT(s) (sizeof(s) - 1)

/* The item's line: action line, document, newline. New bytes or NULL. */
static PyObject *
line_of(PyObject *index_json, PyObject *idj, const char *digits, Py_ssize_t ndigits, PyObject *doc)
{
    Py_ssize_t ni = PyBytes_GET_SIZE(index_json), nid = PyBytes_GET_SIZE(idj), nd = PyBytes_GET_SIZE(doc);
    Py_ssize_t size = LIT(HEAD) + ni + LIT(ID) + nid + LIT(VERSION) + ndigits + LIT(TAIL) + nd + 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
#define PUT(src, n) do { memcpy(p, (src), (n)); p += (n); } while (0)
    PUT(HEAD, LIT(HEAD));
    PUT(PyBytes_AS_STRING(index_json), ni);
    PUT(ID, LIT(ID));
    PUT(PyBytes_AS_STRING(idj), nid);
    PUT(VERSION, LIT(VERSION));
    PUT(digits, ndigits);
    PUT(TAIL, LIT(TAIL));
    PUT(PyBytes_AS_STRING(doc), nd);
#undef PUT
    *p = '\n';
    return out;
}

/* Decimal text of an int (at most 64 bits) into buf[24]; its length or -1 with an error. */
static Py_ssize_t
digits_of(PyObject *value, char *buf)
{
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "a version must be an int, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "a version does not fit in 64 bits");
        return -1;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    return (Py_ssize_t)snprintf(buf, 24, "%lld", v);
}


static PyObject *
lines_encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "encode takes 8 or 9 arguments");
        return NULL;
    }
    if (dumps == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_lines.setup was not called");
        return NULL;
    }
    PyObject *index = args[1], *index_json = args[2], *floor = args[3], *body_of = args[4];
    PyObject *items = args[5], *lines = args[6], *rest = args[7];
    if (!PyBytes_CheckExact(index_json) || !PyList_Check(items) || !PyList_Check(lines) || !PyList_Check(rest)) {
        PyErr_SetString(PyExc_TypeError, "encode(actions, index, index_json: bytes, floor, body_of, list, list, list)");
        return NULL;
    }
    RawFields fields;
    RawMembers members = {NULL, 0, 0, NULL, 0};
    if (lines_raw_fields_of(nargs == 9 ? args[8] : Py_None, &fields) < 0) {
        lines_raw_fields_free(&fields);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "actions must be iterable");
    if (seq == NULL) {
        lines_raw_fields_free(&fields);
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *action = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *kind = (PyObject *)Py_TYPE(action);
        int upsert = kind == upsert_type;
        if (!upsert && kind != delete_type) {
            if (PyList_Append(rest, action) < 0)
                goto fail;
            continue;
        }
        /* Upsert(doc_id, version, row, event); Delete(doc_id, version, event) */
        PyObject *doc_id = PyTuple_GET_ITEM(action, 0), *version = PyTuple_GET_ITEM(action, 1);
        PyObject *event = PyTuple_GET_ITEM(action, upsert ? 3 : 2);
        if (floor != Py_None) {
            int older = PyObject_RichCompareBool(version, floor, Py_LT);
            if (older < 0)
                goto fail;
            if (older)
                continue;
        }
        char digits[24];
        Py_ssize_t ndigits = digits_of(version, digits);
        if (ndigits < 0)
            goto fail;
        PyObject *body, *doc;
        if (upsert) {
            PyObject *row = PyTuple_GET_ITEM(action, 2), *decoded = NULL;
            if (PyBytes_CheckExact(row) && (body_of == Py_None || fields.names != NULL)) {  /* raw_rows */
                if ((body = lines_raw_body(row, &fields, &members)) == NULL)
                    goto fail;
                if (body != Py_None) {
                    doc = lines_raw_document(body, digits, ndigits);
                    goto made;
                }
                Py_DECREF(body);
            }
            if (PyBytes_CheckExact(row)) {  /* the dict way */
                if ((decoded = PyObject_CallOneArg(loads, row)) == NULL)
                    goto fail;
                row = decoded;
            }
            body = body_of == Py_None ? Py_NewRef(row) : PyObject_CallOneArg(body_of, row);
            Py_XDECREF(decoded);
            if (body == NULL)
                goto fail;
            doc = document_json(body, version, digits, ndigits);
        } else {
            if ((body = PyObject_CallOneArg(tombstone_body, version)) == NULL)
                goto fail;
            doc = dump(body);
        }
    made:;
        PyObject *idj = doc ? id_json(doc_id) : NULL;
        PyObject *line = idj ? line_of(index_json, idj, digits, ndigits, doc) : NULL;
        Py_XDECREF(doc);
        Py_XDECREF(idj);
        if (line == NULL) {
            Py_DECREF(body);
            goto fail;
        }
        /* Item(index, doc_id, version, body, event, "external", line) */
        PyObject *fields[7] = {index, doc_id, version, body, event, external, line};
        PyObject *item = ((PyTypeObject *)item_type)->tp_alloc((PyTypeObject *)item_type, 7);
        if (item == NULL) {
            Py_DECREF(body);
            Py_DECREF(line);
            goto fail;
        }
        for (int f = 0; f < 7; f++)
            PyTuple_SET_ITEM(item, f, Py_NewRef(fields[f]));
        Py_DECREF(body);
        int failed = PyList_Append(items, item) < 0 || PyList_Append(lines, line) < 0;
        Py_DECREF(item);
        Py_DECREF(line);
        if (failed)
            goto fail;
    }
    Py_DECREF(seq);
    lines_raw_fields_free(&fields);
    PyMem_Free(members.items);
    PyMem_Free(members.slots);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    lines_raw_fields_free(&fields);
    PyMem_Free(members.items);
    PyMem_Free(members.slots);
    return NULL;
}

static PyMethodDef methods[] = {
    {"setup", lines_setup, METH_VARARGS,
     "setup(orjson.dumps, OPT_NON_STR_KEYS, Upsert, Delete, Item, tombstone_body, VERSION_FIELD, 'external', orjson.loads)"},
    {"encode", (PyCFunction)(void (*)(void))lines_encode, METH_FASTCALL,
     "encode(actions, index, index_json, floor, body_of, items, lines, rest[, fields]) -> None"},
    {"reduce", (PyCFunction)(void (*)(void))lines_reduce, METH_FASTCALL,
     "reduce(events, TopicActions, Op.TRUNCATE, Op.DELETE, Upsert, Delete, Tombstone, max_id_bytes) -> dict or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sinks.opensearch._lines", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__lines(void)
{
    return PyModule_Create(&module);
}
