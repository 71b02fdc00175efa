/* The newest version per key over a window of log records, in C (cdc/bulk_window.py).
 *
 * A bulk load of a fresh generation (cdc/runtime/sink_runner.py, "bulk rebuild") reads the topics
 * from offset 0 and keeps, per (topic, key), only the record with the highest source.version, by
 * version and never by offset (a replay after a crash can put an older version at a later
 * offset). This is cdc/sink_events.py's decoding and sinks' per-batch reduction (e.g.
 * sinks/sql/reduce.py) for the common record, done without the GIL and without a Python object
 * per record: each record's key and value are parsed in place, and the window copies only the
 * key and the newest row's bytes.
 *
 * Window(SinkEvent, ops)            ops: {"c": Op.CREATE, ...}
 * add(records, topics, ends, resolve)
 *                                   records: LogRecords (topic, partition, offset, key, value, ...);
 *                                   topics: {topic: id}, ids added for new topics; ends[(topic,
 *                                   partition)]: set to the offset after its last record. A record
 *                                   it does not take (see below) is handed to resolve(index), in its
 *                                   place in the order, which decodes it the general way and says
 *                                   what to keep (see window_add).
 * add_packed(data, count, names, topics, ends, resolve)
 *                                   the same for `count` records packed in `data` (bytes) as
 *                                   cdc/_rdconsume.c packs them, topic indexes into `names`
 * truncate(topic_id, version)       drops what is older; later records older than it are ignored
 * stats() -> (keys, bytes, read)    what the window holds (bytes: keys, rows and bookkeeping), and
 *                                   the bytes of the values of the records it took
 * shapes(topic_id) -> [schema_version or None]
 * take(topic_id, schema_version, topic, source, loads, start, limit) -> (upserts, deletes, next)
 *                                   at most `limit` of the keys from entry `start` on (next: where
 *                                   to go on, -1 at the end) whose newest record names that schema version:
 *                                   [(key JSON, SinkEvent)], after/before as bytes, the key
 *                                   decoded by loads (None: left None)
 * tombstones(topic_id) -> [key JSON] keys whose last word is a tombstone
 * truncated(topic_id) -> the newest truncate's version, or None
 * key_hashes() -> bytes             the 64-bit hash of every (topic id, key) held, sorted (native
 *                                   uint64s): for hashes_meet/hashes_union below
 * clear()
 *
 * hashes_meet(a, b) -> bool         whether two sorted hash arrays share a value
 * hashes_union(a, b) -> bytes       their sorted union (a value in both once)
 *                                   (a staged bulk load, cdc/runtime/sink_runner.py, checks that a
 *                                   window holds no key an earlier window loaded: a shared hash,
 *                                   even a collision, only sends the window the guarded way)
 *
 * Per key the semantics are reduce.py's over one batch as large as the window: the newest
 * version wins; a tombstone marks the key until a newer version arrives; the result is an upsert
 * (newest r/c/u, no tombstone after it), a delete (newest d; remembered by the sink), or a
 * tombstone (the key's row, if any, goes). A tombstone whose cdc.version header (cdc/headers.py)
 * gives its delete's version is taken as that delete.
 *
 * Records it does not take, for the general decoder: a value that is not a plain JSON envelope
 * (Connect JSON, Avro, malformed: maybe poison), a tombstone whose headers are not readable or
 * whose cdc.version is not a decimal int64, a truncate, a missing or non-integer version,
 * an upsert whose after is not an object, and a key that is not JSON in orjson's compact form
 * (the key JSON is what the sink stores in remembered deletes, so it must be the bytes
 * orjson.dumps makes of the decoded key; a compact key of strings and integers already is).
 *
 * Threading: one thread uses a window at a time (a call made while another runs raises); `add`
 * releases the GIL while it parses and reduces.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "_logrecord.h"

#define NO_SCHEMA INT64_MIN

typedef struct {
    uint64_t hash;
    char *key;               /* key JSON, malloc'd */
    char *row;               /* after (upsert) or before (delete) JSON, malloc'd; NULL: none */
    int64_t version;
    int64_t schema_version;  /* NO_SCHEMA: the record named none */
    int64_t offset;
    uint32_t key_len, row_len;
    int32_t topic, partition;
    char op;                 /* 'c' 'u' 'r' 'd'; 0: only a tombstone seen */
    char tombstoned;
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *entries;          /* dense, in the order keys were first seen */
    uint32_t *slots;         /* open addressing: 1 + an index into entries; 0: empty */
    Py_ssize_t capacity, count, allocated;
    Py_ssize_t bytes;
    long long read_bytes;    /* of the record values added since the last clear */
    int64_t *truncates;      /* per topic id: newest truncate version, INT64_MIN if none */
    Py_ssize_t ntopics;
    int busy;
    PyObject *event_type, *ops;
    PyObject *op_objects[128];  /* borrowed from ops: op code -> Op */
} Window;

/* ---- hashing and the table -------------------------------------------------------------------- */

static uint64_t
hash_of(int32_t topic, const char *p, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)(uint32_t)topic;  /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static int
grow(Window *w)
{
    Py_ssize_t capacity = w->capacity ? w->capacity * 2 : 1024;
    if (capacity > (Py_ssize_t)UINT32_MAX) return 0;
    uint32_t *slots = calloc((size_t)capacity, sizeof(uint32_t));
    if (slots == NULL) return 0;
    for (Py_ssize_t i = 0; i < w->count; i++) {
        Py_ssize_t j = (Py_ssize_t)(w->entries[i].hash & (uint64_t)(capacity - 1));
        while (slots[j]) j = (j + 1) & (capacity - 1);
        slots[j] = (uint32_t)(i + 1);
    }
    w->bytes += (capacity - w->capacity) * (Py_ssize_t)sizeof(uint32_t);
    free(w->slots);
    w->slots = slots;
    w->capacity = capacity;
    return 1;
}

