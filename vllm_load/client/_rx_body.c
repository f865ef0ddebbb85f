/* The receive thread's decoding: a stream's raw segments and lines, an HTTP/1.1 head taken or declined, a body
 * decoded (chunked or by length) into stamped lines and, for SSE, parsed as they are cut (_sse.c). Every function
 * here runs with the Reader's lock held. */
#include "_rx.h"

void rx_free_segments(stream_t *s) {
    seg_t *g = s->raw.head;
    while (g) {
        seg_t *n = g->next;
        free(g);
        g = n;
    }
    s->raw.head = s->raw.tail = NULL;
    s->raw.queued = 0;
    for (g = s->body.lhead; g;) {
        seg_t *n = g->next;
        free(g);
        g = n;
    }
    s->body.lhead = s->body.ltail = NULL;
    s->body.nlines = 0;
    free(s->body.line);
    s->body.line = NULL;
    s->body.linelen = s->body.linecap = 0;
    sse_free(s->parse.sse);
    s->parse.sse = NULL;
    s->parse.on = 0;
}

seg_t *rx_new_seg(const char *p, size_t n, int64_t stamp) {
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

void rx_append_seg(seg_t **head, seg_t **tail, seg_t *g) {
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
        if (s->body.linelen + take > LINE_MAX_BYTES)
            return -1; /* the body is malformed: a stream's line is never this long */
        if (s->body.linelen + take > s->body.linecap) {
            size_t cap = s->body.linecap ? s->body.linecap : 1024;
            while (cap < s->body.linelen + take)
                cap *= 2;
            char *b = realloc(s->body.line, cap);
            if (!b)
                return -1;
            s->body.line = b;
            s->body.linecap = cap;
        }
        memcpy(s->body.line + s->body.linelen, p, take);
        s->body.linelen += take;
        p += take;
        n -= take;
        if (nl) {
            size_t len = s->body.linelen;
            int blank = len == 1 || (len == 2 && s->body.line[0] == '\r');
            if (!blank && s->parse.on) {
                int rc = sse_line(s->parse.sse, s->body.line, len, stamp);
                if (rc == SSE_NOMEM)
                    return -1;
                if (rc == SSE_OK)
                    blank = 1; /* taken: nothing for the Python side */
                else
                    s->parse.on = 0; /* this line and the rest are Python's */
            }
            if (!blank) { /* event separators carry nothing: they stay out of the Python side's work */
                seg_t *g = rx_new_seg(s->body.line, len, stamp);
                if (!g)
                    return -1;
                rx_append_seg(&s->body.lhead, &s->body.ltail, g);
                s->body.nlines++;
            }
            s->body.linelen = 0;
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
    if (!s->body.chunked) {
        size_t take = n;
        if (s->body.left >= 0 && (int64_t)take > s->body.left)
            take = (size_t)s->body.left;
        if (add_lines(s, p, take, stamp) < 0) {
            s->body.state = BODY_MALFORMED;
            return n;
        }
        s->body.bytes += take;
        if (s->body.left >= 0) {
            s->body.left -= (int64_t)take;
            if (!s->body.left)
                s->body.state = BODY_COMPLETE;
        }
        return take;
    }
    while (i < n && s->body.state == BODY_RUNNING) {
        char c = p[i];
        switch (s->body.cstate) {
        case C_SIZE: {
            int v = hexval(c);
            if (v >= 0) {
                if (s->body.left > ((int64_t)1 << 40)) {
                    s->body.state = BODY_MALFORMED;
                    return n;
                }
                s->body.left = s->body.left * 16 + v;
            } else if (c == ';' || c == ' ' || c == '\t') {
                s->body.cstate = C_EXT;
            } else if (c == '\r') {
                s->body.cstate = C_LF;
                s->body.after_lf = s->body.left ? C_DATA : C_TRAILER;
            } else if (c == '\n') {
                s->body.cstate = s->body.left ? C_DATA : C_TRAILER;
            } else {
                s->body.state = BODY_MALFORMED;
                return n;
            }
            i++;
            break;
        }
        case C_EXT:
            if (c == '\n')
                s->body.cstate = s->body.left ? C_DATA : C_TRAILER;
            i++;
            break;
        case C_DATA: {
            size_t take = n - i;
            if ((int64_t)take > s->body.left)
                take = (size_t)s->body.left;
            if (add_lines(s, p + i, take, stamp) < 0) {
                s->body.state = BODY_MALFORMED;
                return n;
            }
            s->body.bytes += take;
            s->body.left -= (int64_t)take;
            i += take;
            if (!s->body.left)
                s->body.cstate = C_DATA_CR;
            break;
        }
        case C_DATA_CR:
            if (c == '\r') {
                s->body.cstate = C_LF;
                s->body.after_lf = C_SIZE;
            } else if (c == '\n') {
                s->body.cstate = C_SIZE;
            } else {
                s->body.state = BODY_MALFORMED;
                return n;
            }
            i++;
            break;
        case C_TRAILER: /* after the last chunk: trailer lines until an empty one */
            if (c == '\r') {
                s->body.cstate = C_LF;
                s->body.after_lf = C_END;
            } else if (c == '\n') {
                s->body.state = BODY_COMPLETE;
            } else {
                s->body.cstate = C_TRAILER_LINE;
            }
            i++;
            break;
        case C_LF:
            if (c != '\n') {
                s->body.state = BODY_MALFORMED;
                return n;
            }
            if (s->body.after_lf == C_END)
                s->body.state = BODY_COMPLETE;
            else
                s->body.cstate = s->body.after_lf;
            i++;
            break;
        case C_TRAILER_LINE:
            if (c == '\n')
                s->body.cstate = C_TRAILER;
            i++;
            break;
        }
    }
    return i;
}

/* with the lock held: append n raw bytes (a read's, or what a body left) to the raw queue */
static int queue_raw(Reader *r, stream_t *s, const char *p, size_t n, int64_t stamp) {
    seg_t *g = rx_new_seg(p, n, stamp);
    if (!g)
        return -1;
    rx_append_seg(&s->raw.head, &s->raw.tail, g);
    s->raw.queued += n;
    r->segments++;
    return 0;
}

/* how many of p's n bytes to take so a read ends at a header block's end (CRLF CRLF), wherever reads cut
 * it: *take, and 1 when that end is among them; *matched carries how much of the end the bytes taken so
 * far end with */
int rx_header_cut(int *matched, const char *p, size_t n, size_t *take) {
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

/* with the lock held: a stream paused for a full queue is read again once its queue fell below half */
static void resume(Reader *r, int fd, stream_t *s) {
    if (s->raw.paused && s->raw.queued < PAUSE_BYTES / 2 && !s->eof && !s->err) {
        s->raw.paused = 0;
        rx_arm(r, fd, s);
    }
}

/* with the lock held: copy the first n queued raw bytes to dst, leaving them queued; how many were copied */
size_t rx_peek_raw(const stream_t *s, char *dst, size_t n) {
    size_t at = 0;
    for (const seg_t *g = s->raw.head; g && at < n; g = g->next) {
        size_t take = g->len - g->off;
        if (take > n - at)
            take = n - at;
        memcpy(dst + at, g->data + g->off, take);
        at += take;
    }
    return at;
}

/* with the lock held: drop the first n queued raw bytes (n at most what is queued) */
void rx_drop_raw(Reader *r, int fd, stream_t *s, size_t n) {
    while (n) {
        seg_t *g = s->raw.head;
        size_t take = g->len - g->off;
        if (take > n)
            take = n;
        g->off += take;
        s->raw.queued -= take;
        n -= take;
        if (g->off == g->len) {
            s->raw.head = g->next;
            if (!s->raw.head)
                s->raw.tail = NULL;
            free(g);
        }
    }
    resume(r, fd, s);
}


/* with the lock held: the body of a response whose headers are parsed: from now on this thread decodes it
 * (chunked, or `length` bytes, or until close when length < 0) into lines, and with `parse` parses them as
 * SSE; what the thread already read of it is decoded at once */
void rx_start_body(Reader *r, int fd, stream_t *s, int chunked, long long length, sse_state *parse) {
    sse_free(s->parse.sse); /* a previous answer's, never taken */
    s->parse.sse = parse;
    s->parse.on = parse != NULL;
    seg_t *g;
    while ((g = s->body.lhead)) { /* a previous answer's lines nobody took */
        s->body.lhead = g->next;
        free(g);
    }
    s->body.ltail = NULL;
    s->body.nlines = 0;
    s->body.linelen = 0;
    s->body.on = 1;
    s->body.chunked = chunked;
    s->body.left = chunked ? 0 : length;
    s->body.cstate = C_SIZE;
    s->body.state = (!chunked && length == 0) ? BODY_COMPLETE : BODY_RUNNING;
    s->body.bytes = 0;
    while ((g = s->raw.head) && s->body.state == BODY_RUNNING) {
        size_t n = g->len - g->off;
        size_t used = body_feed(s, g->data + g->off, n, g->stamp_ns);
        s->raw.queued -= used;
        g->off += used;
        if (g->off == g->len) {
            s->raw.head = g->next;
            if (!s->raw.head)
                s->raw.tail = NULL;
            free(g);
        }
    }
    if (s->body.state == BODY_RUNNING && s->eof) {
        s->body.state = (!chunked && length < 0) ? BODY_COMPLETE : BODY_CLOSED;
    }
    if (s->body.state != BODY_RUNNING)
        s->body.on = 0;
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
void rx_decline(Reader *r, int fd, stream_t *s) {
    s->exp.on = 0;
    s->body.state = DECLINED;
    mark_ready(r, fd, s);
}

/* with the lock held: the expected header block is the first `len` raw bytes: take it and the body on,
 * or leave both to the event loop */
static void accept_head(Reader *r, int fd, stream_t *s, size_t len) {
    char *blk = malloc(len);
    if (!blk) {
        rx_decline(r, fd, s);
        return;
    }
    int chunked, keep;
    int64_t length;
    int ok = rx_peek_raw(s, blk, len) == len && parse_head(blk, len, &chunked, &length, &keep);
    free(blk);
    double start = s->exp.start;
    if (s->exp.from_send && s->tx_ns) { /* exchange.py's Clock.sent_at, on the same double */
        double tx = stamp_seconds(s->tx_ns);
        if (tx >= start)
            start = tx;
    }
    sse_state *parse = ok ? sse_new(start) : NULL;
    if (parse)
        parse->limit = s->exp.limit;
    if (!parse) {
        rx_decline(r, fd, s);
        return;
    }
    rx_drop_raw(r, fd, s, len); /* the header block off the raw queue */
    s->exp.on = 0;
    s->exp.accepted = 1;
    s->exp.acc_chunked = chunked;
    s->exp.acc_keep = keep;
    s->exp.acc_length = length;
    s->exp.acc_start = start;
    rx_start_body(r, fd, s, chunked, length, parse);
    if (!s->parse.on || s->body.state || s->body.nlines || s->err || s->eof)
        mark_ready(r, fd, s);
}

/* with the lock held: n more raw bytes (the last n queued) of an expected response: has its head ended? */
void rx_expect_scan(Reader *r, int fd, stream_t *s, const char *p, size_t n) {
    size_t take;
    if (rx_header_cut(&s->exp.match, p, n, &take)) {
        accept_head(r, fd, s, s->exp.seen + take);
        return;
    }
    s->exp.seen += n;
    if (s->exp.seen > HEAD_MAX)
        rx_decline(r, fd, s);
}

/* with the lock held: bytes that arrived while the body is parsed */
static void body_bytes_in(Reader *r, stream_t *s, const char *p, size_t n, int64_t stamp) {
    size_t used = body_feed(s, p, n, stamp);
    if (s->body.state != BODY_RUNNING) {
        s->body.on = 0; /* what follows the body is raw again (a keep-alive connection's next answer) */
        if (used < n && s->body.state == BODY_COMPLETE)
            queue_raw(r, s, p + used, n - used, stamp);
    }
}

/* with the lock held: one recvmsg of a readable socket */
void rx_read_one(Reader *r, int fd, stream_t *s, char *buf) {
    struct iovec iov = {buf, READ_SIZE};
    union {
        char space[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } ctl;
    struct msghdr msg;
    rx_msghdr(&msg, &iov, ctl.space, sizeof ctl.space);
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        s->err = errno;
        epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        if (s->exp.on)
            rx_decline(r, fd, s);
        mark_ready(r, fd, s);
        return;
    }
    if (n == 0) { /* end of stream: stop watching, or level-triggered epoll reports it forever */
        s->eof = 1;
        if (s->body.on) { /* a body read until close ends here; any other is cut short */
            s->body.state = (!s->body.chunked && s->body.left < 0) ? BODY_COMPLETE : BODY_CLOSED;
            s->body.on = 0;
        }
        epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        if (s->exp.on)
            rx_decline(r, fd, s);
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
        int64_t lag;
        stamp = monotonic_of_stamp(stamp, &r->lead_ns, &lag);
        if (lag > r->lag_max_ns)
            r->lag_max_ns = lag;
        r->lag_reads++;
        late = lag > LATE_NS;
        r->late_reads += late;
    } else {
        stamp = monotonic_ns(); /* no kernel stamp: this thread reads at once, so its clock is close */
    }
    if (s->parse.sse)
        s->parse.sse->late = late; /* the chunks this read completes: a gap of 0 among them is this read's doing */
    r->bytes += (uint64_t)n;
    s->last_read_ns = monotonic_ns();
    if (s->body.on) {
        body_bytes_in(r, s, buf, (size_t)n, stamp);
        /* a body parsed here has news for the event loop only once it ended, or once it has lines */
        if (!s->parse.on || s->body.state || s->body.nlines)
            mark_ready(r, fd, s);
        return;
    }
    if (queue_raw(r, s, buf, (size_t)n, stamp) < 0) {
        s->err = ENOMEM;
        epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
        if (s->exp.on)
            rx_decline(r, fd, s);
        mark_ready(r, fd, s);
        return;
    }
    if (s->exp.on) { /* no news for the event loop until the head is taken or left to it */
        rx_expect_scan(r, fd, s, buf, (size_t)n);
        return;
    }
    if (s->raw.queued > PAUSE_BYTES && !s->raw.paused) {
        s->raw.paused = 1;
        epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
    }
    mark_ready(r, fd, s);
}

/* with the lock held: the send stamps the kernel queued on the error queue (SO_TIMESTAMPING, TX_SOFTWARE) */
