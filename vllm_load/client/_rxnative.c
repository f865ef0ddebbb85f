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
 * the Python side last collected the news (Reader.drain()), so one wake of the event loop can
 * serve hundreds of streams.
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
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

#include "_sse.h"

#define READ_SIZE 65536
/* the event loop is woken at most once per millisecond: stamps are taken as data lands, so a later
 * wake costs no accuracy, and under load one wake hands over many streams' chunks at once */
#define NOTIFY_EVERY_NS 1000000LL
/* after a small batch the thread naps this long before its next epoll_wait, so one wake reads many
 * sockets: waking per chunk cost 17 us of CPU per chunk (mostly the kernel's, on a VM) at 17k chunks/s;
 * a 0.2 ms nap cost the thread 14.2 % of a core at 1,024 streams and 39k chunks/s, 0.5 ms 10.8 %.
 * A stream's chunks closer together than this may share a stamp, an error below this bound (a GPU's
 * decode steps are 2 ms and more apart) */
#define NAP_NS 500000L
#define NAP_BELOW 32
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
    int hdr_match;   /* pop: how much of a header block's end (CRLF CRLF) the bytes popped so far end with */
    /* body mode: the thread decodes the response body (chunked or not) and splits it into lines */
    int body;        /* 0: raw segments; 1: a streamed body is being parsed into lines */
    int chunked;     /* Transfer-Encoding: chunked */
    int64_t left;    /* bytes left: of the current chunk (chunked) or of Content-Length (-1: until close) */
    int cstate;      /* chunked decoder state */
    int after_lf;    /* the state after C_LF's line feed */
    int body_state;  /* 0 running, 1 complete, 2 closed before the end, 3 malformed */
    uint64_t body_bytes;
    char *line;
    size_t linelen, linecap;
    seg_t *lhead, *ltail; /* complete lines, each with the stamp of the read that completed it */
    int nlines;
    /* an SSE body this thread parses itself (_sse.c): its lines stay here until the body ends, or until a
     * line the parser leaves to Python, from which on lines are queued as above */
    sse_state *sse;
    int parsing;
    int64_t last_read_ns; /* monotonic: a parsed body shows the event loop no activity, so timeouts ask */
    /* expect(): the thread takes a 200 response's header block itself and goes on into its body, so the
     * event loop hears of the request once, at its end (the head wait was a second wake per request) */
    int expecting;
    int exp_match;      /* how much of CRLF CRLF the raw bytes scanned so far end with */
    size_t exp_seen;    /* raw bytes scanned so far for the header block's end */
    double exp_start;   /* the request's start (time.time() clock) */
    int exp_from_send;  /* closed loop: offsets count from the kernel's stamp of the send, as the loop does */
    long long exp_limit; /* the parser's token limit (sse_state.limit; 0: none) */
    int accepted;       /* the head was taken here: */
    int acc_chunked, acc_keep;
    int64_t acc_length;
    double acc_start;   /* the start the body's offsets count from */
} stream_t;

/* C_LF: a CR was read, an LF must follow, then the state in after_lf (C_END: the body is complete) */
enum { C_SIZE, C_EXT, C_DATA, C_DATA_CR, C_TRAILER, C_TRAILER_LINE, C_LF, C_END };

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_t thread;
    int started, stopping;
    int ep, efd;
    stream_t **streams; /* indexed by fd */
    int nstreams;
    int *readyv; /* fds with news since the last drain() */
    int nready, capready;
    int notified;
    uint32_t gen;
    unsigned long long segments, bytes, stamped;
    /* how long after landing (kernel stamp) segments were read, since the last take_lag(): a read later
     * than a stream's token gap is where two of its chunks can share a stamp */
    int64_t lag_max_ns;
    unsigned long long lag_reads, late_reads;
    int priority; /* what the thread got: PRIO_NAMES */
} Reader;

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

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
    for (g = s->lhead; g;) {
        seg_t *n = g->next;
        free(g);
        g = n;
    }
    s->lhead = s->ltail = NULL;
    s->nlines = 0;
    free(s->line);
    s->line = NULL;
    s->linelen = s->linecap = 0;
    sse_free(s->sse);
    s->sse = NULL;
    s->parsing = 0;
}