/* The entry of (topic, key), made if absent (op 0, version unset); NULL when out of memory. */
static Entry *
entry_for(Window *w, int32_t topic, const char *key, Py_ssize_t key_len, int *made)
{
    if ((w->count + 1) * 4 > w->capacity * 3 && !grow(w)) return NULL;
    if (w->count == w->allocated) {
        Py_ssize_t allocated = w->allocated ? w->allocated * 2 : 1024;
        Entry *entries = realloc(w->entries, (size_t)allocated * sizeof(Entry));
        if (entries == NULL) return NULL;
        w->bytes += (allocated - w->allocated) * (Py_ssize_t)sizeof(Entry);
        w->entries = entries;
        w->allocated = allocated;
    }
    uint64_t h = hash_of(topic, key, key_len);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(w->capacity - 1));
    while (w->slots[j]) {
        Entry *e = &w->entries[w->slots[j] - 1];
        if (e->hash == h && e->topic == topic && e->key_len == (uint32_t)key_len && memcmp(e->key, key, key_len) == 0) {
            *made = 0;
            return e;
        }
        j = (j + 1) & (w->capacity - 1);
    }
    char *copy = malloc(key_len ? (size_t)key_len : 1);
    if (copy == NULL) return NULL;
    memcpy(copy, key, key_len);
    Entry *e = &w->entries[w->count];
    memset(e, 0, sizeof(Entry));
    e->hash = h;
    e->key = copy;
    e->key_len = (uint32_t)key_len;
    e->topic = topic;
    e->version = INT64_MIN;
    e->schema_version = NO_SCHEMA;
    w->slots[j] = (uint32_t)(++w->count);
    w->bytes += key_len + 16;  /* malloc's own overhead, roughly */
    *made = 1;
    return e;
}

/* One change into the window: 1 done, 0 out of memory. */
static int
apply(Window *w, int32_t topic, const char *key, Py_ssize_t key_len, char op, int64_t version,
      const char *row, Py_ssize_t row_len, int64_t schema_version, int32_t partition, int64_t offset)
{
    if (op && topic < w->ntopics && version < w->truncates[topic]) return 1;  /* under a truncate */
    int made;
    Entry *e = entry_for(w, topic, key, key_len, &made);
    if (e == NULL) return 0;
    if (!op) {  /* a tombstone: the key's row goes, whatever its version, until a newer version comes */
        e->tombstoned = 1;
        e->partition = partition;
        e->offset = offset;
        return 1;
    }
    if (e->op && version <= e->version) return 1;  /* older (or the same) version: the newer stays */
    char *copy = NULL;
    if (row != NULL) {
        copy = malloc(row_len ? (size_t)row_len : 1);
        if (copy == NULL) return 0;
        memcpy(copy, row, row_len);
    }
    if (e->row != NULL) {
        w->bytes -= e->row_len + 16;
        free(e->row);
    }
    e->row = copy;
    e->row_len = copy ? (uint32_t)row_len : 0;
    if (copy) w->bytes += row_len + 16;
    e->op = op;
    e->version = version;
    e->schema_version = schema_version;
    e->partition = partition;
    e->offset = offset;
    e->tombstoned = 0;
    return 1;
}

static void
clear_all(Window *w)
{
    for (Py_ssize_t i = 0; i < w->count; i++) {
        free(w->entries[i].key);
        free(w->entries[i].row);
    }
    free(w->slots);
    free(w->entries);
    w->slots = NULL;
    w->entries = NULL;
    w->capacity = w->count = w->allocated = w->bytes = 0;
    w->read_bytes = 0;
    for (Py_ssize_t t = 0; t < w->ntopics; t++) w->truncates[t] = INT64_MIN;
}

/* ---- a JSON scanner: enough to find members and skip values, strict about structure ----------- */

typedef struct { const unsigned char *p, *end; } Scan;

static void
ws(Scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

/* A string at s->p (at its quote): 1 and s->p past it; *escaped set if it has a backslash. */
static int
skip_string(Scan *s, int *escaped)
{
    if (s->p >= s->end || *s->p != '"') return 0;
    s->p++;
    while (s->p < s->end) {
        unsigned char c = *s->p;
        if (c == '"') { s->p++; return 1; }
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (escaped) *escaped = 1;
            if (s->p + 1 >= s->end) return 0;
            s->p += 2;
            continue;
        }
        s->p++;
    }
    return 0;
}

static int skip_value(Scan *s, int depth);

static int
skip_container(Scan *s, int depth, unsigned char close)
{
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == close) { s->p++; return 1; }
    for (;;) {
        if (close == '}') {
            if (!skip_string(s, NULL)) return 0;
            ws(s);
            if (s->p >= s->end || *s->p != ':') return 0;
            s->p++;
            ws(s);
        }
        if (!skip_value(s, depth + 1)) return 0;
        ws(s);
        if (s->p >= s->end) return 0;
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == close) { s->p++; return 1; }
        return 0;
    }
}

static int
skip_value(Scan *s, int depth)
{
    if (s->p >= s->end || depth > 200) return 0;
    unsigned char c = *s->p;
    if (c == '"') return skip_string(s, NULL);
    if (c == '{') return skip_container(s, depth, '}');
    if (c == '[') return skip_container(s, depth, ']');
    if (c == 't' || c == 'f' || c == 'n') {
        const char *lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(lit);
        if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0) return 0;
        s->p += n;
        return 1;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        const unsigned char *start = s->p;
        if (*s->p == '-') s->p++;
        while (s->p < s->end && ((*s->p >= '0' && *s->p <= '9') || *s->p == '.' || *s->p == 'e' || *s->p == 'E'
                                 || *s->p == '+' || *s->p == '-'))
            s->p++;
        return s->p > start + (*start == '-');
    }
    return 0;
}

