/* The native receive thread's Python type, Reader: watch a socket, send on it, take its head, body, lines or parsed
 * SSE, drain the news; the thread and its decoding are in _rx_thread.c and _rx_body.c (why a thread: there). */
#include "_rx.h"

static int Reader_init(Reader *r, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist))
        return -1;
    if (r->started) {
        PyErr_SetString(PyExc_RuntimeError, "Reader already started");
        return -1;
    }
    pthread_mutex_init(&r->lock, NULL);
    r->priority = PRIO_STARTING;
    r->ep = epoll_create1(EPOLL_CLOEXEC);
    r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->ep < 0 || r->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    /* the thread starts with every signal blocked, so the kernel delivers SIGINT/SIGTERM to the Python
     * thread: delivered here, they woke no one, and Python raised KeyboardInterrupt wherever its loop next
     * ran bytecode, e.g. in a user's greenlet between counting a request and logging it */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int started = pthread_create(&r->thread, NULL, rx_run, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (started != 0) {
        PyErr_SetString(PyExc_OSError, "cannot start the receive thread");
        return -1;
    }
    r->started = 1;
    return 0;
}

static stream_t *get_stream(Reader *r, int fd) {
    if (fd < 0 || fd >= r->nstreams)
        return NULL;
    stream_t *s = r->streams[fd];
    return s && s->active ? s : NULL;
}

/* the stream of a watched fd, with the lock held; NULL (unlocked, ValueError set) when it is not watched */
static stream_t *lock_stream(Reader *r, int fd) {
    pthread_mutex_lock(&r->lock);
    stream_t *s = get_stream(r, fd);
    if (!s) {
        pthread_mutex_unlock(&r->lock);
        PyErr_Format(PyExc_ValueError, "fd %d is not watched", fd);
    }
    return s;
}

/* an fd argument: -1 with an exception set when it is not one */
static int fd_arg(PyObject *arg) {
    long fd = PyLong_AsLong(arg);
    if (fd < 0 || fd > INT32_MAX) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "bad file descriptor");
        return -1;
    }
    return (int)fd;
}

/* the stream of an fd argument, with the lock held; NULL (unlocked, an exception set) when there is none */
static stream_t *lock_arg(Reader *r, PyObject *arg, int *fd) {
    *fd = fd_arg(arg);
    return *fd < 0 ? NULL : lock_stream(r, *fd);
}

int rx_arm(Reader *r, int fd, stream_t *s) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = ((uint64_t)s->gen << 32) | (uint32_t)fd;
    return epoll_ctl(r->ep, EPOLL_CTL_ADD, fd, &ev);
}

static PyObject *Reader_watch(Reader *r, PyObject *arg) {
    int fd = fd_arg(arg);
    if (fd < 0)
        return NULL;
    pthread_mutex_lock(&r->lock);
    if (fd >= r->nstreams) {
        int n = r->nstreams ? r->nstreams : 64;
        while (n <= fd)
            n *= 2;
        stream_t **v = realloc(r->streams, sizeof(stream_t *) * n);
        if (!v) {
            pthread_mutex_unlock(&r->lock);
            return PyErr_NoMemory();
        }
        memset(v + r->nstreams, 0, sizeof(stream_t *) * (n - r->nstreams));
        r->streams = v;
        r->nstreams = n;
    }
    stream_t *s = r->streams[fd];
    if (!s) {
        s = calloc(1, sizeof(stream_t));
        if (!s) {
            pthread_mutex_unlock(&r->lock);
            return PyErr_NoMemory();
        }
        r->streams[fd] = s;
    } else { /* a closed socket's fd number, reused: forget what it left */
        if (s->active)
            epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        rx_free_segments(s);
    }
    int ready = s->ready; /* stays in the ready list if it is there */
    memset(s, 0, sizeof *s);
    s->ready = ready;
    s->gen = ++r->gen;
    s->active = 1;
    /* the kernel stamps each send's last byte as it leaves (software, no payload echoed back) */
    int tsflags = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_TSONLY;
    setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &tsflags, sizeof tsflags);
    int rc = rx_arm(r, fd, s);
    int e = errno;
    if (rc < 0)
        s->active = 0;
    pthread_mutex_unlock(&r->lock);
    if (rc < 0) {
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *Reader_unwatch(Reader *r, PyObject *arg) {
    int fd = fd_arg(arg);
    if (fd < 0)
        return NULL;
    pthread_mutex_lock(&r->lock);
    stream_t *s = get_stream(r, fd);
    if (s) {
        if (!s->eof && !s->err && !s->raw.paused)
            epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        rx_free_segments(s);
        s->active = 0;
    }
    pthread_mutex_unlock(&r->lock);
    Py_RETURN_NONE;
}

/* with the lock held: take the first n queued raw bytes off the stream into a new bytes object */
static PyObject *take_raw(Reader *r, int fd, stream_t *s, size_t n) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (!out)
        return NULL;
    rx_peek_raw(s, PyBytes_AS_STRING(out), n);
    rx_drop_raw(r, fd, s, n);
    return out;
}

