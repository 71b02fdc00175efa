/* The OpenSearch sink's hot loops in C: a batch reduced to the newest action per document
 * (reduce, the twin of documents.reduce; at the end of this file), and the bulk items of one
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
 *               as JSON bytes" below); such a row's Item.body is its document's JSON bytes
 *               (without the version field)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *dumps, *dumps_option, *dumps_kwnames, *upsert_type, *delete_type, *item_type;
static PyObject *tombstone_body, *version_key, *version_key_json, *external, *loads;

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
    Py_XSETREF(version_key_json, PyObject_Vectorcall(dumps, args1, 1, NULL));
    if (version_key_json == NULL)
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
            const char *data = PyBytes_AS_STRING(json);
            Py_ssize_t keylen = PyBytes_GET_SIZE(version_key_json);
            int empty = size == 2;  /* "{}" */
            PyObject *out = PyBytes_FromStringAndSize(NULL, size + (empty ? 0 : 1) + keylen + 1 + ndigits);
            if (out == NULL) {
                Py_DECREF(json);
                return NULL;
            }
            char *p = PyBytes_AS_STRING(out);
            memcpy(p, data, size - 1);
            p += size - 1;
            if (!empty)
                *p++ = ',';
            memcpy(p, PyBytes_AS_STRING(version_key_json), keylen);
            p += keylen;
            *p++ = ':';
            memcpy(p, digits, ndigits);
            p += ndigits;
            *p = '}';
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


/* ---- rows as JSON bytes (the runtime's raw_rows) ---------------------------------------------
 *
 * A row the runtime left as the bytes of its JSON object (checked as strictly as orjson.loads
 * checks it, cdc/_decode.c) becomes its document without a dict: its top-level members are
 * found here, the table layout (include/exclude/rename, `fields`) picks and renames them, and the
 * version field is spliced in before the closing brace. A row this does not take as it is (a
 * member name with escapes, a name given twice, the version field already there, two members
 * renamed to one field) is decoded by orjson.loads and goes the dict way, so the document is the
 * one the dict would make.
 *
 * fields: None (the row is the document) or (keep_unknown, names, renamed): names[i] the UTF-8
 *   bytes of a column the layout mentions, renamed[i] the JSON string of its field name (bytes)
 *   or None (left out); keep_unknown whether a column not in names is kept (no include list). */

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