/* An integer value at s->p (JSON, no fraction or exponent, fits 64 bits): 1 and *out. */
static int
read_int(Scan *s, int64_t *out)
{
    int negative = 0;
    if (s->p < s->end && *s->p == '-') { negative = 1; s->p++; }
    if (s->p >= s->end || *s->p < '0' || *s->p > '9') return 0;
    if (*s->p == '0' && s->p + 1 < s->end && s->p[1] >= '0' && s->p[1] <= '9') return 0;
    uint64_t v = 0;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        uint64_t d = (uint64_t)(*s->p - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
        s->p++;
    }
    if (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E')) return 0;
    if (negative ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX) return 0;
    *out = negative ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

static int
name_is(const unsigned char *start, const unsigned char *end, const char *name)
{
    size_t n = strlen(name);
    return (size_t)(end - start) == n + 2 && memcmp(start + 1, name, n) == 0;
}

/* A compact key object as orjson.dumps writes it: no whitespace, no escapes, no fraction or
 * exponent (orjson's float text may differ from the producer's). */
static int
compact_key(const unsigned char *p, Py_ssize_t n)
{
    if (n < 2 || p[0] != '{' || p[n - 1] != '}') return 0;
    int in_string = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (in_string) {
            if (c == '\\' || c < 0x20) return 0;
            if (c == '"') in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '.' || c == 'E' ||
                   (c == 'e' && i > 0 && p[i - 1] >= '0' && p[i - 1] <= '9')) {
            return 0;
        }
    }
    Scan s = {p, p + n};
    return skip_value(&s, 0) && s.p == s.end;
}

/* The parts of a plain JSON envelope; 1 if it is one the window takes (see the top). */
typedef struct {
    char op;
    int64_t version, schema_version;
    const unsigned char *row;  /* after for c/u/r, before (or NULL) for d */
    Py_ssize_t row_len;
} Envelope;

static int
parse_source(Scan *s, Envelope *env, int *has_version)
{
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; return 1; }
    for (;;) {
        const unsigned char *name = s->p;
        if (!skip_string(s, NULL)) return 0;
        const unsigned char *name_end = s->p;
        ws(s);
        if (s->p >= s->end || *s->p != ':') return 0;
        s->p++;
        ws(s);
        if (name_is(name, name_end, "version")) {
            if (!read_int(s, &env->version)) return 0;
            *has_version = 1;
        } else if (name_is(name, name_end, "schema_version") && s->p < s->end && *s->p != 'n') {
            if (!read_int(s, &env->schema_version)) return 0;
        } else if (!skip_value(s, 2)) {
            return 0;
        }
        ws(s);
        if (s->p >= s->end) return 0;
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == '}') { s->p++; return 1; }
        return 0;
    }
}

static int
parse_envelope(const unsigned char *p, Py_ssize_t n, Envelope *env)
{
    Scan s = {p, p + n};
    const unsigned char *after = NULL, *after_end = NULL, *before = NULL, *before_end = NULL;
    int has_version = 0;
    env->op = 0;
    env->schema_version = NO_SCHEMA;
    ws(&s);
    if (s.p >= s.end || *s.p != '{') return 0;
    s.p++;
    ws(&s);
    if (s.p < s.end && *s.p == '}') return 0;
    for (;;) {
        const unsigned char *name = s.p;
        if (!skip_string(&s, NULL)) return 0;
        const unsigned char *name_end = s.p;
        ws(&s);
        if (s.p >= s.end || *s.p != ':') return 0;
        s.p++;
        ws(&s);
        const unsigned char *value = s.p;
        if (name_is(name, name_end, "source") && s.p < s.end && *s.p == '{') {
            if (!parse_source(&s, env, &has_version)) return 0;
        } else {
            if (!skip_value(&s, 1)) return 0;
            if (name_is(name, name_end, "op")) {
                if (s.p - value != 3 || value[0] != '"') return 0;
                env->op = (char)value[1];
            } else if (name_is(name, name_end, "after")) {
                after = value;
                after_end = s.p;
            } else if (name_is(name, name_end, "before")) {
                before = value;
                before_end = s.p;
            } else if (name_is(name, name_end, "schema") || name_is(name, name_end, "payload")) {
                return 0;  /* Connect JSON: the general decoder */
            }
        }
        ws(&s);
        if (s.p >= s.end) return 0;
        if (*s.p == ',') { s.p++; ws(&s); continue; }
        if (*s.p == '}') { s.p++; break; }
        return 0;
    }
    ws(&s);
    if (s.p != s.end || !has_version) return 0;
    switch (env->op) {
    case 'c': case 'u': case 'r':
        if (after == NULL || *after != '{') return 0;
        env->row = after;
        env->row_len = after_end - after;
        return 1;
    case 'd':
        env->row = before != NULL && *before == '{' ? before : NULL;
        env->row_len = env->row ? before_end - before : 0;
        return 1;
    default:
        return 0;  /* a truncate, or an op the general decoder names */
    }
}

/* ---- the type ----------------------------------------------------------------------------------- */

static int
enter(Window *w)
{
    if (w->busy) {
        PyErr_SetString(PyExc_RuntimeError, "a Window is used by one thread at a time");
        return 0;
    }
    w->busy = 1;
    return 1;
}

