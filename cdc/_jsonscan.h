/* The checking JSON scanner of the sink side, for cdc/_decode.c (envelopes) and cdc/_copytext.c
 * (rows as JSON bytes): it accepts what orjson.loads accepts (UTF-8, escapes and surrogate pairs,
 * numbers that fit a double, no trailing bytes) and finds an object's members without building
 * anything. Separate extensions, so each gets its own copy. */
#ifndef CDC_JSONSCAN_H
#define CDC_JSONSCAN_H

#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef CDC_SHARED
#define CDC_SHARED static __attribute__((unused))  /* one copy in each extension that includes it */
#endif

#define MAX_DEPTH 1000

typedef struct {
    const unsigned char *p, *end;
} Scan;

CDC_SHARED void
skip_ws(Scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

CDC_SHARED int
hex4(const unsigned char *p, unsigned int *out)
{
    unsigned int v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return 0;
    }
    *out = v;
    return 1;
}

/* Length of a valid UTF-8 sequence at p (first byte >= 0x80), 0 if invalid. */
CDC_SHARED int
utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    int n;
    unsigned int cp;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if (end - p < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return n;
}

/* s->p at '"': checks the string, moves past its closing quote; *escaped when it has a backslash. */
CDC_SHARED int
scan_string(Scan *s, int *escaped)
{
    const unsigned char *p = s->p + 1, *end = s->end;
    *escaped = 0;
    while (p < end) {
        unsigned char c = *p;
        if (c == '"') {
            s->p = p + 1;
            return 1;
        }
        if (c < 0x20)
            return 0;
        if (c == '\\') {
            *escaped = 1;
            if (p + 1 >= end) return 0;
            unsigned char e = p[1];
            if (e == 'u') {
                unsigned int u, low;
                if (end - p < 6 || !hex4(p + 2, &u)) return 0;
                p += 6;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &low) || low < 0xDC00 || low > 0xDFFF)
                        return 0;
                    p += 6;
                } else if (u >= 0xDC00 && u <= 0xDFFF) {
                    return 0;
                }
                continue;
            }
            if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't')
                return 0;
            p += 2;
            continue;
        }
        if (c >= 0x80) {
            int n = utf8_len(p, end);
            if (!n) return 0;
            p += n;
            continue;
        }
        p++;
    }
    return 0;
}

/* An integer literal orjson reads as an int (-2**63 .. 2**64-1)? */
CDC_SHARED int
int_fits(const unsigned char *p, Py_ssize_t n)
{
    int neg = p[0] == '-';
    const unsigned char *d = p + neg;
    Py_ssize_t len = n - neg;
    const char *limit = neg ? "9223372036854775808" : "18446744073709551615";
    if (len < 19 || (len == 19 && neg == 0)) return 1;
    if (len > (Py_ssize_t)strlen(limit)) return 0;
    if (len < (Py_ssize_t)strlen(limit)) return 1;
    return memcmp(d, limit, len) <= 0;
}

/* The double of a number literal (which orjson reads as a float); 0 if it is out of range. */
CDC_SHARED int
number_double(const unsigned char *p, Py_ssize_t n, double *out)
{
    char buf[128];
    char *heap = NULL, *text = buf;
    if (n >= (Py_ssize_t)sizeof(buf)) {
        if ((heap = PyMem_Malloc(n + 1)) == NULL) return 0;
        text = heap;
    }
    memcpy(text, p, n);
    text[n] = 0;
    char *stop;
    double d = PyOS_string_to_double(text, &stop, NULL);
    int ok = !(d == -1.0 && PyErr_Occurred()) && !Py_IS_INFINITY(d) && stop == text + n;
    if (PyErr_Occurred()) PyErr_Clear();
    PyMem_Free(heap);
    *out = d;
    return ok;
}

/* s->p at a number: checks it; *is_int when orjson reads it as an int. */
CDC_SHARED int
scan_number(Scan *s, int *is_int)
{
    const unsigned char *start = s->p, *p = s->p, *end = s->end;
    int integral = 1;
    if (p < end && *p == '-') p++;
    if (p >= end) return 0;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < end && *p >= '0' && *p <= '9') p++; }
    else return 0;
    if (p < end && *p == '.') {
        integral = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    if (integral && int_fits(start, p - start)) {
        *is_int = 1;
        return 1;
    }
    *is_int = 0;
    double d;
    return number_double(start, p - start, &d);
}

CDC_SHARED int
scan_value(Scan *s, int depth)
{
    int flag;
    skip_ws(s);
    if (s->p >= s->end) return 0;
    unsigned char c = *s->p;
    if (c == '"') return scan_string(s, &flag);
    if (c == '{' || c == '[') {
        unsigned char close = c == '{' ? '}' : ']';
        if (depth >= MAX_DEPTH) return 0;
        s->p++;
        skip_ws(s);
        if (s->p < s->end && *s->p == close) { s->p++; return 1; }
        for (;;) {
            if (c == '{') {
                skip_ws(s);
                if (s->p >= s->end || *s->p != '"' || !scan_string(s, &flag)) return 0;
                skip_ws(s);
                if (s->p >= s->end || *s->p != ':') return 0;
                s->p++;
            }
            if (!scan_value(s, depth + 1)) return 0;
            skip_ws(s);
            if (s->p >= s->end) return 0;
            if (*s->p == ',') { s->p++; continue; }
            if (*s->p == close) { s->p++; return 1; }
            return 0;
        }
    }
    if (c == 't' || c == 'f' || c == 'n') {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(word);
        if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0) return 0;
        s->p += n;
        return 1;
    }
    return scan_number(s, &flag);
}

/* One member of an object: its name (raw, between the quotes) and its value's span. */
typedef struct {
    const unsigned char *name;
    Py_ssize_t name_len;
    int escaped;
    const unsigned char *value, *value_end;
} Member;

typedef struct {
    Member *items;
    Py_ssize_t len, cap;
} Members;

/* The members of the object at s->p (checked); 0 if it is not a valid object. */
CDC_SHARED int
scan_object(Scan *s, Members *m)
{
    m->len = 0;
    skip_ws(s);
    if (s->p >= s->end || *s->p != '{') return 0;
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; return 1; }
    for (;;) {
        skip_ws(s);
        if (s->p >= s->end || *s->p != '"') return 0;
        Member item;
        item.name = s->p + 1;
        if (!scan_string(s, &item.escaped)) return 0;
        item.name_len = s->p - 1 - item.name;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':') return 0;
        s->p++;
        skip_ws(s);
        item.value = s->p;
        if (!scan_value(s, 1)) return 0;
        item.value_end = s->p;
        if (m->len == m->cap) {
            Py_ssize_t cap = m->cap ? m->cap * 2 : 16;
            Member *grown = PyMem_Realloc(m->items, cap * sizeof(Member));
            if (grown == NULL) { PyErr_NoMemory(); return -1; }
            m->items = grown;
            m->cap = cap;
        }
        m->items[m->len++] = item;
        skip_ws(s);
        if (s->p >= s->end) return 0;
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == '}') { s->p++; return 1; }
        return 0;
    }
}

CDC_SHARED int
name_is(const Member *m, const char *name)
{
    size_t n = strlen(name);
    return !m->escaped && (size_t)m->name_len == n && memcmp(m->name, name, n) == 0;
}

CDC_SHARED PyObject *
span_bytes(const Member *m)
{
    return PyBytes_FromStringAndSize((const char *)m->value, m->value_end - m->value);
}

#endif
