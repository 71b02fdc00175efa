/* The lines of a RowBlock (cdc/events.py), `<key text>\t<row JSON>[\t...]\n`, cut into the key
 * text and the row JSON: for cdc/_encode.c (emit_rows) and cdc/_rdproduce.c (produce_rows),
 * which make the same records from them. They are built as separate extensions (setup.py), so
 * the functions here are static: one copy in each. */
#ifndef CDC_ROWBLOCK_H
#define CDC_ROWBLOCK_H

#include <Python.h>
#include <string.h>

typedef struct {
    const char *key, *json;
    size_t nkey, njson;
} RowLine;

/* Check that every line of [start, end) is whole and has its key's tab, before any record of the
 * block goes: 0 with the longest line's length in *longest (unless longest is NULL), or -1 with
 * a TypeError that names `what` (the caller's function). Needs the GIL. */
static int
rowblock_check(const char *start, const char *end, size_t *longest, const char *what)
{
    size_t most = 0;
    for (const char *p = start; p < end;) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL || memchr(p, '\t', (size_t)(eol - p)) == NULL) {
            PyErr_Format(PyExc_TypeError, "%s: a line without its key, or a block not ending in a newline", what);
            return -1;
        }
        if ((size_t)(eol - p) > most)
            most = (size_t)(eol - p);
        p = eol + 1;
    }
    if (longest != NULL)
        *longest = most;
    return 0;
}

/* The line that starts at p, in a block rowblock_check passed, into *line (the row JSON ends at
 * the line's second tab, if any); returns where the next line starts. Needs no GIL. */
static inline const char *
rowblock_line(const char *p, const char *end, RowLine *line)
{
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    const char *tab = memchr(p, '\t', (size_t)(eol - p));
    const char *json = tab + 1, *json_end = memchr(json, '\t', (size_t)(eol - json));
    if (json_end == NULL)
        json_end = eol;
    line->key = p;
    line->nkey = (size_t)(tab - p);
    line->json = json;
    line->njson = (size_t)(json_end - json);
    return eol + 1;
}

#endif