static int
ensure_topics(Window *w, Py_ssize_t n)
{
    if (n <= w->ntopics) return 1;
    int64_t *t = realloc(w->truncates, (size_t)n * sizeof(int64_t));
    if (t == NULL) { PyErr_NoMemory(); return 0; }
    for (Py_ssize_t i = w->ntopics; i < n; i++) t[i] = INT64_MIN;
    w->truncates = t;
    w->ntopics = n;
    return 1;
}

static void truncate_topic(Window *w, Py_ssize_t topic, int64_t version);

typedef struct {
    const char *key, *value;
    Py_ssize_t key_len, value_len;
    int64_t offset;
    int32_t topic, partition;
    char fallback;
    char versioned;   /* a tombstone whose cdc.version header gives its delete's version */
    int64_t version;
    PyObject *topic_name;  /* borrowed; NULL: the record named none the window could read */
} Item;

/* A cdc.version header's value (cdc/headers.py, version_of: "-" then 1 to 19 ASCII digits, an
 * int64): 1 and *version, 0 when it is not that. */
static int
decimal_version(const unsigned char *p, Py_ssize_t len, int64_t *version)
{
    int negative = len > 0 && p[0] == '-';
    p += negative;
    len -= negative;
    if (len < 1 || len > 19) return 0;
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX + negative) return 0;
    *version = negative ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

static int32_t
le32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* The last cdc.version header among headers packed as cdc/log/packed_headers.py packs them:
 * 1 and *version, 0 when there is none, -1 when the bytes or the value are not what they should
 * be (the general decoder then names the fault). */
static int
packed_version(const unsigned char *p, Py_ssize_t len, int64_t *version)
{
    const unsigned char *end = p + len, *value = NULL;
    int32_t value_len = 0;
    int seen = 0;
    while (p < end) {
        if (end - p < 4) return -1;
        int32_t name_len = le32(p);
        p += 4;
        if (name_len < 0 || end - p < name_len + 4) return -1;
        const unsigned char *name = p;
        p += name_len;
        int32_t n = le32(p);
        p += 4;
        if (n < -1 || end - p < (n > 0 ? n : 0)) return -1;
        if (name_len == 11 && memcmp(name, "cdc.version", 11) == 0) {
            seen = 1;
            value = n < 0 ? NULL : p;
            value_len = n;
        }
        p += n > 0 ? n : 0;
    }
    if (!seen) return 0;
    return value != NULL && decimal_version(value, value_len, version) ? 1 : -1;
}

/* As packed_version, for headers as a list of (name, value) pairs (a LogRecord's). */
static int
listed_version(PyObject *headers, int64_t *version)
{
    if (!PyList_Check(headers)) return -1;
    PyObject *value = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        PyObject *pair = PyList_GET_ITEM(headers, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)))
            return -1;
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(pair, 0), "cdc.version") == 0)
            value = PyTuple_GET_ITEM(pair, 1);
    }
    if (value == NULL) return 0;
    if (!PyBytes_Check(value)) return -1;
    return decimal_version((const unsigned char *)PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value), version) ? 1
                                                                                                                : -1;
}

/* A tombstone's headers read: versioned and its version set, or fallback where they are not
 * readable here. */
static void
tombstone_headers(Item *it, int found, int64_t version)
{
    if (found < 0) it->fallback = 1;
    it->versioned = found > 0;
    it->version = version;
}

static PyObject *reduce_items(Window *w, Item *items, Py_ssize_t n, PyObject *ends, PyObject *resolve);

/* The topic id of `topic` in `topics` ({name: id}), added if new; -1 with an exception set. */
static Py_ssize_t
topic_id(Window *w, PyObject *topics, PyObject *topic)
{
    PyObject *id = PyDict_GetItemWithError(topics, topic);
    if (id == NULL) {
        if (PyErr_Occurred()) return -1;
        id = PyLong_FromSsize_t(PyDict_GET_SIZE(topics));
        if (id == NULL || PyDict_SetItem(topics, topic, id) < 0) { Py_XDECREF(id); return -1; }
        Py_DECREF(id);
    }
    Py_ssize_t tid = PyLong_AsSsize_t(id);
    if (tid < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a topic id is >= 0");
        return -1;
    }
    return ensure_topics(w, tid + 1) ? tid : -1;
}

static PyObject *
window_add(Window *w, PyObject *args)
{
    PyObject *records, *topics, *ends, *resolve;
    if (!PyArg_ParseTuple(args, "O!O!O!O", &PyList_Type, &records, &PyDict_Type, &topics, &PyDict_Type, &ends,
                          &resolve))
        return NULL;
    if (!enter(w)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *result = NULL;
    Item *items = PyMem_Calloc(n ? n : 1, sizeof(Item));
    Py_INCREF(records);  /* its bytes are read without the GIL: they stay alive meanwhile */
    if (items == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        Item *it = &items[i];
        it->fallback = 1;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 5) continue;
        PyObject *topic = PyTuple_GET_ITEM(r, 0), *key = PyTuple_GET_ITEM(r, 3), *value = PyTuple_GET_ITEM(r, 4);
        Py_ssize_t tid = topic_id(w, topics, topic);
        if (tid < 0) goto done;
        long partition = PyLong_AsLong(PyTuple_GET_ITEM(r, 1));
        long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 2));
        if (PyErr_Occurred()) { PyErr_Clear(); continue; }
        it->topic = (int32_t)tid;
        it->partition = (int32_t)partition;
        it->offset = offset;
        it->topic_name = topic;
        if (!PyBytes_Check(key) || (value != Py_None && !PyBytes_Check(value))) continue;
        it->key = PyBytes_AS_STRING(key);
        it->key_len = PyBytes_GET_SIZE(key);
        it->value = value == Py_None ? NULL : PyBytes_AS_STRING(value);
        it->value_len = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
        w->read_bytes += it->value_len;
        it->fallback = 0;
        /* a tombstone with headers may carry its delete's version */
        if (value == Py_None && PyTuple_GET_SIZE(r) > 6 && PyTuple_GET_ITEM(r, 6) != Py_None) {
            int64_t version = 0;
            int found = listed_version(PyTuple_GET_ITEM(r, 6), &version);
            tombstone_headers(it, found, version);
        }
    }
    result = reduce_items(w, items, n, ends, resolve);