static const char *
skip_space(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

/* p at '"': past the closing quote, or NULL; *escaped when it holds a backslash. */
static const char *
past_string(const char *p, const char *end, int *escaped)
{
    for (p++; p < end; p++) {
        if (*p == '"')
            return p + 1;
        if (*p == '\\') {
            *escaped = 1;
            p++;
        }
    }
    return NULL;
}

/* p at a (checked) value: past its end, or NULL. */
static const char *
past_value(const char *p, const char *end)
{
    int escaped = 0;
    if (p >= end)
        return NULL;
    if (*p == '"')
        return past_string(p, end, &escaped);
    if (*p == '{' || *p == '[') {
        Py_ssize_t depth = 0;
        while (p < end) {
            char c = *p;
            if (c == '"') {
                if ((p = past_string(p, end, &escaped)) == NULL)
                    return NULL;
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return p + 1;
            p++;
        }
        return NULL;
    }
    while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n' && *p != '\r' && *p != '\t')
        p++;
    return p;
}

static uint64_t
name_hash(const char *p, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ULL;  /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

/* Whether two of the members share a name (by field, when `by_field`); -1 out of memory. */
static int
has_duplicate(RawMembers *m, int by_field)
{
    Py_ssize_t want = 16;
    while (want < 2 * m->len)
        want *= 2;
    if (m->nslots < want) {
        Py_ssize_t *grown = PyMem_Realloc(m->slots, want * sizeof(Py_ssize_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        m->slots = grown;
        m->nslots = want;
    }
    Py_ssize_t mask = want - 1;
    for (Py_ssize_t i = 0; i < want; i++)
        m->slots[i] = -1;
    for (Py_ssize_t i = 0; i < m->len; i++) {
        const RawMember *a = &m->items[i];
        const char *name = by_field ? a->field : a->name;
        Py_ssize_t len = by_field ? a->field_len : a->name_len;
        if (name == NULL)
            continue;  /* left out */
        Py_ssize_t slot = (Py_ssize_t)(name_hash(name, len) & (uint64_t)mask);
        while (m->slots[slot] >= 0) {
            const RawMember *b = &m->items[m->slots[slot]];
            const char *other = by_field ? b->field : b->name;
            Py_ssize_t olen = by_field ? b->field_len : b->name_len;
            if (olen == len && memcmp(other, name, len) == 0)
                return 1;
            slot = (slot + 1) & mask;
        }
        m->slots[slot] = i;
    }
    return 0;
}

/* The members of the row object [p, end): 1, 0 when the row is not taken as it is (not an
 * object, a name with escapes), -1 out of memory. */
static int
split_members(const char *p, const char *end, RawMembers *m)
{
    m->len = 0;
    p = skip_space(p, end);
    if (p >= end || *p != '{')
        return 0;
    p = skip_space(p + 1, end);
    if (p < end && *p == '}')
        return 1;
    for (;;) {
        int escaped = 0;
        if (p >= end || *p != '"')
            return 0;
        RawMember item;
        item.name = p + 1;
        if ((p = past_string(p, end, &escaped)) == NULL || escaped)
            return 0;
        item.name_len = p - 1 - item.name;
        p = skip_space(p, end);
        if (p >= end || *p != ':')
            return 0;
        p = skip_space(p + 1, end);
        item.value = p;
        if ((p = past_value(p, end)) == NULL)
            return 0;
        item.value_len = p - item.value;
        item.field = item.name - 1;
        item.field_len = item.name_len + 2;
        if (m->len == m->cap) {
            Py_ssize_t cap = m->cap ? m->cap * 2 : 32;
            RawMember *grown = PyMem_Realloc(m->items, cap * sizeof(RawMember));
            if (grown == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            m->items = grown;
            m->cap = cap;
        }
        m->items[m->len++] = item;
        p = skip_space(p, end);
        if (p < end && *p == ',') {
            p = skip_space(p + 1, end);
            continue;
        }
        return p < end && *p == '}';
    }
}

/* The layout, unpacked once per encode call. */
typedef struct {
    int keep_unknown;
    Py_ssize_t count;
    const char **names;
    Py_ssize_t *name_lens;
    PyObject **renamed;      /* borrowed: bytes or Py_None */
} RawFields;

static int
raw_fields_of(PyObject *fields, RawFields *f)
{
    memset(f, 0, sizeof(*f));
    if (fields == Py_None)
        return 0;
    PyObject *names, *renamed;
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != 3 || !PyTuple_Check(names = PyTuple_GET_ITEM(fields, 1))
            || !PyTuple_Check(renamed = PyTuple_GET_ITEM(fields, 2)) || PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(renamed)) {
        PyErr_SetString(PyExc_TypeError, "fields: (keep_unknown, names: tuple of bytes, renamed: tuple)");
        return -1;
    }
    if ((f->keep_unknown = PyObject_IsTrue(PyTuple_GET_ITEM(fields, 0))) < 0)
        return -1;
    f->count = PyTuple_GET_SIZE(names);
    f->names = PyMem_Malloc((f->count + 1) * sizeof(char *));
    f->name_lens = PyMem_Malloc((f->count + 1) * sizeof(Py_ssize_t));
    f->renamed = PyMem_Malloc((f->count + 1) * sizeof(PyObject *));
    if (f->names == NULL || f->name_lens == NULL || f->renamed == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < f->count; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i), *field = PyTuple_GET_ITEM(renamed, i);
        if (!PyBytes_Check(name) || (field != Py_None && !PyBytes_Check(field))) {
            PyErr_SetString(PyExc_TypeError, "fields: names are bytes, renamed bytes or None");
            return -1;
        }
        f->names[i] = PyBytes_AS_STRING(name);
        f->name_lens[i] = PyBytes_GET_SIZE(name);
        f->renamed[i] = field;
    }
    return 0;
}

static void
raw_fields_free(RawFields *f)
{
    PyMem_Free(f->names);
    PyMem_Free(f->name_lens);
    PyMem_Free(f->renamed);
}

/* Each member's field name under the layout (NULL: left out). */
static void
apply_fields(RawMembers *m, const RawFields *f)
{
    for (Py_ssize_t i = 0; i < m->len; i++) {
        RawMember *item = &m->items[i];
        Py_ssize_t j = 0;
        for (; j < f->count; j++)
            if (f->name_lens[j] == item->name_len && memcmp(f->names[j], item->name, item->name_len) == 0)
                break;
        if (j == f->count) {
            if (!f->keep_unknown)
                item->field = NULL;
        } else if (f->renamed[j] == Py_None) {
            item->field = NULL;
        } else {
            item->field = PyBytes_AS_STRING(f->renamed[j]);
            item->field_len = PyBytes_GET_SIZE(f->renamed[j]);
        }
    }
}

/* The document of a raw row, without the version field (new bytes), or Py_None when the row goes
 * the dict way (see above), or NULL with an error. */
static PyObject *
raw_body(PyObject *row, const RawFields *f, RawMembers *m)
{
    const char *data = PyBytes_AS_STRING(row);
    int ok = split_members(data, data + PyBytes_GET_SIZE(row), m);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    int dup = has_duplicate(m, 0);
    if (dup != 0)
        return dup < 0 ? NULL : Py_NewRef(Py_None);
    if (f->names != NULL) {
        apply_fields(m, f);
        if ((dup = has_duplicate(m, 1)) != 0)
            return dup < 0 ? NULL : Py_NewRef(Py_None);
    }
    const char *vk = PyBytes_AS_STRING(version_key_json);
    Py_ssize_t vk_len = PyBytes_GET_SIZE(version_key_json), size = 2;
    for (Py_ssize_t i = 0; i < m->len; i++) {
        const RawMember *item = &m->items[i];
        if (item->field == NULL)
            continue;
        if (item->field_len == vk_len && memcmp(item->field, vk, vk_len) == 0)
            return Py_NewRef(Py_None);  /* the row has the version field: the dict way replaces it */
        size += item->field_len + 1 + item->value_len + 1;
    }
    if (f->names == NULL)
        return Py_NewRef(row);  /* the row is the document as it is */
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out), *start = p;
    *p++ = '{';
    for (Py_ssize_t i = 0; i < m->len; i++) {
        const RawMember *item = &m->items[i];
        if (item->field == NULL)
            continue;
        if (p - start > 1)
            *p++ = ',';
        memcpy(p, item->field, item->field_len);
        p += item->field_len;
        *p++ = ':';
        memcpy(p, item->value, item->value_len);
        p += item->value_len;
    }
    *p++ = '}';
    if (_PyBytes_Resize(&out, p - start) < 0)
        return NULL;
    return out;
}

/* The document's JSON from a body of JSON bytes (an object without the version field). */
static PyObject *
raw_document(PyObject *body, const char *digits, Py_ssize_t ndigits)
{
    const char *data = PyBytes_AS_STRING(body);
    Py_ssize_t size = PyBytes_GET_SIZE(body);
    while (size > 0 && data[size - 1] != '}')  /* trailing space */
        size--;
    const char *q = skip_space(data + 1, data + size - 1);
    int empty = q == data + size - 1;  /* "{}" */
    Py_ssize_t keylen = PyBytes_GET_SIZE(version_key_json);
    PyObject *out = PyBytes_FromStringAndSize(NULL, size + (empty ? 0 : 1) + keylen + 1 + ndigits);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    memcpy(p, data, size - 1);
    p += size - 1;
    if (!empty)
        *p++ = ',';
    memcpy(p, PyBytes_AS_STRING(version_key_json), keylen);
    p += keylen;
    *p++ = ':';
    memcpy(p, digits, ndigits);
    p += ndigits;
    *p = '}';
    return out;
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
    if (raw_fields_of(nargs == 9 ? args[8] : Py_None, &fields) < 0) {
        raw_fields_free(&fields);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "actions must be iterable");
    if (seq == NULL) {
        raw_fields_free(&fields);
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
                if ((body = raw_body(row, &fields, &members)) == NULL)
                    goto fail;
                if (body != Py_None) {
                    doc = raw_document(body, digits, ndigits);
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
    raw_fields_free(&fields);
    PyMem_Free(members.items);
    PyMem_Free(members.slots);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    raw_fields_free(&fields);
    PyMem_Free(members.items);
    PyMem_Free(members.slots);
    return NULL;
}


/* ---- reduce: documents.reduce for the common batch, in C --------------------------------------
 *
 * reduce(events, TopicActions, Op.TRUNCATE, Op.DELETE, Upsert, Delete, Tombstone, max_id_bytes)
 *   -> {topic: TopicActions} or None
 * The same state machine as documents.reduce for batches whose events are inserts, updates,
 * reads, deletes and tombstones (with their delete's version, a delete; without, a Tombstone
 * action) with a key of one column that is an int or a str of at most
 * max_id_bytes UTF-8 bytes (its _id is its text). At the first event outside that (a truncate, a
 * composite key, ...) it returns None and documents.reduce does the whole batch. */

static PyObject *
id_of(PyObject *key, Py_ssize_t max_id_bytes)
{
    if (!PyDict_CheckExact(key) || PyDict_GET_SIZE(key) != 1)
        return NULL;
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    PyDict_Next(key, &pos, &name, &value);
    if (PyLong_CheckExact(value))
        return PyObject_Str(value);
    if (PyUnicode_CheckExact(value)) {
        Py_ssize_t size;
        if (PyUnicode_AsUTF8AndSize(value, &size) == NULL)
            return NULL;
        if (size <= max_id_bytes)
            return Py_NewRef(value);
    }
    return NULL;
}

static PyObject *
lines_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "reduce takes 8 arguments");
        return NULL;
    }
    PyObject *events = args[0], *topic_actions = args[1], *op_truncate = args[2], *op_delete = args[3];
    PyObject *upsert = args[4], *delete = args[5], *tombstone = args[6];
    Py_ssize_t max_id_bytes = PyLong_AsSsize_t(args[7]);
    if (max_id_bytes == -1 && PyErr_Occurred())
        return NULL;
    if (!PyList_Check(events)) {
        PyErr_SetString(PyExc_TypeError, "events must be a list");
        return NULL;
    }
    PyObject *out = PyDict_New();         /* topic -> TopicActions */
    PyObject *dicts = PyDict_New();       /* topic -> its actions dict */
    if (out == NULL || dicts == NULL)
        goto fail;
    PyObject *last_topic = NULL, *actions = NULL;  /* borrowed */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *event = PyList_GET_ITEM(events, i);
        if (!PyTuple_Check(event) || PyTuple_GET_SIZE(event) < 8)
            goto fallback;
        /* SinkEvent(topic, partition, offset, key, op, before, after, version, source, ts_ms) */
        PyObject *topic = PyTuple_GET_ITEM(event, 0), *key = PyTuple_GET_ITEM(event, 3);
        PyObject *op = PyTuple_GET_ITEM(event, 4), *after = PyTuple_GET_ITEM(event, 6);
        PyObject *version = PyTuple_GET_ITEM(event, 7);
        if (op == op_truncate)
            goto fallback;
        if (topic != last_topic) {
            actions = PyDict_GetItemWithError(dicts, topic);
            if (actions == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                PyObject *made = PyDict_New();
                if (made == NULL)
                    goto fail;
                PyObject *entry = PyObject_CallFunctionObjArgs(topic_actions, topic, event, made, NULL);
                int stored = entry != NULL && PyDict_SetItem(out, topic, entry) == 0
                             && PyDict_SetItem(dicts, topic, made) == 0;
                Py_XDECREF(entry);
                Py_DECREF(made);
                if (!stored)
                    goto fail;
                actions = made;  /* dicts holds it */
            }
            last_topic = topic;
        }
        PyObject *doc_id = id_of(key, max_id_bytes);
        if (doc_id == NULL) {
            if (PyErr_Occurred())
                goto fail;
            goto fallback;
        }
        PyObject *previous = PyDict_GetItemWithError(actions, doc_id);  /* borrowed */
        if (previous == NULL && PyErr_Occurred()) {
            Py_DECREF(doc_id);
            goto fail;
        }
        PyObject *action = NULL;
        if (op == Py_None && version == Py_None) {
            PyObject *kind = previous ? (PyObject *)Py_TYPE(previous) : NULL;
            if (kind == delete) {
                Py_DECREF(doc_id);
                continue;
            }
            PyObject *floor = kind == upsert ? PyTuple_GET_ITEM(previous, 1)
                              : kind == tombstone ? PyTuple_GET_ITEM(previous, 1) : Py_None;
            action = PyObject_CallFunctionObjArgs(tombstone, doc_id, floor, event, NULL);
        } else {
            if (!PyLong_Check(version)) {
                Py_DECREF(doc_id);
                goto fallback;
            }
            if (previous != NULL && Py_TYPE(previous) != (PyTypeObject *)tombstone) {
                int newer = PyObject_RichCompareBool(PyTuple_GET_ITEM(previous, 1), version, Py_GE);
                if (newer < 0) {
                    Py_DECREF(doc_id);
                    goto fail;
                }
                if (newer) {
                    Py_DECREF(doc_id);
                    continue;
                }
            }
            int is_delete = op == op_delete || op == Py_None;  /* a tombstone with its delete's version */
            PyTypeObject *type = (PyTypeObject *)(is_delete ? delete : upsert);
            PyObject *row = after;
            if (!is_delete && !PyObject_IsTrue(after)) {  /* event.after or {} */
                if (PyErr_Occurred()) {
                    Py_DECREF(doc_id);
                    goto fail;
                }
                row = NULL;
            }
            action = type->tp_alloc(type, is_delete ? 3 : 4);
            if (action != NULL) {
                PyTuple_SET_ITEM(action, 0, Py_NewRef(doc_id));
                PyTuple_SET_ITEM(action, 1, Py_NewRef(version));
                if (is_delete) {
                    PyTuple_SET_ITEM(action, 2, Py_NewRef(event));
                } else {
                    PyObject *body = row ? Py_NewRef(row) : PyDict_New();
                    if (body == NULL) {
                        Py_DECREF(action);
                        action = NULL;
                    } else {
                        PyTuple_SET_ITEM(action, 2, body);
                        PyTuple_SET_ITEM(action, 3, Py_NewRef(event));
                    }
                }
            }
        }
        int stored = action != NULL && PyDict_SetItem(actions, doc_id, action) == 0;
        Py_XDECREF(action);
        Py_DECREF(doc_id);
        if (!stored)
            goto fail;
    }
    Py_DECREF(dicts);
    return out;
fallback:
    Py_DECREF(out);
    Py_DECREF(dicts);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    Py_XDECREF(dicts);
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