static seg_t *new_seg(const char *p, size_t n, int64_t stamp) {
    seg_t *g = malloc(sizeof(seg_t) + n);
    if (g) {
        g->next = NULL;
        g->len = n;
        g->off = 0;
        g->stamp_ns = stamp;
        memcpy(g->data, p, n);
    }
    return g;
}

static void append_seg(seg_t **head, seg_t **tail, seg_t *g) {
    if (*tail)
        (*tail)->next = g;
    else
        *head = g;
    *tail = g;
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


/* with the lock held: decoded body bytes, cut into lines; a line's stamp is the read that completed it */
static int add_lines(stream_t *s, const char *p, size_t n, int64_t stamp) {
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) + 1 : n;
        if (s->linelen + take > s->linecap) {
            size_t cap = s->linecap ? s->linecap : 1024;
            while (cap < s->linelen + take)
                cap *= 2;
            char *b = realloc(s->line, cap);
            if (!b)
                return -1;
            s->line = b;
            s->linecap = cap;
        }
        memcpy(s->line + s->linelen, p, take);
        s->linelen += take;
        p += take;
        n -= take;
        if (nl) {
            size_t len = s->linelen;
            int blank = len == 1 || (len == 2 && s->line[0] == '\r');
            if (!blank && s->parsing) {
                int rc = sse_line(s->sse, s->line, len, stamp);
                if (rc == SSE_NOMEM)
                    return -1;
                if (rc == SSE_OK)
                    blank = 1; /* taken: nothing for the Python side */
                else
                    s->parsing = 0; /* this line and the rest are Python's */
            }
            if (!blank) { /* event separators carry nothing: they stay out of the Python side's work */
                seg_t *g = new_seg(s->line, len, stamp);
                if (!g)
                    return -1;
                append_seg(&s->lhead, &s->ltail, g);
                s->nlines++;
            }
            s->linelen = 0;
        }
    }
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* with the lock held: parse n bytes of the body; returns how many belong to it (the rest is the next
 * response's, left raw) */
static size_t body_feed(stream_t *s, const char *p, size_t n, int64_t stamp) {
    size_t i = 0;
    if (!s->chunked) {
        size_t take = n;
        if (s->left >= 0 && (int64_t)take > s->left)
            take = (size_t)s->left;
        if (add_lines(s, p, take, stamp) < 0) {
            s->body_state = 3;
            return n;
        }
        s->body_bytes += take;
        if (s->left >= 0) {
            s->left -= (int64_t)take;
            if (!s->left)
                s->body_state = 1;
        }
        return take;
    }
    while (i < n && s->body_state == 0) {
        char c = p[i];
        switch (s->cstate) {
        case C_SIZE: {
            int v = hexval(c);
            if (v >= 0) {
                if (s->left > ((int64_t)1 << 40)) {
                    s->body_state = 3;
                    return n;
                }
                s->left = s->left * 16 + v;
            } else if (c == ';' || c == ' ' || c == '\t') {
                s->cstate = C_EXT;
            } else if (c == '\r') {
                s->cstate = C_LF;
                s->after_lf = s->left ? C_DATA : C_TRAILER;
            } else if (c == '\n') {
                s->cstate = s->left ? C_DATA : C_TRAILER;
            } else {
                s->body_state = 3;
                return n;
            }
            i++;
            break;
        }
        case C_EXT:
            if (c == '\n')
                s->cstate = s->left ? C_DATA : C_TRAILER;
            i++;
            break;
        case C_DATA: {
            size_t take = n - i;
            if ((int64_t)take > s->left)
                take = (size_t)s->left;
            if (add_lines(s, p + i, take, stamp) < 0) {
                s->body_state = 3;
                return n;
            }
            s->body_bytes += take;
            s->left -= (int64_t)take;
            i += take;
            if (!s->left)
                s->cstate = C_DATA_CR;
            break;
        }
        case C_DATA_CR:
            if (c == '\r') {
                s->cstate = C_LF;
                s->after_lf = C_SIZE;
            } else if (c == '\n') {
                s->cstate = C_SIZE;
            } else {
                s->body_state = 3;
                return n;
            }
            i++;
            break;
        case C_TRAILER: /* after the last chunk: trailer lines until an empty one */
            if (c == '\r') {
                s->cstate = C_LF;
                s->after_lf = C_END;
            } else if (c == '\n') {
                s->body_state = 1;
            } else {
                s->cstate = C_TRAILER_LINE;
            }
            i++;
            break;
        case C_LF:
            if (c != '\n') {
                s->body_state = 3;
                return n;
            }
            if (s->after_lf == C_END)
                s->body_state = 1;
            else
                s->cstate = s->after_lf;
            i++;
            break;
        case C_TRAILER_LINE:
            if (c == '\n')
                s->cstate = C_TRAILER;
            i++;
            break;
        }
    }
    return i;
}

/* with the lock held: append n raw bytes (a read's, or what a body left) to the raw queue */
static int queue_raw(Reader *r, stream_t *s, const char *p, size_t n, int64_t stamp) {
    seg_t *g = new_seg(p, n, stamp);
    if (!g)
        return -1;
    append_seg(&s->head, &s->tail, g);
    s->queued += n;
    r->segments++;
    return 0;
}

/* how many of p's n bytes to take so a read ends at a header block's end (CRLF CRLF), wherever reads cut
 * it: *take, and 1 when that end is among them; *matched carries how much of the end the bytes taken so
 * far end with */
static int header_cut(int *matched, const char *p, size_t n, size_t *take) {
    static const char end[] = "\r\n\r\n";
    int m = *matched;
    for (size_t i = 0; i < n; i++) {
        m = p[i] == end[m] ? m + 1 : (p[i] == '\r');
        if (m == 4) {
            *matched = 0;
            *take = i + 1;
            return 1;
        }
    }
    *matched = m;
    *take = n;
    return 0;
}

static int arm(Reader *r, int fd, stream_t *s);

/* with the lock held: a stream paused for a full queue is read again once its queue fell below half */
static void resume(Reader *r, int fd, stream_t *s) {
    if (s->paused && s->queued < PAUSE_BYTES / 2 && !s->eof && !s->err) {
        s->paused = 0;
        arm(r, fd, s);
    }
}

/* with the lock held: copy the first n queued raw bytes to dst, leaving them queued; how many were copied */
static size_t peek_raw(const stream_t *s, char *dst, size_t n) {
    size_t at = 0;
    for (const seg_t *g = s->head; g && at < n; g = g->next) {
        size_t take = g->len - g->off;
        if (take > n - at)
            take = n - at;
        memcpy(dst + at, g->data + g->off, take);
        at += take;
    }
    return at;
}

/* with the lock held: drop the first n queued raw bytes (n at most what is queued) */
static void drop_raw(Reader *r, int fd, stream_t *s, size_t n) {
    while (n) {
        seg_t *g = s->head;
        size_t take = g->len - g->off;
        if (take > n)
            take = n;
        g->off += take;
        s->queued -= take;
        n -= take;
        if (g->off == g->len) {
            s->head = g->next;
            if (!s->head)
                s->tail = NULL;
            free(g);
        }
    }
    resume(r, fd, s);
}

#define HEAD_MAX 65536 /* a response's header block larger than this is not an inference server's */
#define DECLINED 4      /* body_state of an expected head left to the event loop (not a 200 we can take) */

/* with the lock held: the body of a response whose headers are parsed: from now on this thread decodes it
 * (chunked, or `length` bytes, or until close when length < 0) into lines, and with `parse` parses them as
 * SSE; what the thread already read of it is decoded at once */
static void start_body(Reader *r, int fd, stream_t *s, int chunked, long long length, sse_state *parse) {
    sse_free(s->sse); /* a previous answer's, never taken */
    s->sse = parse;
    s->parsing = parse != NULL;
    seg_t *g;
    while ((g = s->lhead)) { /* a previous answer's lines nobody took */
        s->lhead = g->next;
        free(g);
    }
    s->ltail = NULL;
    s->nlines = 0;
    s->linelen = 0;
    s->body = 1;
    s->chunked = chunked;
    s->left = chunked ? 0 : length;
    s->cstate = C_SIZE;
    s->body_state = (!chunked && length == 0) ? 1 : 0;
    s->body_bytes = 0;
    while ((g = s->head) && s->body_state == 0) {
        size_t n = g->len - g->off;
        size_t used = body_feed(s, g->data + g->off, n, g->stamp_ns);
        s->queued -= used;
        g->off += used;
        if (g->off == g->len) {
            s->head = g->next;
            if (!s->head)
                s->tail = NULL;
            free(g);
        }
    }
    if (s->body_state == 0 && s->eof) {
        s->body_state = (!chunked && length < 0) ? 1 : 2;
    }
    if (s->body_state != 0)
        s->body = 0;
    resume(r, fd, s);
}

static int lower_eq(const char *p, size_t n, const char *word) {
    size_t k = strlen(word);
    if (n != k)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != word[i])
            return 0;
    }
    return 1;
}

