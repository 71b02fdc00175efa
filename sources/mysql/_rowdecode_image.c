/* A row image's values, read per column op (see _rowdecode.c). */
#include "_rowdecode.h"
#include <stdio.h>
#include <string.h>

static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};
static const uint32_t POW10[10] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000};

/* ---- values ------------------------------------------------------------------------------ */

static uint64_t be(const unsigned char *b, int n) { uint64_t v = 0; for (int i = 0; i < n; i++) v = v << 8 | b[i]; return v; }
static uint64_t le(const unsigned char *b, int n) { uint64_t v = 0; for (int i = n - 1; i >= 0; i--) v = v << 8 | b[i]; return v; }

/* days since 1970-01-01 -> civil date (Howard Hinnant's days_from_civil, inverted) */
static void civil(int64_t z, int64_t *y, unsigned *m, unsigned *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t yy = (int64_t)yoe + era * 400;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = yy + (*m <= 2);
}

/* The DECIMAL at b (decimal2bin): its text, or NULL (no error set) when not taken. */
static PyObject *decimal(const unsigned char *src, int precision, int scale, int size)
{
    unsigned char buf[64];
    char out[128];
    if (size > 64)
        return NULL;
    memcpy(buf, src, (size_t)size);
    int negative = !(buf[0] & 0x80);
    if (negative)
        for (int i = 0; i < size; i++)
            buf[i] ^= 0xFF;
    buf[0] &= 0x7F;
    int intg = precision - scale, intg0 = intg / 9, intg0x = intg % 9, frac0 = scale / 9, frac0x = scale % 9;
    const unsigned char *p = buf;
    int len = 0, any = 0, started = 0;
    char *w = out + 1;  /* out[0] is for the sign */
    /* integer part: the leading short group, then groups of 9 digits; leading zeros dropped */
    if (intg0x) {
        uint32_t g = (uint32_t)be(p, DIG2BYTES[intg0x]);
        p += DIG2BYTES[intg0x];
        if (g >= POW10[intg0x])
            return NULL;
        if (g) {
            len = sprintf(w, "%u", g);
            started = any = 1;
        }
    }
    for (int k = 0; k < intg0; k++) {
        uint32_t g = (uint32_t)be(p, 4);
        p += 4;
        if (g >= 1000000000u)
            return NULL;
        if (started)
            len += sprintf(w + len, "%09u", g);
        else if (g) {
            len += sprintf(w + len, "%u", g);
            started = any = 1;
        }
    }
    if (!started)
        w[len++] = '0';
    if (scale) {
        w[len++] = '.';
        for (int k = 0; k < frac0; k++) {
            uint32_t g = (uint32_t)be(p, 4);
            p += 4;
            if (g >= 1000000000u)
                return NULL;
            any |= g != 0;
            len += sprintf(w + len, "%09u", g);
        }
        if (frac0x) {
            uint32_t g = (uint32_t)be(p, DIG2BYTES[frac0x]);
            if (g >= POW10[frac0x])
                return NULL;
            any |= g != 0;
            len += sprintf(w + len, "%0*u", frac0x, g);
        }
    }
    if (negative && any) {
        out[0] = '-';
        return PyUnicode_FromStringAndSize(out, len + 1);
    }
    return PyUnicode_FromStringAndSize(w, len);
}