done:
    Py_DECREF(records);
    PyMem_Free(items);
    w->busy = 0;
    return result;
}

/* add_packed(data, count, names, topics, ends, resolve): as add, for `count` records packed in
 * `data` as cdc/_rdconsume.c's Reader.read packs them (a 36-byte header, then the key's, the
 * value's and the headers' bytes), whose topic indexes name `names`. */
static PyObject *
window_add_packed(Window *w, PyObject *args)
{
    PyObject *data, *names, *topics, *ends, *resolve;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!nO!O!O!O", &PyBytes_Type, &data, &n, &PyList_Type, &names, &PyDict_Type, &topics,
                          &PyDict_Type, &ends, &resolve))
        return NULL;
    if (!enter(w)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t nnames = PyList_GET_SIZE(names);
    Item *items = PyMem_Calloc(n > 0 ? n : 1, sizeof(Item));
    Py_ssize_t *tids = PyMem_Calloc(nnames ? nnames : 1, sizeof(Py_ssize_t));
    Py_INCREF(data);
    Py_INCREF(names);
    if (items == NULL || tids == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t t = 0; t < nnames; t++)
        if ((tids[t] = topic_id(w, topics, PyList_GET_ITEM(names, t))) < 0) goto done;
    const char *p = PyBytes_AS_STRING(data), *end = p + PyBytes_GET_SIZE(data);
    for (Py_ssize_t i = 0; i < n; i++) {
        PackedHead h;
        if (!packed_head(&p, end, &h)) goto damaged;
        int32_t topic = h.topic, partition = h.partition, key_len = h.key_len, value_len = h.value_len,
                headers_len = h.headers_len;
        int64_t offset = h.offset;
        if (topic < 0 || topic >= nnames || key_len < -1 || value_len < -1 || headers_len < -1
                || end - p < packed_body(&h))
            goto damaged;
        Item *it = &items[i];
        it->topic = (int32_t)tids[topic];
        it->topic_name = PyList_GET_ITEM(names, topic);
        it->partition = partition;
        it->offset = offset;
        it->key = key_len < 0 ? NULL : p;
        it->key_len = key_len < 0 ? 0 : key_len;
        p += it->key_len;
        it->value = value_len < 0 ? NULL : p;
        it->value_len = value_len < 0 ? 0 : value_len;
        p += it->value_len;
        w->read_bytes += it->value_len;
        /* a record without a key: the general decoder names it */
        it->fallback = it->key == NULL;
        /* a tombstone with headers may carry its delete's version */
        if (value_len < 0 && headers_len >= 0) {
            int64_t version = 0;
            int found = packed_version((const unsigned char *)p, headers_len, &version);
            tombstone_headers(it, found, version);
        }
        p += headers_len > 0 ? headers_len : 0;
    }
    result = reduce_items(w, items, n, ends, resolve);
    goto done;
damaged:
    PyErr_SetString(PyExc_ValueError, "add_packed: the data is not `count` packed records");
done:
    Py_DECREF(data);
    Py_DECREF(names);
    PyMem_Free(items);
    PyMem_Free(tids);
    w->busy = 0;
    return result;
}

/* The records of `items` into the window, in order (see add). */
static PyObject *
reduce_items(Window *w, Item *items, Py_ssize_t n, PyObject *ends, PyObject *resolve)
{
    PyObject *result = NULL;
    int oom = 0;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_BEGIN_ALLOW_THREADS
        for (; i < n && !oom; i++) {
            Item *it = &items[i];
            if (it->fallback) break;
            if (!compact_key((const unsigned char *)it->key, it->key_len)) { it->fallback = 1; break; }
            if (it->value == NULL) {  /* a tombstone: with its delete's version, that delete */
                oom = !apply(w, it->topic, it->key, it->key_len, it->versioned ? 'd' : 0, it->version, NULL, 0,
                             NO_SCHEMA, it->partition, it->offset);
                continue;
            }
            Envelope env;
            if (!parse_envelope((const unsigned char *)it->value, it->value_len, &env)) { it->fallback = 1; break; }
            oom = !apply(w, it->topic, it->key, it->key_len, env.op, env.version, (const char *)env.row, env.row_len,
                         env.schema_version, it->partition, it->offset);
        }
        Py_END_ALLOW_THREADS
        if (oom || i >= n) break;
        /* A record for the general decoder, in its place (a tombstone's effect depends on order):
         * resolve(index) -> None (nothing to keep: poison), or (topic id, key JSON, op, version, row,
         * schema_version) with op "c" "u" "r" "d", None (a tombstone) or "t" (a truncate). */
        PyObject *index = PyLong_FromSsize_t(i);
        PyObject *action = index ? PyObject_CallOneArg(resolve, index) : NULL;
        Py_XDECREF(index);
        if (action == NULL) goto done;
        if (action != Py_None) {
            Py_ssize_t tid, key_len = 0, row_len = 0;
            const char *key = NULL, *op = NULL, *row = NULL;
            long long version = 0;
            PyObject *schema;
            if (!PyArg_ParseTuple(action, "ny#zLz#O", &tid, &key, &key_len, &op, &version, &row, &row_len, &schema)
                    || tid < 0 || !ensure_topics(w, tid + 1)) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a topic id is >= 0");
                Py_DECREF(action);
                goto done;
            }
            int64_t schema_version = NO_SCHEMA;
            if (schema != Py_None && (schema_version = PyLong_AsLongLong(schema)) == -1 && PyErr_Occurred()) {
                Py_DECREF(action);
                goto done;
            }
            if (op != NULL && op[0] == 't') {
                truncate_topic(w, tid, version);
            } else {
                oom = !apply(w, (int32_t)tid, key, key_len, op ? op[0] : 0, version, row, row_len, schema_version,
                             items[i].partition, items[i].offset);
            }
        }
        Py_DECREF(action);
        i++;
    }
    if (oom) { PyErr_NoMemory(); goto done; }
    /* ends[(topic, partition)]: the offset after each partition's last record (from the back:
     * a partition's records are in order, and a batch has few partitions) */
    int32_t seen_topic[64], seen_partition[64];
    Py_ssize_t seen_count = 0;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        if (items[i].topic_name == NULL) continue;
        int seen = 0;
        for (Py_ssize_t j = 0; j < seen_count && !seen; j++)
            seen = seen_topic[j] == items[i].topic && seen_partition[j] == items[i].partition;
        if (seen) continue;
        PyObject *partition = PyLong_FromLong(items[i].partition);
        PyObject *tp = partition ? PyTuple_Pack(2, items[i].topic_name, partition) : NULL;
        Py_XDECREF(partition);
        PyObject *end = PyLong_FromLongLong(items[i].offset + 1);
        int ok = tp != NULL && end != NULL;
        if (ok && seen_count == 64) {  /* more partitions than that: keep the greatest end */
            PyObject *had = PyDict_GetItemWithError(ends, tp);
            ok = !PyErr_Occurred();
            if (ok && had != NULL && PyLong_AsLongLong(had) >= items[i].offset + 1) {
                Py_DECREF(tp);
                Py_DECREF(end);
                continue;
            }
        } else if (ok) {
            seen_topic[seen_count] = items[i].topic;
            seen_partition[seen_count++] = items[i].partition;
        }
        ok = ok && PyDict_SetItem(ends, tp, end) == 0;
        Py_XDECREF(tp);
        Py_XDECREF(end);
        if (!ok) goto done;
    }
    result = Py_NewRef(Py_None);