static int space(char c) { /* what Python's bytes.strip() strips */
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

static void trim(const char **p, size_t *n) {
    while (*n && space(**p)) {
        (*p)++;
        (*n)--;
    }
    while (*n && space((*p)[*n - 1]))
        (*n)--;
}

/* a header block (through its blank line) the thread may take: an HTTP/1.1 200 with its framing known,
 * read as direct.Head.parse reads it (lines cut at CRLF only, names and values stripped as bytes.strip
 * does, a repeated field read as it reads it); 0 for anything else (the event loop's parser takes it) */
static int parse_head(const char *p, size_t n, int *chunked, int64_t *length, int *keep) {
    static const char status[] = "HTTP/1.1 200";
    if (n < sizeof status || memcmp(p, status, sizeof status - 1) != 0
        || (p[sizeof status - 1] != ' ' && p[sizeof status - 1] != '\r'))
        return 0;
    *chunked = 0;
    *length = -1;
    *keep = 1;
    const char *end = p + n;
    const char *at = memmem(p, n, "\r\n", 2);
    while (at && at + 2 < end) {
        const char *start = at + 2;
        at = memmem(start, (size_t)(end - start), "\r\n", 2);
        size_t len = at ? (size_t)(at - start) : (size_t)(end - start);
        const char *colon = memchr(start, ':', len);
        if (!colon)
            continue;
        const char *name = start, *value = colon + 1;
        size_t nlen = (size_t)(colon - start), vlen = len - nlen - 1;
        trim(&name, &nlen);
        if (lower_eq(name, nlen, "transfer-encoding")) {
            *chunked = 0;
            for (size_t i = 0; i + 7 <= vlen; i++)
                if (lower_eq(value + i, 7, "chunked"))
                    *chunked = 1;
            continue;
        }
        trim(&value, &vlen);
        if (lower_eq(name, nlen, "content-length")) {
            if (!vlen || vlen > 15)
                return 0;
            int64_t v = 0;
            for (size_t i = 0; i < vlen; i++) {
                if (value[i] < '0' || value[i] > '9')
                    return 0;
                v = v * 10 + (value[i] - '0');
            }
            *length = v;
        } else if (lower_eq(name, nlen, "connection")) {
            *keep = !lower_eq(value, vlen, "close") && (*keep || lower_eq(value, vlen, "keep-alive"));
        }
    }
    if (*chunked)
        *length = -1;
    return 1;
}

/* with the lock held: the expected head is not one this thread takes (or the connection ended before it):
 * the event loop reads it from the raw queue as it reads any other */
static void decline(Reader *r, int fd, stream_t *s) {
    s->expecting = 0;
    s->body_state = DECLINED;
    mark_ready(r, fd, s);
}

/* with the lock held: the expected header block is the first `len` raw bytes: take it and the body on,
 * or leave both to the event loop */
static void accept_head(Reader *r, int fd, stream_t *s, size_t len) {
    char *blk = malloc(len);
    if (!blk) {
        decline(r, fd, s);
        return;
    }
    int chunked, keep;
    int64_t length;
    int ok = peek_raw(s, blk, len) == len && parse_head(blk, len, &chunked, &length, &keep);
    free(blk);
    double start = s->exp_start;
    if (s->exp_from_send && s->tx_ns) { /* exchange.py's Clock.sent_at, on the same double */
        double tx = stamp_seconds(s->tx_ns);
        if (tx >= start)
            start = tx;
    }
    sse_state *parse = ok ? sse_new(start) : NULL;
    if (parse)
        parse->limit = s->exp_limit;
    if (!parse) {
        decline(r, fd, s);
        return;
    }
    drop_raw(r, fd, s, len); /* the header block off the raw queue */
    s->expecting = 0;
    s->accepted = 1;
    s->acc_chunked = chunked;
    s->acc_keep = keep;
    s->acc_length = length;
    s->acc_start = start;
    start_body(r, fd, s, chunked, length, parse);
    if (!s->parsing || s->body_state || s->nlines || s->err || s->eof)
        mark_ready(r, fd, s);
}

/* with the lock held: n more raw bytes (the last n queued) of an expected response: has its head ended? */
static void expect_scan(Reader *r, int fd, stream_t *s, const char *p, size_t n) {
    size_t take;
    if (header_cut(&s->exp_match, p, n, &take)) {
        accept_head(r, fd, s, s->exp_seen + take);
        return;
    }
    s->exp_seen += n;
    if (s->exp_seen > HEAD_MAX)
        decline(r, fd, s);
}

/* with the lock held: bytes that arrived while the body is parsed */
static void body_bytes_in(Reader *r, stream_t *s, const char *p, size_t n, int64_t stamp) {
    size_t used = body_feed(s, p, n, stamp);
    if (s->body_state != 0) {
        s->body = 0; /* what follows the body is raw again (a keep-alive connection's next answer) */
        if (used < n && s->body_state == 1)
            queue_raw(r, s, p + used, n - used, stamp);
    }
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
        if (s->expecting)
            decline(r, fd, s);
        mark_ready(r, fd, s);
        return;
    }
    if (n == 0) { /* end of stream: stop watching, or level-triggered epoll reports it forever */
        s->eof = 1;
        if (s->body) { /* a body read until close ends here; any other is cut short */
            s->body_state = (!s->chunked && s->left < 0) ? 1 : 2;
            s->body = 0;
        }
        epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        if (s->expecting)
            decline(r, fd, s);
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
    int late = 0;
    if (stamp) {
        int64_t lag = realtime_ns() - stamp;
        if (lag > r->lag_max_ns)
            r->lag_max_ns = lag;
        r->lag_reads++;
        late = lag > 1000000; /* 1 ms: native.LATE_S */
        r->late_reads += late;
    } else {
        stamp = realtime_ns(); /* no kernel stamp: this thread reads at once, so its clock is close */
    }
    if (s->sse)
        s->sse->late = late; /* the chunks this read completes: a gap of 0 among them is this read's doing */
    r->bytes += (uint64_t)n;
    s->last_read_ns = monotonic_ns();
    if (s->body) {
        body_bytes_in(r, s, buf, (size_t)n, stamp);
        /* a body parsed here has news for the event loop only once it ended, or once it has lines */
        if (!s->parsing || s->body_state || s->nlines)
            mark_ready(r, fd, s);
        return;
    }
    if (queue_raw(r, s, buf, (size_t)n, stamp) < 0) {
        s->err = ENOMEM;
        epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        if (s->expecting)
            decline(r, fd, s);
        mark_ready(r, fd, s);
        return;
    }
    if (s->expecting) { /* no news for the event loop until the head is taken or left to it */
        expect_scan(r, fd, s, buf, (size_t)n);
        return;
    }
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

/* with the lock held: one epoll event */
static void handle_event(Reader *r, const struct epoll_event *ev, char *buf) {
    int fd = (int)(ev->data.u64 & 0xffffffffu);
    uint32_t gen = (uint32_t)(ev->data.u64 >> 32);
    if (fd < 0 || fd >= r->nstreams)
        return;
    stream_t *s = r->streams[fd];
    if (!s || !s->active || s->gen != gen || s->eof || s->err)
        return; /* unwatched, or an event of a closed fd whose number was reused */
    if (ev->events & EPOLLERR)
        read_errqueue(fd, s); /* before the data: the request left before its answer came */
    if (!s->paused)
        read_one(r, fd, s, buf);
}

/* The thread must read a stream's chunk before that stream's next one lands, however busy the event-loop
 * thread of the same process is. At normal priority, on a core it shares with that thread, Linux let it
 * wait up to ~7 ms for the CPU (measured: 2% of reads later than 1 ms at 256 streams on one core). It asks
 * for real-time priority (it runs a few microseconds per wake), else for nice -10, else runs as it is
 * (no CAP_SYS_NICE, e.g. in a container). Below real time it also asks for a 0.1 ms slice (sched_setattr's
 * sched_runtime for a fair task, Linux 6.12's EEVDF, no privilege needed): a short slice gives an early
 * virtual deadline, so its wake-up preempts a CPU-bound thread instead of queueing behind it. Measured
 * without CAP_SYS_NICE, both cores busy, a loop blocked 50 ms in 70 while chunks land 10 ms apart: chunks
 * merged into one stamp in 3 runs of 6 without the slice. The run's verdict reports how late it read. */
enum { PRIO_NORMAL, PRIO_SLICE, PRIO_NICE_SLICE, PRIO_NICE, PRIO_REALTIME, PRIO_STARTING };
static const char *PRIO_NAMES[] = {"normal priority", "normal priority with a 0.1 ms slice",
                                   "nice -10 with a 0.1 ms slice", "nice -10", "real-time priority (SCHED_FIFO 1)",
                                   "starting"};

struct fair_attr { /* struct sched_attr (include/uapi/linux/sched/types.h), its first version */
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
};

/* a kernel before 6.12 takes the call and ignores the runtime: the slice counts only if it reads back */
static int short_slice(int nice) {
    struct fair_attr a = {.size = sizeof(struct fair_attr), .policy = SCHED_OTHER, .nice = nice, .runtime = 100000};
    if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
        return 0;
    struct fair_attr got = {0};
    return syscall(SYS_sched_getattr, 0, &got, sizeof got, 0) == 0 && got.runtime == a.runtime;
}

static int raise_priority(void) {
    struct sched_param sp = {.sched_priority = 1};
    if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) == 0)
        return PRIO_REALTIME;
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), -10) == 0)
        return short_slice(-10) ? PRIO_NICE_SLICE : PRIO_NICE;
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    return errno == 0 && short_slice(nice) ? PRIO_SLICE : PRIO_NORMAL;
}