/* pop(fd, maxlen) -> (bytes, stamp) | None: the next queued bytes (at most maxlen, never across two
 * segments, so a read has one stamp), (b"", 0.0) at the end of the stream, None when nothing is queued;
 * a read error is raised as OSError. */
static PyObject *Reader_pop(Reader *r, PyObject *args) {
    int fd;
    Py_ssize_t maxlen;
    if (!PyArg_ParseTuple(args, "in", &fd, &maxlen))
        return NULL;
    if (maxlen <= 0)
        maxlen = READ_SIZE;
    stream_t *s = lock_stream(r, fd);
    if (!s)
        return NULL;
    seg_t *g = s->raw.head;
    if (!g) {
        int err = s->err, eof = s->eof;
        pthread_mutex_unlock(&r->lock);
        if (err) {
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        if (eof)
            return Py_BuildValue("(y#d)", "", (Py_ssize_t)0, 0.0);
        Py_RETURN_NONE;
    }
    size_t take = g->len - g->off;
    if (take > (size_t)maxlen)
        take = (size_t)maxlen;
    /* a read stops at the end of a header block: the HTTP parser then holds the headers only, and a
     * streamed body can be handed to this thread (Reader.body) with nothing of it parsed yet */
    rx_header_cut(&s->raw.hdr_match, g->data + g->off, take, &take);
    double stamp = stamp_seconds(g->stamp_ns);
    PyObject *data = take_raw(r, fd, s, take);
    pthread_mutex_unlock(&r->lock);
    if (!data)
        return NULL;
    PyObject *out = Py_BuildValue("(Nd)", data, stamp);
    return out;
}


/* head(fd) -> bytes | None: a response's complete header block (through its blank line), taken off the
 * queue and nothing of the body with it, wherever the reads cut it; None while it is incomplete, b"" when
 * the connection ended before it; a read error is raised as OSError, a block over 64 KB as ValueError */
static PyObject *Reader_head(Reader *r, PyObject *arg) {
    int fd;
    stream_t *s = lock_arg(r, arg, &fd);
    if (!s)
        return NULL;
    size_t seen = 0, found = 0;
    int matched = 0;
    for (seg_t *g = s->raw.head; g && !found && seen <= HEAD_MAX; g = g->next) {
        size_t take;
        int ended = rx_header_cut(&matched, g->data + g->off, g->len - g->off, &take);
        seen += take;
        if (ended)
            found = seen;
    }
    PyObject *out = NULL;
    if (found) {
        out = take_raw(r, fd, s, found);
    } else if (seen > HEAD_MAX) {
        PyErr_SetString(PyExc_ValueError, "response header block over 64 KB");
    } else if (s->err) {
        errno = s->err;
        PyErr_SetFromErrno(PyExc_OSError);
    } else if (s->eof) {
        out = PyBytes_FromStringAndSize("", 0);
    } else {
        out = Py_None;
        Py_INCREF(out);
    }
    pthread_mutex_unlock(&r->lock);
    return out;
}

/* send(fd, data) -> int: one non-blocking send; the bytes sent (0 when the socket's buffer is full).
 * The GIL stays held: a loopback send costs 7-12 us, and releasing the GIL around it handed it to the
 * prompt thread, which kept it for a whole switch interval (py-spy: 23 % of the loop's time was in
 * send at 1,700 requests/s) */
static PyObject *Reader_send(Reader *r, PyObject *args) {
    int fd;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "iy*", &fd, &buf))
        return NULL;
    ssize_t n = send(fd, buf.buf, (size_t)buf.len, MSG_DONTWAIT | MSG_NOSIGNAL);
    int e = errno;
    PyBuffer_Release(&buf);
    if (n < 0) {
        if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR)
            return PyLong_FromLong(0);
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(n);
}