done:
    return result;
}

/* Rows and deletes under `version` go (a tombstone-only entry stays: it names no version), and
 * later records older than it are ignored. */
static void
truncate_topic(Window *w, Py_ssize_t topic, int64_t version)
{
    if (version > w->truncates[topic]) w->truncates[topic] = version;
    for (Py_ssize_t i = 0; i < w->count; i++) {
        Entry *e = &w->entries[i];
        if (e->topic != topic || !e->op || e->version >= version) continue;
        free(e->row);
        w->bytes -= e->row_len + 16;
        e->row = NULL;
        e->row_len = 0;
        e->op = 0;
        e->version = INT64_MIN;
    }
}

static PyObject *
window_truncate(Window *w, PyObject *args)
{
    Py_ssize_t topic;
    long long version;
    if (!PyArg_ParseTuple(args, "nL", &topic, &version)) return NULL;
    if (topic < 0) { PyErr_SetString(PyExc_ValueError, "a topic id is >= 0"); return NULL; }
    if (!enter(w)) return NULL;
    if (!ensure_topics(w, topic + 1)) { w->busy = 0; return NULL; }
    truncate_topic(w, topic, version);
    w->busy = 0;
    Py_RETURN_NONE;
}

static PyObject *
window_stats(Window *w, PyObject *unused)
{
    return Py_BuildValue("nnL", w->count, w->bytes, w->read_bytes);
}

static PyObject *
window_shapes(Window *w, PyObject *args)
{
    Py_ssize_t topic;
    if (!PyArg_ParseTuple(args, "n", &topic)) return NULL;
    PyObject *found = PySet_New(NULL);
    for (Py_ssize_t i = 0; found != NULL && i < w->count; i++) {
        Entry *e = &w->entries[i];
        if (e->topic != topic || !e->op) continue;
        PyObject *v = e->schema_version == NO_SCHEMA ? Py_NewRef(Py_None) : PyLong_FromLongLong(e->schema_version);
        if (v == NULL || PySet_Add(found, v) < 0) Py_CLEAR(found);
        Py_XDECREF(v);
    }
    if (found == NULL) return NULL;
    PyObject *list = PySequence_List(found);
    Py_DECREF(found);
    return list;
}

/* A SinkEvent (topic, partition, offset, key, op, before, after, version, source, ts_ms). */
static PyObject *
make_event(Window *w, Entry *e, PyObject *topic, PyObject *source, PyObject *loads)
{
    PyObject *op = w->op_objects[(unsigned char)e->op];
    if (op == NULL) {
        PyErr_Format(PyExc_KeyError, "op %c", e->op);
        return NULL;
    }
    PyObject *key;
    if (loads != Py_None) {
        PyObject *bytes = PyBytes_FromStringAndSize(e->key, e->key_len);
        key = bytes ? PyObject_CallOneArg(loads, bytes) : NULL;
        Py_XDECREF(bytes);
        if (key == NULL) return NULL;
    } else {
        key = Py_NewRef(Py_None);
    }
    PyObject *row = e->row ? PyBytes_FromStringAndSize(e->row, e->row_len) : Py_NewRef(Py_None);
    PyObject *fields[10] = {Py_NewRef(topic), PyLong_FromLong(e->partition), PyLong_FromLongLong(e->offset), key,
                            Py_NewRef(op), e->op == 'd' ? row : Py_NewRef(Py_None),
                            e->op == 'd' ? Py_NewRef(Py_None) : row, PyLong_FromLongLong(e->version),
                            Py_NewRef(source), Py_NewRef(Py_None)};
    PyTypeObject *type = (PyTypeObject *)w->event_type;
    PyObject *event = NULL;
    int ok = 1;
    for (int f = 0; f < 10; f++) ok = ok && fields[f] != NULL;
    if (ok && (event = type->tp_alloc(type, 10)) != NULL) {
        for (int f = 0; f < 10; f++) {
            PyTuple_SET_ITEM(event, f, fields[f]);
            fields[f] = NULL;
        }
    }
    for (int f = 0; f < 10; f++) Py_XDECREF(fields[f]);
    return event;
}

