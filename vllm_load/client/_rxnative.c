/* Native receive thread: reads every watched socket the moment data lands, outside the GIL.
 *
 * Why: Linux stamps each received TCP segment, but when a segment arrives while the previous one of
 * the same stream still waits unread in the socket, tcp_try_coalesce (net/ipv4/tcp_input.c) merges it
 * into that queued segment and the older stamp is overwritten. A Python reader that falls behind (a
 * wave of 256 completions, a GC pass, a user's slow task) therefore loses the time of every chunk that
 * queued behind another, and no later read can recover it. This thread owns the reads: it waits in
 * epoll on all streaming sockets, reads each segment as it lands with recvmsg (SO_TIMESTAMPNS) and
 * queues it with its stamp; the Python side pops segments in order whenever it gets round to them.
 * It never takes the GIL: the two sides share only a mutex held for a few microseconds.
 *
 * Wake-ups are batched: the thread writes the eventfd once when the first stream becomes ready after
 * the Python side last collected the ready list (Reader.ready()), so one wake of the event loop can
 * serve hundreds of streams.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>

#define READ_SIZE 65536
#define PAUSE_BYTES (8u << 20) /* stop reading a stream nobody consumes past 8 MB, resume below 4 MB */

typedef struct seg {
    struct seg *next;
    size_t len, off;
    int64_t stamp_ns;
    char data[];
} seg_t;

typedef struct {
    uint32_t gen;
    int active, eof, err, ready, paused;
    size_t queued;
    seg_t *head, *tail;
    int64_t tx_ns; /* the kernel's stamp of the latest send's last byte leaving (0: none yet) */
} stream_t;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_t thread;
    int started, stopping;
    int ep, efd;
    stream_t **streams; /* indexed by fd */
    int nstreams;
    int *readyv; /* fds with news since the last ready() */
    int nready, capready;
    int notified;
    uint32_t gen;
    unsigned long long segments, bytes, stamped;
} Reader;

static int64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void free_segments(stream_t *s) {
    seg_t *g = s->head;
    while (g) {
        seg_t *n = g->next;
        free(g);
        g = n;
    }
    s->head = s->tail = NULL;
    s->queued = 0;
}

/* with the lock held */
static void mark_ready(Reader *r, int fd, stream_t *s) {
    if (s->ready)
        return;
    if (r->nready == r->capready) {
        int cap = r->capready ? r->capready * 2 : 256;
        int *v = realloc(r->readyv, sizeof(int) * cap);
        if (!v)
            return; /* the data stays queued: the next pop finds it */
        r->readyv = v;
        r->capready = cap;
    }
    r->readyv[r->nready++] = fd;
    s->ready = 1;
}

/* with the lock held: one recvmsg of a readable socket */
static void read_one(Reader *r, int fd, stream_t *s, char *buf) {
    struct iovec iov = {buf, READ_SIZE};
    union {
        char space[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } ctl;
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.space;
    msg.msg_controllen = sizeof ctl.space;
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        s->err = errno;
        epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        mark_ready(r, fd, s);
        return;
    }
    if (n == 0) { /* end of stream: stop watching, or level-triggered epoll reports it forever */
        s->eof = 1;
        epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        mark_ready(r, fd, s);
        return;
    }
    int64_t stamp = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof ts);
            stamp = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
            r->stamped++;
        }
    }
    if (!stamp)
        stamp = realtime_ns(); /* no kernel stamp: this thread reads at once, so its clock is close */
    seg_t *g = malloc(sizeof(seg_t) + (size_t)n);
    if (!g) {
        s->err = ENOMEM;
        epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        mark_ready(r, fd, s);
        return;
    }
    g->next = NULL;
    g->len = (size_t)n;
    g->off = 0;
    g->stamp_ns = stamp;
    memcpy(g->data, buf, (size_t)n);
    if (s->tail)
        s->tail->next = g;
    else
        s->head = g;
    s->tail = g;
    s->queued += (size_t)n;
    r->segments++;
    r->bytes += (uint64_t)n;
    if (s->queued > PAUSE_BYTES && !s->paused) {
        s->paused = 1;
        epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
    }
    mark_ready(r, fd, s);
}