/* body(fd, chunked, length, start_perf=None): the response's headers are parsed; from now on this thread
 * decodes its body (chunked, or `length` bytes, or until close when length < 0) and cuts it into lines.
 * With start (the request's start, perf_counter clock) it also parses them as SSE (_sse.c), chunk
 * offsets counted from it, and hands the result over once, with the body's end (drain(), lines()). */
static PyObject *Reader_body(Reader *r, PyObject *args) {
    int fd, chunked;
    long long length;
    PyObject *start = Py_None;
    long long limit = 0;
    if (!PyArg_ParseTuple(args, "ipL|OL", &fd, &chunked, &length, &start, &limit))
        return NULL;
    double start_perf = 0.0;
    if (start != Py_None) {
        start_perf = PyFloat_AsDouble(start);
        if (start_perf == -1.0 && PyErr_Occurred())
            return NULL;
    }
    sse_state *parse = NULL;
    if (start != Py_None && !(parse = sse_new(start_perf)))
        return PyErr_NoMemory();
    if (parse)
        parse->limit = limit;
    stream_t *s = lock_stream(r, fd);
    if (!s) {
        sse_free(parse);
        return NULL;
    }
    s->exp.on = 0;
    rx_start_body(r, fd, s, chunked, length, parse);
    pthread_mutex_unlock(&r->lock);
    Py_RETURN_NONE;
}

/* expect(fd, start_perf, from_send) -> bool: a request is about to be sent on fd; when its answer's header
 * block is an HTTP/1.1 200 with known framing, this thread takes it and goes on into the body as
 * body(fd, chunked, length, start) would (accepted(fd) says what it read), so the event loop wakes once,
 * at the body's end. Anything else is left raw for head(fd), with state 4 reported once (drain, lines).
 * start: start_perf, or with from_send the kernel's stamp of the send when later (a closed loop counts
 * from the send). True when the answer was already settled (queued before the call): no wake comes. */
static PyObject *Reader_expect(Reader *r, PyObject *args) {
    int fd, from_send;
    double start_perf;
    long long limit = 0;
    if (!PyArg_ParseTuple(args, "idp|L", &fd, &start_perf, &from_send, &limit))
        return NULL;
    stream_t *s = lock_stream(r, fd);
    if (!s)
        return NULL;
    s->body.on = 0;
    s->body.state = BODY_RUNNING;
    s->body.bytes = 0;
    s->exp.accepted = 0;
    s->tx_ns = 0;
    s->exp.on = 1;
    s->exp.match = 0;
    s->exp.seen = 0;
    s->exp.start = start_perf;
    s->exp.from_send = from_send;
    s->exp.limit = limit;
    s->last_read_ns = monotonic_ns(); /* a timeout counts from the send */
    for (seg_t *g = s->raw.head, *next; g && s->exp.on; g = next) { /* a dirty connection's bytes */
        next = g->next; /* taking the head frees the segments it spans */
        rx_expect_scan(r, fd, s, g->data + g->off, g->len - g->off);
    }
    if (s->exp.on && (s->err || s->eof))
        rx_decline(r, fd, s);
    int settled = !s->exp.on;
    pthread_mutex_unlock(&r->lock);
    return PyBool_FromLong(settled);
}

