/* A record's key and value read in place, for the window (cdc/_window.c): a JSON scanner enough
 * to find members and skip values, strict about structure. */
#include "_window.h"

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
int
window_compact_key(const unsigned char *p, Py_ssize_t n)
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

int
window_parse_envelope(const unsigned char *p, Py_ssize_t n, Envelope *env)
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