static void *run(void *arg) {
    Reader *r = (Reader *)arg;
    int got = raise_priority();
    pthread_mutex_lock(&r->lock);
    r->priority = got;
    pthread_mutex_unlock(&r->lock);
    struct epoll_event evs[256];
    char *buf = malloc(READ_SIZE);
    if (!buf)
        return NULL;
    int timeout = -1;
    int64_t last_notify = 0;
    for (;;) {
        int n = epoll_wait(r->ep, evs, 256, timeout);
        if (n < 0 && errno != EINTR)
            break;
        /* the lock is taken per socket, not per batch: the Python side (holding the GIL) never waits
         * behind a whole batch of reads */
        for (int i = 0; i < n; i++) {
            pthread_mutex_lock(&r->lock);
            handle_event(r, &evs[i], buf);
            pthread_mutex_unlock(&r->lock);
        }
        pthread_mutex_lock(&r->lock);
        int stopping = r->stopping;
        timeout = -1;
        if (r->nready && !r->notified) {
            int64_t now = monotonic_ns(), wait = last_notify + NOTIFY_EVERY_NS - now;
            if (wait <= 0) {
                uint64_t one = 1;
                r->notified = 1;
                last_notify = now;
                ssize_t w = write(r->efd, &one, sizeof one);
                (void)w;
            } else {
                timeout = (int)((wait + 999999) / 1000000); /* read on meanwhile; wake the loop then */
            }
        }
        pthread_mutex_unlock(&r->lock);
        if (stopping)
            break;
        if (n < NAP_BELOW) {
            struct timespec nap = {0, NAP_NS};
            nanosleep(&nap, NULL);
        }
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
    int started = pthread_create(&r->thread, NULL, run, r);
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

static int arm(Reader *r, int fd, stream_t *s) {
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
    int fd = fd_arg(arg);
    if (fd < 0)
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

/* with the lock held: take the first n queued raw bytes off the stream into a new bytes object */
static PyObject *take_raw(Reader *r, int fd, stream_t *s, size_t n) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (!out)
        return NULL;
    peek_raw(s, PyBytes_AS_STRING(out), n);
    drop_raw(r, fd, s, n);
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
    /* a read stops at the end of a header block: the HTTP parser then holds the headers only, and a
     * streamed body can be handed to this thread (Reader.body) with nothing of it parsed yet */
    header_cut(&s->hdr_match, g->data + g->off, take, &take);
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
    for (seg_t *g = s->head; g && !found && seen <= HEAD_MAX; g = g->next) {
        size_t take;
        int ended = header_cut(&matched, g->data + g->off, g->len - g->off, &take);
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

/* body(fd, chunked, length, start_wall=None): the response's headers are parsed; from now on this thread
 * decodes its body (chunked, or `length` bytes, or until close when length < 0) and cuts it into lines.
 * With start_wall (the request's start, time.time() clock) it also parses them as SSE (_sse.c), chunk
 * offsets counted from it, and hands the result over once, with the body's end (drain(), lines()). */
static PyObject *Reader_body(Reader *r, PyObject *args) {
    int fd, chunked;
    long long length;
    PyObject *start = Py_None;
    long long limit = 0;
    if (!PyArg_ParseTuple(args, "ipL|OL", &fd, &chunked, &length, &start, &limit))
        return NULL;
    double start_wall = 0.0;
    if (start != Py_None) {
        start_wall = PyFloat_AsDouble(start);
        if (start_wall == -1.0 && PyErr_Occurred())
            return NULL;
    }
    sse_state *parse = NULL;
    if (start != Py_None && !(parse = sse_new(start_wall)))
        return PyErr_NoMemory();
    if (parse)
        parse->limit = limit;
    stream_t *s = lock_stream(r, fd);
    if (!s) {
        sse_free(parse);
        return NULL;
    }
    s->expecting = 0;
    start_body(r, fd, s, chunked, length, parse);
    pthread_mutex_unlock(&r->lock);
    Py_RETURN_NONE;
}

/* expect(fd, start_wall, from_send) -> bool: a request is about to be sent on fd; when its answer's header
 * block is an HTTP/1.1 200 with known framing, this thread takes it and goes on into the body as
 * body(fd, chunked, length, start) would (accepted(fd) says what it read), so the event loop wakes once,
 * at the body's end. Anything else is left raw for head(fd), with state 4 reported once (drain, lines).
 * start: start_wall, or with from_send the kernel's stamp of the send when later (a closed loop counts
 * from the send). True when the answer was already settled (queued before the call): no wake comes. */
static PyObject *Reader_expect(Reader *r, PyObject *args) {
    int fd, from_send;
    double start_wall;
    long long limit = 0;
    if (!PyArg_ParseTuple(args, "idp|L", &fd, &start_wall, &from_send, &limit))
        return NULL;
    stream_t *s = lock_stream(r, fd);
    if (!s)
        return NULL;
    s->body = 0;
    s->body_state = 0;
    s->body_bytes = 0;
    s->accepted = 0;
    s->tx_ns = 0;
    s->expecting = 1;
    s->exp_match = 0;
    s->exp_seen = 0;
    s->exp_start = start_wall;
    s->exp_from_send = from_send;
    s->exp_limit = limit;
    s->last_read_ns = monotonic_ns(); /* a timeout counts from the send */
    for (seg_t *g = s->head, *next; g && s->expecting; g = next) { /* a dirty connection's bytes */
        next = g->next; /* taking the head frees the segments it spans */
        expect_scan(r, fd, s, g->data + g->off, g->len - g->off);
    }
    if (s->expecting && (s->err || s->eof))
        decline(r, fd, s);
    int settled = !s->expecting;
    pthread_mutex_unlock(&r->lock);
    return PyBool_FromLong(settled);
}

/* accepted(fd) -> (chunked, length, keep_alive, start) | None: the head the thread took for expect() */
static PyObject *Reader_accepted(Reader *r, PyObject *arg) {
    int fd;
    stream_t *s = lock_arg(r, arg, &fd);
    if (!s)
        return NULL;
    int got = s->accepted, chunked = s->acc_chunked, keep = s->acc_keep;
    long long length = s->acc_length;
    double start = s->acc_start;
    pthread_mutex_unlock(&r->lock);
    if (!got)
        Py_RETURN_NONE;
    return Py_BuildValue("(OLOd)", chunked ? Py_True : Py_False, length, keep ? Py_True : Py_False, start);
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
    if (s->sse && (flush || !s->parsing || s->body_state || s->err || s->eof)) {
        t->sse = s->sse;
        s->sse = NULL;
        s->parsing = 0;
    }
    if (s->body_state != 0 && s->linelen) {
        seg_t *last = new_seg(s->line, s->linelen, realtime_ns());
        if (last) {
            append_seg(&s->lhead, &s->ltail, last);
            s->nlines++;
        }
        s->linelen = 0;
    }
    t->fd = fd;
    t->lines = s->lhead;
    t->nlines = s->nlines;
    t->state = s->body_state;
    t->err = s->err;
    t->body_bytes = s->body_bytes;
    s->lhead = s->ltail = NULL;
    s->nlines = 0;
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
    if (t.state == 0 && t.err && t.nlines == 0 && parsed == Py_None && !flush) {
        Py_DECREF(out);
        Py_DECREF(parsed);
        errno = t.err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("(NiKN)", out, t.state, t.body_bytes, parsed);
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

/* sent(fd) -> float | None: the kernel's stamp of the latest send leaving (time.time() clock), cleared */
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
    int pending = s ? (s->head || s->eof || s->err) : 0;
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
            item = Py_BuildValue("(iNiKiN)", took[i].fd, lines, took[i].state, took[i].body_bytes, took[i].err,
                                 parsed);
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
    return Py_BuildValue("(dKK)", lag, reads, late);
}

static PyObject *Reader_stats(Reader *r, PyObject *unused) {
    pthread_mutex_lock(&r->lock);
    unsigned long long segments = r->segments, bytes = r->bytes, stamped = r->stamped;
    int watched = 0;
    for (int i = 0; i < r->nstreams; i++)
        watched += r->streams[i] && r->streams[i]->active;
    pthread_mutex_unlock(&r->lock);
    return Py_BuildValue("{sKsKsKsiss}", "segments", segments, "bytes", bytes, "kernel_stamped", stamped,
                         "watched", watched, "priority", PRIO_NAMES[r->priority]);
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
    {"head", (PyCFunction)Reader_head, METH_O, "head(fd) -> a complete header block | None | b'' (ended)"},
    {"send", (PyCFunction)Reader_send, METH_VARARGS, "send(fd, data) -> bytes sent (0: buffer full), GIL held"},
    {"body", (PyCFunction)Reader_body, METH_VARARGS,
     "body(fd, chunked, length, start_wall=None, limit=0): decode the body into lines (and parse them as SSE; "
     "past limit tokens the lines go to Python)."},
    {"expect", (PyCFunction)Reader_expect, METH_VARARGS,
     "expect(fd, start_wall, from_send, limit=0) -> settled: take a 200's head here and go on into its body."},
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

/* parse_sse(lines, start_wall) -> (parsed, taken): the thread's SSE parser over (line, stamp_ns) pairs, as it
 * runs on a body's lines: the result StreamState.absorb takes, and how many lines it took before the first
 * one it leaves to Python (len(lines) when none). For tests and tools; the thread calls sse_line itself. */
static PyObject *parse_sse(PyObject *self, PyObject *args) {
    PyObject *lines;
    double start_wall;
    long long limit = 0;
    if (!PyArg_ParseTuple(args, "O!d|L", &PyList_Type, &lines, &start_wall, &limit))
        return NULL;
    sse_state *st = sse_new(start_wall);
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
     "parse_sse([(line, stamp_ns[, late])], start_wall, limit=0) -> (parsed, lines taken)"},
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
    return m;
}