/* the named results Python reads (struct sequences: tuples whose fields have names, as os.stat_result) */
static PyStructSequence_Field accepted_fields[] = {
    {"chunked", "Transfer-Encoding: chunked"},
    {"length", "Content-Length (-1: none, until close)"},
    {"keep_alive", "the connection may serve the next request"},
    {"start", "the request's start (perf_counter) the thread timed the answer from"},
    {NULL, NULL}};
static PyStructSequence_Desc accepted_desc = {"_rxnative.Accepted", "The head the thread took for expect().",
                                              accepted_fields, 4};
static PyStructSequence_Field taken_fields[] = {
    {"lines", "the body's complete lines since the last call, each (bytes, stamp)"},
    {"state", "its BODY_* state"},
    {"body_bytes", "body bytes read so far"},
    {"parsed", "a parsed body's Parsed, once, at its end; else None"},
    {NULL, NULL}};
static PyStructSequence_Desc taken_desc = {"_rxnative.Taken", "A socket's news: what lines(fd) returns.",
                                           taken_fields, 4};
static PyStructSequence_Field drained_fields[] = {
    {"fd", "the socket"},
    {"lines", "as Taken.lines"},
    {"state", "as Taken.state"},
    {"body_bytes", "as Taken.body_bytes"},
    {"err", "the errno that stopped it (0: none), not raised"},
    {"parsed", "as Taken.parsed"},
    {NULL, NULL}};
static PyStructSequence_Desc drained_desc = {"_rxnative.Drained", "One socket's news in drain().", drained_fields, 6};
static PyStructSequence_Field lag_fields[] = {
    {"lag", "the latest read after its segment landed, seconds"},
    {"reads", "reads since the last call"},
    {"late", "of those, later than LATE_NS"},
    {NULL, NULL}};
static PyStructSequence_Desc lag_desc = {"_rxnative.Lag", "The thread's read lag since the last take_lag().",
                                         lag_fields, 3};
static PyTypeObject *AcceptedType, *TakenType, *DrainedType, *LagType;

/* accepted(fd) -> (chunked, length, keep_alive, start) | None: the head the thread took for expect() */
static PyObject *Reader_accepted(Reader *r, PyObject *arg) {
    int fd;
    stream_t *s = lock_arg(r, arg, &fd);
    if (!s)
        return NULL;
    int got = s->exp.accepted, chunked = s->exp.acc_chunked, keep = s->exp.acc_keep;
    long long length = s->exp.acc_length;
    double start = s->exp.acc_start;
    pthread_mutex_unlock(&r->lock);
    if (!got)
        Py_RETURN_NONE;
    PyObject *items[] = {PyBool_FromLong(chunked), PyLong_FromLongLong(length), PyBool_FromLong(keep),
                         PyFloat_FromDouble(start)};
    return named_result(AcceptedType, 4, items);
}

/* a stream's news, taken under the lock and turned into Python objects after it */
typedef struct {
    int fd, nlines, state, err;
    unsigned long long body_bytes;
    seg_t *lines;
    sse_state *sse; /* a parsed body's result, handed over once (NULL: none, or not yet) */
} took_t;

/* with the lock held: detach the stream's complete lines (and the last one without a newline, once the
 * body ended: an error's JSON) with its state, and a parsed body's result once it ended, once its parser
 * left a line to Python, once the connection failed, or when `flush` asks for it (the request stops) */