/* with the lock held: the send stamps the kernel queued on the error queue (SO_TIMESTAMPING, TX_SOFTWARE) */
static void read_errqueue(int fd, stream_t *s) {
    for (int i = 0; i < 64; i++) {
        union {
            char space[512];
            struct cmsghdr align;
        } ctl;
        char data[1];
        struct iovec iov = {data, sizeof data};
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.space;
        msg.msg_controllen = sizeof ctl.space;
        if (recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
            return; /* EAGAIN: drained */
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPING) {
                struct scm_timestamping ts;
                memcpy(&ts, CMSG_DATA(c), sizeof ts);
                int64_t ns = (int64_t)ts.ts[0].tv_sec * 1000000000LL + ts.ts[0].tv_nsec;
                if (ns > s->tx_ns)
                    s->tx_ns = ns;
            }
        }
    }
}

static void *run(void *arg) {
    Reader *r = (Reader *)arg;
    struct epoll_event evs[256];
    char *buf = malloc(READ_SIZE);
    if (!buf)
        return NULL;
    for (;;) {
        int n = epoll_wait(r->ep, evs, 256, -1);
        if (n < 0 && errno != EINTR)
            break;
        pthread_mutex_lock(&r->lock);
        if (r->stopping) {
            pthread_mutex_unlock(&r->lock);
            break;
        }
        for (int i = 0; i < n; i++) {
            int fd = (int)(evs[i].data.u64 & 0xffffffffu);
            uint32_t gen = (uint32_t)(evs[i].data.u64 >> 32);
            if (fd < 0 || fd >= r->nstreams)
                continue;
            stream_t *s = r->streams[fd];
            if (!s || !s->active || s->gen != gen || s->eof || s->err)
                continue; /* unwatched, or an event of a closed fd whose number was reused */
            if (evs[i].events & EPOLLERR)
                read_errqueue(fd, s); /* before the data: the request left before its answer came */
            if (!s->paused)
                read_one(r, fd, s, buf);
        }
        if (r->nready && !r->notified) {
            uint64_t one = 1;
            r->notified = 1;
            ssize_t w = write(r->efd, &one, sizeof one);
            (void)w;
        }
        pthread_mutex_unlock(&r->lock);
    }
    free(buf);
    return NULL;
}

static int Reader_init(Reader *r, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist))
        return -1;
    if (r->started) {
        PyErr_SetString(PyExc_RuntimeError, "Reader already started");
        return -1;
    }
    pthread_mutex_init(&r->lock, NULL);
    r->ep = epoll_create1(EPOLL_CLOEXEC);
    r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->ep < 0 || r->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (pthread_create(&r->thread, NULL, run, r) != 0) {
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

static int arm(Reader *r, int fd, stream_t *s) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = ((uint64_t)s->gen << 32) | (uint32_t)fd;
    return epoll_ctl(r->ep, EPOLL_CTL_ADD, fd, &ev);
}

