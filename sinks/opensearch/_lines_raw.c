/* ---- rows as JSON bytes (the runtime's raw_rows), for the encode of _lines.c -----------------
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
#include "_lines.h"

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


int
lines_raw_fields_of(PyObject *fields, RawFields *f)
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

void
lines_raw_fields_free(RawFields *f)
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
PyObject *
lines_raw_body(PyObject *row, const RawFields *f, RawMembers *m)
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
    const char *vk = PyBytes_AS_STRING(lines_version_key_json);
    Py_ssize_t vk_len = PyBytes_GET_SIZE(lines_version_key_json), size = 2;
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
PyObject *
lines_raw_document(PyObject *body, const char *digits, Py_ssize_t ndigits)
{
    const char *data = PyBytes_AS_STRING(body);
    Py_ssize_t size = PyBytes_GET_SIZE(body);
    while (size > 0 && data[size - 1] != '}')  /* trailing space */
        size--;
    const char *q = skip_space(data + 1, data + size - 1);
    int empty = q == data + size - 1;  /* "{}" */
    return lines_with_version(data, size, empty, digits, ndigits);
}