static PyObject *
window_take(Window *w, PyObject *args)
{
    Py_ssize_t topic, start, limit;
    PyObject *schema, *topic_name, *source, *loads;
    if (!PyArg_ParseTuple(args, "nOUO!Onn", &topic, &schema, &topic_name, &PyDict_Type, &source, &loads, &start,
                          &limit))
        return NULL;
    int64_t wanted = NO_SCHEMA;
    if (schema != Py_None && (wanted = PyLong_AsLongLong(schema)) == -1 && PyErr_Occurred()) return NULL;
    PyObject *upserts = PyList_New(0), *deletes = PyList_New(0), *result = NULL;
    if (upserts == NULL || deletes == NULL) goto done;
    Py_ssize_t i = start < 0 ? 0 : start, taken = 0;
    for (; i < w->count && taken < limit; i++) {
        Entry *e = &w->entries[i];
        if (e->topic != topic || !e->op || e->schema_version != wanted) continue;
        int is_delete = e->op == 'd';
        if (!is_delete && e->tombstoned) continue;  /* the tombstone after it wins */
        PyObject *event = make_event(w, e, topic_name, source, loads);
        if (event == NULL) goto done;
        PyObject *key = PyBytes_FromStringAndSize(e->key, e->key_len);
        PyObject *pair = key ? PyTuple_Pack(2, key, event) : NULL;
        Py_XDECREF(key);
        Py_DECREF(event);
        if (pair == NULL || PyList_Append(is_delete ? deletes : upserts, pair) < 0) { Py_XDECREF(pair); goto done; }
        Py_DECREF(pair);
        taken++;
    }
    result = Py_BuildValue("OOn", upserts, deletes, i < w->count ? i : (Py_ssize_t)-1);
done:
    Py_XDECREF(upserts);
    Py_XDECREF(deletes);
    return result;
}

static PyObject *
window_tombstones(Window *w, PyObject *args)
{
    Py_ssize_t topic;
    if (!PyArg_ParseTuple(args, "n", &topic)) return NULL;
    PyObject *keys = PyList_New(0);
    for (Py_ssize_t i = 0; keys != NULL && i < w->count; i++) {
        Entry *e = &w->entries[i];
        if (e->topic != topic || !e->tombstoned) continue;
        PyObject *key = PyBytes_FromStringAndSize(e->key, e->key_len);
        if (key == NULL || PyList_Append(keys, key) < 0) Py_CLEAR(keys);
        Py_XDECREF(key);
    }
    return keys;
}

static PyObject *
window_truncated(Window *w, PyObject *args)
{
    Py_ssize_t topic;
    if (!PyArg_ParseTuple(args, "n", &topic)) return NULL;
    if (topic < 0 || topic >= w->ntopics || w->truncates[topic] == INT64_MIN) Py_RETURN_NONE;
    return PyLong_FromLongLong(w->truncates[topic]);
}

static int
compare_hashes(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static PyObject *
window_key_hashes(Window *w, PyObject *unused)
{
    if (!enter(w)) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, w->count * (Py_ssize_t)sizeof(uint64_t));
    if (out != NULL) {
        uint64_t *h = (uint64_t *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < w->count; i++) h[i] = w->entries[i].hash;
        Py_BEGIN_ALLOW_THREADS
        qsort(h, (size_t)w->count, sizeof(uint64_t), compare_hashes);
        Py_END_ALLOW_THREADS
    }
    w->busy = 0;
    return out;
}

static PyObject *
window_clear(Window *w, PyObject *unused)
{
    if (!enter(w)) return NULL;
    clear_all(w);
    w->busy = 0;
    Py_RETURN_NONE;
}

static int
window_init(Window *w, PyObject *args, PyObject *kwds)
{
    PyObject *type, *ops;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &type, &PyDict_Type, &ops)) return -1;
    Py_XSETREF(w->event_type, Py_NewRef(type));
    Py_XSETREF(w->ops, Py_NewRef(ops));
    memset(w->op_objects, 0, sizeof(w->op_objects));
    PyObject *code, *op;
    Py_ssize_t at = 0;
    while (PyDict_Next(ops, &at, &code, &op)) {
        Py_ssize_t n;
        const char *text = PyUnicode_Check(code) ? PyUnicode_AsUTF8AndSize(code, &n) : NULL;
        if (text != NULL && n == 1 && (unsigned char)text[0] < 128) w->op_objects[(unsigned char)text[0]] = op;
        PyErr_Clear();
    }
    return 0;
}