static PyObject *Reader_watch(Reader *r, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "bad file descriptor");
        return NULL;
    }
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
        free_segments(s);
    }
    int ready = s->ready; /* stays in the ready list if it is there */
    memset(s, 0, sizeof *s);
    s->ready = ready;
    s->gen = ++r->gen;
    s->active = 1;
    /* the kernel stamps each send's last byte as it leaves (software, no payload echoed back) */
    int tsflags = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_TSONLY;
    setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &tsflags, sizeof tsflags);
    int rc = arm(r, fd, s);
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
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&r->lock);
    stream_t *s = get_stream(r, fd);
    if (s) {
        if (!s->eof && !s->err && !s->paused)
            epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        free_segments(s);
        s->active = 0;
    }
    pthread_mutex_unlock(&r->lock);
    Py_RETURN_NONE;
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
    pthread_mutex_lock(&r->lock);
    stream_t *s = get_stream(r, fd);
    if (!s) {
        pthread_mutex_unlock(&r->lock);
        PyErr_Format(PyExc_ValueError, "fd %d is not watched", fd);
        return NULL;
    }
    seg_t *g = s->head;
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
    PyObject *data = PyBytes_FromStringAndSize(g->data + g->off, (Py_ssize_t)take);
    double stamp = (double)(g->stamp_ns / 1000000000LL) + (double)(g->stamp_ns % 1000000000LL) * 1e-9;
    if (data) {
        g->off += take;
        s->queued -= take;
        if (g->off == g->len) {
            s->head = g->next;
            if (!s->head)
                s->tail = NULL;
            free(g);
        }
        if (s->paused && s->queued < PAUSE_BYTES / 2 && !s->eof && !s->err) {
            s->paused = 0;
            arm(r, fd, s);
        }
    }
    pthread_mutex_unlock(&r->lock);
    if (!data)
        return NULL;
    PyObject *out = Py_BuildValue("(Nd)", data, stamp);
    return out;
}

/* sent(fd) -> float | None: the kernel's stamp of the latest send leaving (time.time() clock), cleared */
static PyObject *Reader_sent(Reader *r, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&r->lock);
    stream_t *s = get_stream(r, fd);
    int64_t ns = s ? s->tx_ns : 0;
    if (s)
        s->tx_ns = 0;
    pthread_mutex_unlock(&r->lock);
    if (!ns)
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)(ns / 1000000000LL) + (double)(ns % 1000000000LL) * 1e-9);
}

/* pending(fd) -> bool: bytes, an end or an error are queued (a pooled idle connection is then dirty) */
static PyObject *Reader_pending(Reader *r, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&r->lock);
    stream_t *s = get_stream(r, fd);
    int pending = s ? (s->head || s->eof || s->err) : 0;
    pthread_mutex_unlock(&r->lock);
    return PyBool_FromLong(pending);
}

/* ready() -> list of fds with news since the last call; re-arms the eventfd notification */
static PyObject *Reader_ready(Reader *r, PyObject *unused) {
    uint64_t count;
    ssize_t got = read(r->efd, &count, sizeof count);
    (void)got;
    pthread_mutex_lock(&r->lock);
    PyObject *out = PyList_New(r->nready);
    if (out) {
        for (int i = 0; i < r->nready; i++) {
            int fd = r->readyv[i];
            if (fd < r->nstreams && r->streams[fd])
                r->streams[fd]->ready = 0;
            PyList_SET_ITEM(out, i, PyLong_FromLong(fd));
        }
        r->nready = 0;
    }
    r->notified = 0;
    pthread_mutex_unlock(&r->lock);
    return out;
}

static PyObject *Reader_fileno(Reader *r, PyObject *unused) {
    return PyLong_FromLong(r->efd);
}

static PyObject *Reader_stats(Reader *r, PyObject *unused) {
    pthread_mutex_lock(&r->lock);
    unsigned long long segments = r->segments, bytes = r->bytes, stamped = r->stamped;
    int watched = 0;
    for (int i = 0; i < r->nstreams; i++)
        watched += r->streams[i] && r->streams[i]->active;
    pthread_mutex_unlock(&r->lock);
    return Py_BuildValue("{sKsKsKsi}", "segments", segments, "bytes", bytes, "kernel_stamped", stamped,
                         "watched", watched);
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
            free_segments(r->streams[i]);
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
    {"sent", (PyCFunction)Reader_sent, METH_O, "The kernel's stamp of the latest send leaving, or None (cleared)."},
    {"pending", (PyCFunction)Reader_pending, METH_O, "Bytes, an end or an error are queued for fd."},
    {"ready", (PyCFunction)Reader_ready, METH_NOARGS, "The fds with news since the last call."},
    {"fileno", (PyCFunction)Reader_fileno, METH_NOARGS, "The eventfd that becomes readable when fds are ready."},
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

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_rxnative",
                                       "Native receive thread for streaming sockets (Linux).", -1, NULL};

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
    return m;
}
