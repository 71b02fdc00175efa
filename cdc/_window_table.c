/* The window's hash table of (topic, key) -> the newest version seen (cdc/_window.c). */
#include "_window.h"

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
int
window_apply(Window *w, int32_t topic, const char *key, Py_ssize_t key_len, char op, int64_t version,
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

void
window_clear_all(Window *w)
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

/* Rows and deletes under `version` go (a tombstone-only entry stays: it names no version), and
 * later records older than it are ignored. */
void
window_truncate_topic(Window *w, Py_ssize_t topic, int64_t version)
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