static void take_lines(stream_t *s, int fd, took_t *t, int flush) {
    t->sse = NULL;
    if (s->parse.sse && (flush || !s->parse.on || s->body.state || s->err || s->eof)) {
        t->sse = s->parse.sse;
        s->parse.sse = NULL;
        s->parse.on = 0;
    }
    if (s->body.state != BODY_RUNNING && s->body.linelen) {
        seg_t *last = rx_new_seg(s->body.line, s->body.linelen, monotonic_ns());
        if (last) {
            rx_append_seg(&s->body.lhead, &s->body.ltail, last);
            s->body.nlines++;
        }
        s->body.linelen = 0;
    }
    t->fd = fd;
    t->lines = s->body.lhead;
    t->nlines = s->body.nlines;
    t->state = s->body.state;
    t->err = s->err;
    t->body_bytes = s->body.bytes;
    s->body.lhead = s->body.ltail = NULL;
    s->body.nlines = 0;
}

/* without the lock: a parsed body's result (None when there is none), freeing it */
static PyObject *parsed_of(took_t *t) {
    if (!t->sse)
        Py_RETURN_NONE;
    PyObject *out = sse_result(t->sse);
    sse_free(t->sse);
    t->sse = NULL;
    return out;
}

/* without the lock: the detached lines as a list of (bytes, stamp), freeing them; NULL on no memory */
static PyObject *lines_list(took_t *t) {
    PyObject *out = PyList_New(t->nlines);
    int i = 0;
    seg_t *g = t->lines;
    while (g) {
        seg_t *next = g->next;
        if (out && i < t->nlines) {
            PyObject *item = Py_BuildValue("(y#d)", g->data, (Py_ssize_t)g->len, stamp_seconds(g->stamp_ns));
            if (!item) {
                Py_CLEAR(out);
            } else {
                PyList_SET_ITEM(out, i, item);
            }
        }
        i++;
        free(g);
        g = next;
    }
    t->lines = NULL;
    return out;
}

/* lines(fd, flush=False) -> (lines, state, body_bytes, parsed): the complete lines since the last call, each
 * (bytes, stamp); state 0 running, 1 the body ended, 2 the connection closed before its end, 3 malformed
 * chunking; parsed: a parsed body's result (see take_lines; flush stops the parsing and takes it now), or
 * None; a read error once every line and the parsed result are taken is raised as OSError (with them, it
 * stays for the next call, or drain(), to report) */
