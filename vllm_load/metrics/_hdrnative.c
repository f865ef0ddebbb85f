/* Recording a batch of values into an HdrHistogram's counters in one C call.
 *
 * Why: the fold of finished requests into the run's histograms calls Histogram.record_many about a dozen
 * times per batch; numpy's path costs ~30 us per call whatever the batch (fifteen array operations on a
 * few hundred values), which came to ~9 us of event-loop time per request in a turnover wave
 * (benchmarks/turnover.py, 256 streams: 115 requests per fold, 1.07 ms each). This loop costs ~1 us per
 * call plus ~5 ns per value. The bucket index is hdrh's own (HdrHistogram._counts_index), and
 * histogram.py keeps the numpy path for builds without a compiler; tests compare the two.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* the values (or counts) of a call: a float64/int64 buffer when one is given, else any sequence */
typedef struct {
    Py_buffer buf;
    int has_buf;
    PyObject *fast;
    Py_ssize_t n;
} seq_t;

static int seq_open(PyObject *obj, const char *want, seq_t *s) {
    s->has_buf = 0;
    s->fast = NULL;
    if (PyObject_CheckBuffer(obj) && PyObject_GetBuffer(obj, &s->buf, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
        const char *f = s->buf.format ? s->buf.format : "B";
        if (*f == '<' || *f == '=' || *f == '@')
            f++;
        if (s->buf.ndim <= 1 && s->buf.itemsize == 8 && strchr(want, *f) && f[1] == '\0') {
            s->has_buf = 1;
            s->n = s->buf.len / 8;
            return 0;
        }
        PyBuffer_Release(&s->buf);
    }
    PyErr_Clear();
    s->fast = PySequence_Fast(obj, "values must be a sequence");
    if (!s->fast)
        return -1;
    s->n = PySequence_Fast_GET_SIZE(s->fast);
    return 0;
}

static void seq_close(seq_t *s) {
    if (s->has_buf)
        PyBuffer_Release(&s->buf);
    Py_XDECREF(s->fast);
}

static int seq_double(seq_t *s, Py_ssize_t i, double *out) {
    if (s->has_buf) {
        *out = ((const double *)s->buf.buf)[i];
        return 0;
    }
    *out = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(s->fast, i));
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static int seq_count(seq_t *s, Py_ssize_t i, uint64_t *out) {
    if (s->has_buf) {
        int64_t v = ((const int64_t *)s->buf.buf)[i];
        if (v < 0) {
            PyErr_SetString(PyExc_ValueError, "a negative count");
            return -1;
        }
        *out = (uint64_t)v;
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(s->fast, i));
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* record(counts, values, times, scale, lowest, highest, unit_magnitude, sub_bucket_half_count_magnitude,
 *        sub_bucket_mask, sub_bucket_half_count) -> (n, total, min, max, min_ticks, max_ticks) | None
 * counts: the histogram's counters (a writable buffer of 8-byte unsigned ints); values in the histogram's
 * unit, each recorded `times[i]` times (times None: once). A value becomes rint(value * scale) ticks,
 * clamped to [lowest, highest], as Histogram.record does. None for no values. */
static PyObject *record(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *counts_obj, *values_obj, *times_obj;
    double scale;
    long long lowest, highest, mask;
    int unit, half_mag;
    long long half_count;
    if (!PyArg_ParseTuple(args, "OOOdLLiiLL", &counts_obj, &values_obj, &times_obj, &scale, &lowest, &highest,
                          &unit, &half_mag, &mask, &half_count))
        return NULL;
    Py_buffer counts;
    if (PyObject_GetBuffer(counts_obj, &counts, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *result = NULL;
    seq_t values, times;
    int have_times = times_obj != Py_None;
    if (counts.len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "counts must be 8-byte integers");
        goto out_counts;
    }
    if (seq_open(values_obj, "d", &values) < 0)
        goto out_counts;
    if (have_times && seq_open(times_obj, "qlQL", &times) < 0)
        goto out_values;
    if (have_times && times.n != values.n) {
        PyErr_SetString(PyExc_ValueError, "values and times differ in length");
        goto out_times;
    }
    uint64_t *c = (uint64_t *)counts.buf;
    Py_ssize_t ncounts = counts.len / 8;
    uint64_t n = 0;
    double total = 0.0, vmin = INFINITY, vmax = -INFINITY;
    int64_t tmin = INT64_MAX, tmax = INT64_MIN;
    /* every value is checked before any counter moves: a bad one leaves the histogram as it was */
    Py_ssize_t *at = PyMem_Malloc((size_t)(values.n ? values.n : 1) * sizeof *at);
    uint64_t *times_of = PyMem_Malloc((size_t)(values.n ? values.n : 1) * sizeof *times_of);
    if (!at || !times_of) {
        PyErr_NoMemory();
        goto out_index;
    }
    for (Py_ssize_t i = 0; i < values.n; i++) {
        double v;
        uint64_t k = 1;
        if (seq_double(&values, i, &v) < 0 || (have_times && seq_count(&times, i, &k) < 0))
            goto out_index;
        if (isnan(v)) {
            PyErr_SetString(PyExc_ValueError, "cannot record NaN");
            goto out_index;
        }
        double r = rint(v * scale); /* round half to even, as Python's round() and numpy's rint */
        int64_t t = r <= (double)lowest ? lowest : r >= (double)highest ? highest : (int64_t)r;
        int pow2ceiling = 64 - __builtin_clzll((uint64_t)(t | mask));
        int bucket = pow2ceiling - unit - (half_mag + 1);
        int64_t sub = t >> (bucket + unit);
        Py_ssize_t index = (Py_ssize_t)(((int64_t)(bucket + 1) << half_mag) + sub - half_count);
        if (index < 0 || index >= ncounts) {
            PyErr_SetString(PyExc_ValueError, "value outside the histogram's range");
            goto out_index;
        }
        at[i] = index;
        times_of[i] = k;
        n += k;
        total += v * (double)k;
        if (v < vmin)
            vmin = v;
        if (v > vmax)
            vmax = v;
        if (t < tmin)
            tmin = t;
        if (t > tmax)
            tmax = t;
    }
    for (Py_ssize_t i = 0; i < values.n; i++)
        c[at[i]] += times_of[i];
    if (values.n == 0) {
        Py_INCREF(Py_None);
        result = Py_None;
    } else {
        result = Py_BuildValue("(KdddLL)", (unsigned long long)n, total, vmin, vmax, (long long)tmin, (long long)tmax);
    }
out_index:
    PyMem_Free(at);
    PyMem_Free(times_of);
out_times:
    if (have_times)
        seq_close(&times);
out_values:
    seq_close(&values);
out_counts:
    PyBuffer_Release(&counts);
    return result;
}

static PyMethodDef methods[] = {
    {"record", record, METH_VARARGS, "Record values into an HdrHistogram's counters (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hdrnative", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hdrnative(void) { return PyModule_Create(&module); }
