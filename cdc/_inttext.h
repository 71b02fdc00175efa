/* Decimal text of a Python int, for cdc/_encode.c and cdc/_copytext.c (separate extensions, so
 * each gets its own copy). */
#ifndef CDC_INTTEXT_H
#define CDC_INTTEXT_H

#include <Python.h>

#ifndef CDC_SHARED
#define CDC_SHARED static __attribute__((unused))  /* one copy in each extension that includes it */
#endif

/* Decimal text of a Python int into buf (at least 24 bytes); its length, or -1 with an error. */
CDC_SHARED Py_ssize_t
format_int(PyObject *value, char *buf, const char *what)
{
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(value)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) {
        PyErr_Format(PyExc_OverflowError, "%s does not fit in 64 bits", what);
        return -1;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + (u % 10));
        u /= 10;
    } while (u);
    Py_ssize_t len = 0;
    if (v < 0)
        buf[len++] = '-';
    while (n)
        buf[len++] = tmp[--n];
    return len;
}

#endif