static void
window_dealloc(Window *w)
{
    clear_all(w);
    free(w->truncates);
    Py_XDECREF(w->event_type);
    Py_XDECREF(w->ops);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef window_methods[] = {
    {"add", (PyCFunction)window_add, METH_VARARGS, "add(records, topics, ends, resolve)"},
    {"add_packed", (PyCFunction)window_add_packed, METH_VARARGS, "add_packed(data, count, names, topics, ends, resolve)"},
    {"truncate", (PyCFunction)window_truncate, METH_VARARGS, "truncate(topic_id, version)"},
    {"stats", (PyCFunction)window_stats, METH_NOARGS, "stats() -> (keys, bytes, bytes of values read)"},
    {"shapes", (PyCFunction)window_shapes, METH_VARARGS, "shapes(topic_id) -> [schema_version or None]"},
    {"take", (PyCFunction)window_take, METH_VARARGS,
     "take(topic_id, schema_version, topic, source, loads, start, limit) -> (upserts, deletes, next)"},
    {"tombstones", (PyCFunction)window_tombstones, METH_VARARGS, "tombstones(topic_id) -> [key JSON]"},
    {"truncated", (PyCFunction)window_truncated, METH_VARARGS, "truncated(topic_id) -> version or None"},
    {"key_hashes", (PyCFunction)window_key_hashes, METH_NOARGS, "key_hashes() -> sorted uint64 hashes of the keys held"},
    {"clear", (PyCFunction)window_clear, METH_NOARGS, "clear()"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WindowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc._window.Window",
    .tp_basicsize = sizeof(Window),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The newest version per (topic, key) of the records added (see the module source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)window_init,
    .tp_dealloc = (destructor)window_dealloc,
    .tp_methods = window_methods,
};

/* columns_first(text) -> text: COPY text lines "key\tversion\tcolumns...\n" (cdc.api.raw_copy_rows)
 * as "columns...\tversion\n", for a plain COPY into the table itself. The key JSON holds no raw
 * tab or newline (JSON escapes them), and neither does a version. */
static PyObject *
columns_first(PyObject *self, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "columns_first(text): text is bytes");
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(arg), *end = p + PyBytes_GET_SIZE(arg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, PyBytes_GET_SIZE(arg));
    if (out == NULL) return NULL;
    char *o = PyBytes_AS_STRING(out);
    while (p < end) {
        const char *line_end = memchr(p, '\n', end - p);
        const char *key_end = memchr(p, '\t', (line_end ? line_end : end) - p);
        if (line_end == NULL || key_end == NULL) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_ValueError, "columns_first: a line without its key and version");
            return NULL;
        }
        const char *version = key_end + 1;
        const char *version_end = memchr(version, '\t', line_end - version);
        if (version_end == NULL) {  /* no columns */
            memcpy(o, version, line_end - version);
            o += line_end - version;
        } else {
            memcpy(o, version_end + 1, line_end - version_end - 1);
            o += line_end - version_end - 1;
            *o++ = '\t';
            memcpy(o, version, version_end - version);
            o += version_end - version;
        }
        *o++ = '\n';
        p = line_end + 1;
    }
    if (_PyBytes_Resize(&out, o - PyBytes_AS_STRING(out)) < 0) return NULL;
    return out;
}

/* Two sorted uint64 arrays (bytes) as pointers and lengths; 0 with an exception set. */
static int
hash_arrays(PyObject *args, const char *name, const uint64_t **a, Py_ssize_t *na, const uint64_t **b, Py_ssize_t *nb)
{
    PyObject *x, *y;
    if (!PyArg_ParseTuple(args, "O!O!", &PyBytes_Type, &x, &PyBytes_Type, &y)) return 0;
    if (PyBytes_GET_SIZE(x) % sizeof(uint64_t) || PyBytes_GET_SIZE(y) % sizeof(uint64_t)) {
        PyErr_Format(PyExc_ValueError, "%s: arrays of 8-byte hashes", name);
        return 0;
    }
    *a = (const uint64_t *)PyBytes_AS_STRING(x);
    *na = PyBytes_GET_SIZE(x) / (Py_ssize_t)sizeof(uint64_t);
    *b = (const uint64_t *)PyBytes_AS_STRING(y);
    *nb = PyBytes_GET_SIZE(y) / (Py_ssize_t)sizeof(uint64_t);
    return 1;
}

static PyObject *
hashes_meet(PyObject *self, PyObject *args)
{
    const uint64_t *a, *b;
    Py_ssize_t na, nb, i = 0, j = 0;
    if (!hash_arrays(args, "hashes_meet", &a, &na, &b, &nb)) return NULL;
    int met = 0;
    Py_BEGIN_ALLOW_THREADS
    while (i < na && j < nb) {
        if (a[i] == b[j]) { met = 1; break; }
        if (a[i] < b[j]) i++; else j++;
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(met);
}

static PyObject *
hashes_union(PyObject *self, PyObject *args)
{
    const uint64_t *a, *b;
    Py_ssize_t na, nb, i = 0, j = 0, n = 0;
    if (!hash_arrays(args, "hashes_union", &a, &na, &b, &nb)) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (na + nb) * (Py_ssize_t)sizeof(uint64_t));
    if (out == NULL) return NULL;
    uint64_t *o = (uint64_t *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    while (i < na || j < nb) {
        uint64_t v = j >= nb || (i < na && a[i] <= b[j]) ? a[i] : b[j];
        while (i < na && a[i] == v) i++;
        while (j < nb && b[j] == v) j++;
        if (!n || o[n - 1] != v) o[n++] = v;
    }
    Py_END_ALLOW_THREADS
    if (_PyBytes_Resize(&out, n * (Py_ssize_t)sizeof(uint64_t)) < 0) return NULL;
    return out;
}

static PyMethodDef module_methods[] = {
    {"hashes_meet", hashes_meet, METH_VARARGS, "hashes_meet(a, b) -> whether two sorted uint64 arrays share a value"},
    {"hashes_union", hashes_union, METH_VARARGS, "hashes_union(a, b) -> the sorted union of two sorted uint64 arrays"},
    {"columns_first", columns_first, METH_O, "columns_first(COPY text) -> the lines without the key, version last"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cdc._window", NULL, -1, module_methods};

PyMODINIT_FUNC
PyInit__window(void)
{
    if (PyType_Ready(&WindowType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Window", (PyObject *)&WindowType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