/* conv(value), taking the reference to value (NULL: an error is set). */
static PyObject *convert(PyObject *conv, PyObject *value)
{
    if (value == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(conv, value);
    Py_DECREF(value);
    return r;
}

/* One column at *pp (< end): a new reference, Py_None included, or NULL (not taken; an error
 * may be set, the caller clears it). */
static PyObject *column(const Op *op, const unsigned char *data, Py_ssize_t *pp, Py_ssize_t end)
{
    Py_ssize_t p = *pp;
    const unsigned char *b = data + p;
    char text[80];
#define NEED(n) do { if (p + (Py_ssize_t)(n) > end) return NULL; } while (0)
    switch (op->kind) {
    case K_INT: {
        NEED(op->a);
        uint64_t u = le(b, op->a);
        *pp = p + op->a;
        if (!op->b)
            return PyLong_FromUnsignedLongLong(u);
        int bits = op->a * 8;
        int64_t v = bits == 64 ? (int64_t)u : (u & (1ULL << (bits - 1))) ? (int64_t)(u - (1ULL << bits)) : (int64_t)u;
        return PyLong_FromLongLong(v);
    }
    case K_FLOAT: {
        NEED(4);
        uint32_t u = (uint32_t)le(b, 4);
        float f;
        memcpy(&f, &u, 4);
        *pp = p + 4;
        return convert(op->conv, PyFloat_FromDouble((double)f));
    }
    case K_DOUBLE: {
        NEED(8);
        uint64_t u = le(b, 8);
        double d;
        memcpy(&d, &u, 8);
        *pp = p + 8;
        return PyFloat_FromDouble(d);
    }
    case K_YEAR:
        NEED(1);
        *pp = p + 1;
        return PyLong_FromLong(b[0] ? b[0] + 1900 : 0);
    case K_DECIMAL: {
        int intg = op->a - op->b;
        int size = (intg / 9) * 4 + DIG2BYTES[intg % 9] + (op->b / 9) * 4 + DIG2BYTES[op->b % 9];
        NEED(size);
        *pp = p + size;
        return decimal(b, op->a, op->b, size);
    }
    case K_DATE: {
        NEED(3);
        uint32_t v = (uint32_t)le(b, 3);
        *pp = p + 3;
        unsigned day = v & 31, month = (v >> 5) & 15;
        if (!month || !day)
            Py_RETURN_NONE;
        int n = snprintf(text, sizeof text, "%04u-%02u-%02u", v >> 9, month, day);
        return PyUnicode_FromStringAndSize(text, n);
    }
    case K_DATETIME2: {
        int width = (op->a + 1) / 2;
        NEED(5 + width);
        int64_t x = (int64_t)be(b, 5) - 0x8000000000LL;
        if (x < 0)
            return NULL;  /* before year 0: the Python decoder's business */
        *pp = p + 5 + width;
        int64_t ymd = x >> 17, ym = ymd >> 5;
        unsigned day = (unsigned)(ymd & 31), month = (unsigned)(ym % 13);
        if (!month || !day)
            Py_RETURN_NONE;
        unsigned hms = (unsigned)(x & 0x1FFFF);
        int n = snprintf(text, sizeof text, "%04lld-%02u-%02uT%02u:%02u:%02u", (long long)(ym / 13), month, day,
                         hms >> 12, (hms >> 6) & 63, hms & 63);
        if (width) {
            uint32_t f = (uint32_t)be(b + 5, width) / POW10[2 * width - op->a];
            n += snprintf(text + n, sizeof text - (size_t)n, ".%0*u", op->a, f);
        }
        return PyUnicode_FromStringAndSize(text, n);
    }
    case K_TIMESTAMP2: {
        int width = (op->a + 1) / 2;
        NEED(4 + width);
        uint32_t x = (uint32_t)be(b, 4);
        uint32_t f = width ? (uint32_t)be(b + 4, width) / POW10[2 * width - op->a] : 0;
        *pp = p + 4 + width;
        if (!x && !f)
            Py_RETURN_NONE;
        int64_t y;
        unsigned m, d, r = x % 86400;
        civil(x / 86400, &y, &m, &d);
        int n = snprintf(text, sizeof text, "%04lld-%02u-%02uT%02u:%02u:%02u", (long long)y, m, d, r / 3600,
                         r / 60 % 60, r % 60);
        if (width)
            n += snprintf(text + n, sizeof text - (size_t)n, ".%0*uZ", op->a, f);
        else
            text[n++] = 'Z';
        return PyUnicode_FromStringAndSize(text, n);
    }
    case K_STR: {
        NEED(op->a);
        Py_ssize_t len = (Py_ssize_t)le(b, op->a);
        p += op->a;
        if (len < 0 || p + len > end)
            return NULL;
        *pp = p + len;
        if (op->conv == Py_None)
            return PyUnicode_DecodeUTF8((const char *)data + p, len, "strict");
        return convert(op->conv, PyBytes_FromStringAndSize((const char *)data + p, len));
    }
    case K_ENUM: {
        NEED(op->a);
        Py_ssize_t i = (Py_ssize_t)le(b, op->a);
        *pp = p + op->a;
        if (i >= PyTuple_GET_SIZE(op->conv))
            return NULL;
        return Py_NewRef(PyTuple_GET_ITEM(op->conv, i));
    }
    case K_BIT:
        NEED(op->a);
        *pp = p + op->a;
        return PyLong_FromUnsignedLongLong(be(b, op->a));
    case K_SET: {
        NEED(op->a);
        uint64_t m = le(b, op->a);
        *pp = p + op->a;
        PyObject *list = PyList_New(0);
        Py_ssize_t count = PyTuple_GET_SIZE(op->conv);
        for (Py_ssize_t bit = 0; list != NULL && bit < count && bit < 64; bit++)
            if (m >> bit & 1 && PyList_Append(list, PyTuple_GET_ITEM(op->conv, bit)) < 0)
                Py_CLEAR(list);
        return list;
    }
    case K_PYFIXED: {
        NEED(op->a);
        *pp = p + op->a;
        PyObject *raw = PyBytes_FromStringAndSize((const char *)b, op->a);
        if (raw == NULL)
            return NULL;
        PyObject *zero = PyLong_FromLong(0);
        PyObject *args[2] = {raw, zero};
        PyObject *r = zero ? PyObject_Vectorcall(op->conv, args, 2, NULL) : NULL;
        Py_DECREF(raw);
        Py_XDECREF(zero);
        return r;
    }
    }
#undef NEED
    return NULL;
}

/* One row image at *pp into values[0..ncols) (new references); 0, or -1 when not taken. */
int rowdecode_image(Program *prog, const unsigned char *data, Py_ssize_t *pp, Py_ssize_t end, PyObject **values)
{
    Py_ssize_t nbytes = (prog->ncols + 7) / 8, p = *pp;
    if (p + nbytes > end)
        return -1;
    const unsigned char *nulls = data + p;
    p += nbytes;
    for (Py_ssize_t i = 0; i < prog->ncols; i++) {
        const Op *op = &prog->ops[i];
        PyObject *v;
        if (op->nullable && (nulls[i >> 3] >> (i & 7) & 1))
            v = Py_NewRef(Py_None);
        else if ((v = column(op, data, &p, end)) == NULL) {
            for (Py_ssize_t j = 0; j < i; j++)
                Py_CLEAR(values[j]);
            return -1;
        }
        values[i] = v;
    }
    *pp = p;
    return 0;
}