static PyObject *Reader_lines(Reader *r, PyObject *args) {
    PyObject *arg;
    int flush = 0, fd;
    if (!PyArg_ParseTuple(args, "O|p", &arg, &flush))
        return NULL;
    stream_t *s = lock_arg(r, arg, &fd);
    if (!s)
        return NULL;
    took_t t;
    take_lines(s, fd, &t, flush);
    pthread_mutex_unlock(&r->lock);
    PyObject *parsed = parsed_of(&t);
    PyObject *out = lines_list(&t);
    if (!out || !parsed) {
        Py_XDECREF(out);
        Py_XDECREF(parsed);
        return NULL;
    }
    if (t.state == BODY_RUNNING && t.err && t.nlines == 0 && parsed == Py_None && !flush) {
        Py_DECREF(out);
        Py_DECREF(parsed);
        errno = t.err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *items[] = {out, PyLong_FromLong(t.state), PyLong_FromUnsignedLongLong(t.body_bytes), parsed};
    return named_result(TakenType, 4, items);
}

/* quiet(fd) -> seconds since the thread last read the fd (a parsed body's activity, for its timeout) */
static PyObject *Reader_quiet(Reader *r, PyObject *arg) {
    int fd;
    stream_t *s = lock_arg(r, arg, &fd);
    if (!s)
        return NULL;
    int64_t last = s->last_read_ns;
    pthread_mutex_unlock(&r->lock);
    return PyFloat_FromDouble(last ? (double)(monotonic_ns() - last) * 1e-9 : 0.0);
}

/* sent(fd) -> float | None: the kernel's stamp of the latest send leaving (on the perf_counter clock), cleared */
static PyObject *Reader_sent(Reader *r, PyObject *arg) {
    int fd = fd_arg(arg);
    if (fd < 0)
        return NULL;
    pthread_mutex_lock(&r->lock);
    stream_t *s = get_stream(r, fd);
    int64_t ns = s ? s->tx_ns : 0;
    if (s)
        s->tx_ns = 0;
    pthread_mutex_unlock(&r->lock);
    if (!ns)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(stamp_seconds(ns));
}

/* pending(fd) -> bool: bytes, an end or an error are queued (a pooled idle connection is then dirty) */
static PyObject *Reader_pending(Reader *r, PyObject *arg) {
    int fd = fd_arg(arg);
    if (fd < 0)
        return NULL;
    pthread_mutex_lock(&r->lock);
    stream_t *s = get_stream(r, fd);
    int pending = s ? (s->raw.head || s->eof || s->err) : 0;
    pthread_mutex_unlock(&r->lock);
    return PyBool_FromLong(pending);
}

/* drain() -> [(fd, lines, state, body_bytes, errno, parsed)]: every fd with news since the last call, with what
 * lines(fd) would return for it (the error as a number, not raised), in one call and one lock: per fd
 * calls cost the event loop ~1 us each at 26k lines/s; re-arms the eventfd notification */
static PyObject *Reader_drain(Reader *r, PyObject *unused) {
    uint64_t count;
    ssize_t got = read(r->efd, &count, sizeof count);
    (void)got;
    pthread_mutex_lock(&r->lock);
    int n = r->nready;
    took_t *took = n ? malloc(sizeof(took_t) * (size_t)n) : NULL;
    if (n && !took) {
        pthread_mutex_unlock(&r->lock);
        return PyErr_NoMemory();
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        int fd = r->readyv[i];
        stream_t *s = fd < r->nstreams ? r->streams[fd] : NULL;
        if (!s)
            continue;
        s->ready = 0;
        if (s->active)
            take_lines(s, fd, &took[m++], 0);
    }
    r->nready = 0;
    r->notified = 0;
    pthread_mutex_unlock(&r->lock);
    PyObject *out = PyList_New(m);
    for (int i = 0; i < m; i++) {
        PyObject *parsed = parsed_of(&took[i]);
        PyObject *lines = lines_list(&took[i]);
        PyObject *item = NULL;
        if (lines && parsed && out) {
            PyObject *items[] = {PyLong_FromLong(took[i].fd), lines, PyLong_FromLong(took[i].state),
                                 PyLong_FromUnsignedLongLong(took[i].body_bytes), PyLong_FromLong(took[i].err), parsed};
            item = named_result(DrainedType, 6, items);
        } else {
            Py_XDECREF(lines);
            Py_XDECREF(parsed);
        }
        if (!item) {
            Py_CLEAR(out);
        } else {
            PyList_SET_ITEM(out, i, item);
        }
    }
    free(took);
    return out;
}

static PyObject *Reader_fileno(Reader *r, PyObject *unused) {
    return PyLong_FromLong(r->efd);
}

/* take_lag() -> (max seconds, reads, reads later than 1 ms) since the last call */
static PyObject *Reader_take_lag(Reader *r, PyObject *unused) {
    pthread_mutex_lock(&r->lock);
    double lag = (double)r->lag_max_ns * 1e-9;
    unsigned long long reads = r->lag_reads, late = r->late_reads;
    r->lag_max_ns = 0;
    r->lag_reads = r->late_reads = 0;
    pthread_mutex_unlock(&r->lock);
    PyObject *items[] = {PyFloat_FromDouble(lag), PyLong_FromUnsignedLongLong(reads), PyLong_FromUnsignedLongLong(late)};
    return named_result(LagType, 3, items);
}

static PyObject *Reader_stats(Reader *r, PyObject *unused) {
    pthread_mutex_lock(&r->lock);
    unsigned long long segments = r->segments, bytes = r->bytes, stamped = r->stamped;
    int watched = 0;
    for (int i = 0; i < r->nstreams; i++)
        watched += r->streams[i] && r->streams[i]->active;
    pthread_mutex_unlock(&r->lock);
    return Py_BuildValue("{sKsKsKsiss}", "segments", segments, "bytes", bytes, "kernel_stamped", stamped,
                         "watched", watched, "priority", rx_priority_name(r->priority));
}

static void Reader_dealloc(Reader *r) {
    if (r->started) {
        pthread_mutex_lock(&r->lock);
        r->stopping = 1;
        pthread_mutex_unlock(&r->lock);
        /* wake the thread: an eventfd in its epoll set */
        struct epoll_event ev = {.events = EPOLLIN};
        ev.data.u64 = 0xffffffffu;
        epoll_ctl(r->ep, EPOLL_CTL_ADD, r->efd, &ev);
        uint64_t one = 1;
        ssize_t w = write(r->efd, &one, sizeof one);
        (void)w;
        Py_BEGIN_ALLOW_THREADS pthread_join(r->thread, NULL);
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; i < r->nstreams; i++) {
        if (r->streams[i]) {
            rx_free_segments(r->streams[i]);
            free(r->streams[i]);
        }
    }
    free(r->streams);
    free(r->readyv);
    if (r->ep >= 0)
        close(r->ep);
    if (r->efd >= 0)
        close(r->efd);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *Reader_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Reader *r = (Reader *)type->tp_alloc(type, 0);
    if (r) {
        r->ep = -1;
        r->efd = -1;
    }
    return (PyObject *)r;
}

static PyMethodDef Reader_methods[] = {
    {"watch", (PyCFunction)Reader_watch, METH_O, "Read this connected socket's fd from now on."},
    {"unwatch", (PyCFunction)Reader_unwatch, METH_O, "Stop reading the fd and drop what is queued (before close)."},
    {"pop", (PyCFunction)Reader_pop, METH_VARARGS, "pop(fd, maxlen) -> (bytes, stamp) | None"},
    {"head", (PyCFunction)Reader_head, METH_O, "head(fd) -> a complete header block | None | b'' (ended)"},
    {"send", (PyCFunction)Reader_send, METH_VARARGS, "send(fd, data) -> bytes sent (0: buffer full), GIL held"},
    {"body", (PyCFunction)Reader_body, METH_VARARGS,
     "body(fd, chunked, length, start_perf=None, limit=0): decode the body into lines (and parse them as SSE; "
     "past limit tokens the lines go to Python)."},
    {"expect", (PyCFunction)Reader_expect, METH_VARARGS,
     "expect(fd, start_perf, from_send, limit=0) -> settled: take a 200's head here and go on into its body."},
    {"accepted", (PyCFunction)Reader_accepted, METH_O,
     "accepted(fd) -> (chunked, length, keep_alive, start) | None: the head expect() took."},
    {"lines", (PyCFunction)Reader_lines, METH_VARARGS, "lines(fd, flush=False) -> (lines, state, body_bytes, parsed)"},
    {"quiet", (PyCFunction)Reader_quiet, METH_O, "Seconds since the thread last read the fd."},
    {"sent", (PyCFunction)Reader_sent, METH_O, "The kernel's stamp of the latest send leaving, or None (cleared)."},
    {"pending", (PyCFunction)Reader_pending, METH_O, "Bytes, an end or an error are queued for fd."},
    {"drain", (PyCFunction)Reader_drain, METH_NOARGS,
     "[(fd, lines, state, body_bytes, errno, parsed)] of every fd with news."},
    {"fileno", (PyCFunction)Reader_fileno, METH_NOARGS, "The eventfd that becomes readable when fds are ready."},
    {"take_lag", (PyCFunction)Reader_take_lag, METH_NOARGS, "(max lag s, reads, reads > 1 ms late) since the last call."},
    {"stats", (PyCFunction)Reader_stats, METH_NOARGS, "Segments and bytes read, kernel-stamped reads, watched fds."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vllm_load.client._rxnative.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A receive thread that reads and stamps watched sockets as data lands.",
    .tp_new = Reader_new,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
};

/* parse_sse(lines, start_perf) -> (parsed, taken): the thread's SSE parser over (line, stamp_ns) pairs, as it
 * runs on a body's lines: the result StreamState.absorb takes, and how many lines it took before the first
 * one it leaves to Python (len(lines) when none). For tests and tools; the thread calls sse_line itself. */
static PyObject *parse_sse(PyObject *self, PyObject *args) {
    PyObject *lines;
    double start_perf;
    long long limit = 0;
    if (!PyArg_ParseTuple(args, "O!d|L", &PyList_Type, &lines, &start_perf, &limit))
        return NULL;
    sse_state *st = sse_new(start_perf);
    if (!st)
        return PyErr_NoMemory();
    st->limit = limit;
    Py_ssize_t taken = 0, n = PyList_GET_SIZE(lines);
    for (; taken < n; taken++) {
        const char *data;
        Py_ssize_t len;
        long long stamp_ns;
        int late = 0; /* the read that completed this line was late (as the thread sets it per read) */
        if (!PyArg_ParseTuple(PyList_GET_ITEM(lines, taken), "y#L|p", &data, &len, &stamp_ns, &late)) {
            sse_free(st);
            return NULL;
        }
        st->late = late;
        int rc = sse_line(st, data, (size_t)len, stamp_ns);
        if (rc == SSE_NOMEM) {
            sse_free(st);
            return PyErr_NoMemory();
        }
        if (rc == SSE_PYTHON)
            break;
    }
    PyObject *parsed = sse_result(st);
    sse_free(st);
    return parsed ? Py_BuildValue("(Nn)", parsed, taken) : NULL;
}

static PyMethodDef module_methods[] = {
    {"parse_sse", parse_sse, METH_VARARGS,
     "parse_sse([(line, stamp_ns[, late])], start_perf, limit=0) -> (parsed, lines taken)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_rxnative",
                                       "Native receive thread for streaming sockets (Linux).", -1, module_methods};

PyMODINIT_FUNC PyInit__rxnative(void) {
    if (PyType_Ready(&ReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    /* the constants Python reads from here, not from copies of its own */
    if (PyModule_AddIntConstant(m, "DECLINED", DECLINED) < 0 || PyModule_AddIntConstant(m, "LATE_NS", LATE_NS) < 0 ||
        PyModule_AddIntConstant(m, "BODY_RUNNING", BODY_RUNNING) < 0 ||
        PyModule_AddIntConstant(m, "BODY_COMPLETE", BODY_COMPLETE) < 0 ||
        PyModule_AddIntConstant(m, "BODY_CLOSED", BODY_CLOSED) < 0 ||
        PyModule_AddIntConstant(m, "BODY_MALFORMED", BODY_MALFORMED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    struct {
        PyTypeObject **type;
        PyStructSequence_Desc *desc;
        const char *name;
    } results[] = {{&AcceptedType, &accepted_desc, "Accepted"}, {&TakenType, &taken_desc, "Taken"},
                   {&DrainedType, &drained_desc, "Drained"}, {&LagType, &lag_desc, "Lag"},
                   {&SseParsedType, &sse_parsed_desc, "Parsed"}};
    for (size_t i = 0; i < sizeof results / sizeof results[0]; i++) {
        *results[i].type = PyStructSequence_NewType(results[i].desc);
        if (!*results[i].type || PyModule_AddObjectRef(m, results[i].name, (PyObject *)*results[i].type) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
