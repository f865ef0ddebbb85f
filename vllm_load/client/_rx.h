/* The native receive thread's shared parts: a stream's state, the Reader (the Python type), and what each of its
 * three files offers the others. _rx_body.c decodes (HTTP/1.1 heads, chunked or sized bodies, lines), _rx_thread.c
 * reads and stamps (epoll, recvmsg, the error queue's send stamps, the thread's priority), _rxnative.c is the
 * Python type over them (client/native.py and client/direct.py are its only callers; _rxnative.pyi its types). */
#ifndef VLLM_LOAD_RX_H
#define VLLM_LOAD_RX_H

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

/* raw mode: the bytes as read, in segments with their stamps (a head, or a body the event loop decodes) */
typedef struct {
    seg_t *head, *tail;
    size_t queued;
    int paused;    /* reading stopped past PAUSE_BYTES queued, resumed below half */
    int hdr_match; /* pop: how much of a header block's end (CRLF CRLF) the bytes popped so far end with */
} rx_raw_t;

/* body mode: the thread decodes the response body (chunked or by length) and splits it into lines */
typedef struct {
    int on;        /* 0: raw segments; 1: a streamed body is being parsed into lines */
    int chunked;   /* Transfer-Encoding: chunked */
    int64_t left;  /* bytes left: of the current chunk (chunked) or of Content-Length (-1: until close) */
    int cstate;    /* chunked decoder state */
    int after_lf;  /* the state after C_LF's line feed */
    int state;     /* enum body_state */
    uint64_t bytes;
    char *line;
    size_t linelen, linecap;
    seg_t *lhead, *ltail; /* complete lines, each with the stamp of the read that completed it */
    int nlines;
} rx_body_t;

/* parse mode: an SSE body this thread parses itself (_sse.c); its lines stay here until the body ends, or until
 * a line the parser leaves to Python, from which on lines are queued as in body mode */
typedef struct {
    sse_state *sse;
    int on;
} rx_parse_t;

/* expect mode: the thread takes a 200 response's header block itself and goes on into its body, so the event
 * loop hears of the request once, at its end (the head wait was a second wake per request) */
typedef struct {
    int on;
    int match;          /* how much of CRLF CRLF the raw bytes scanned so far end with */
    size_t seen;        /* raw bytes scanned so far for the header block's end */
    double start;       /* the request's start (perf_counter clock) */
    int from_send;      /* closed loop: offsets count from the kernel's stamp of the send, as the loop does */
    long long limit;    /* the parser's token limit (sse_state.limit; 0: none) */
    int accepted;       /* the head was taken here: */
    int acc_chunked, acc_keep;
    int64_t acc_length;
    double acc_start;   /* the start the body's offsets count from */
} rx_expect_t;

/* one watched socket: what every mode shares, then each mode's own state */
typedef struct {
    uint32_t gen;
    int active, eof, err, ready;
    int64_t tx_ns;        /* the kernel's stamp of the latest send's last byte leaving (0: none yet) */
    int64_t last_read_ns; /* monotonic: a parsed body shows the event loop no activity, so timeouts ask */
    rx_raw_t raw;
    rx_body_t body;
    rx_parse_t parse;
    rx_expect_t exp;
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
    int64_t lead_ns; /* the wall clock's lead over the monotonic one at the latest stamped read (monotonic_of_stamp) */
    unsigned long long lag_reads, late_reads;
    int priority; /* what the thread got: PRIO_NAMES */
} Reader;

#define HEAD_MAX 65536 /* a response's header block larger than this is not an inference server's */
#define LINE_MAX_BYTES (16u << 20) /* a body line longer than this is not an SSE stream's: the body is malformed
                                    (bytes without a newline grew the line buffer at ~190 MB/s) */
/* how a streamed body stands; exported to Python as BODY_* (client/reader_choice.BodyState) */
enum body_state {
    BODY_RUNNING = 0,   /* not ended by itself (an outcome with an error: the error stopped it) */
    BODY_COMPLETE = 1,  /* its length read, or its last chunk */
    BODY_CLOSED = 2,    /* the connection closed before its end */
    BODY_MALFORMED = 3, /* malformed chunking */
    DECLINED = 4,       /* an expected head left to the event loop (not a 200 we can take) */
};
#define LATE_NS 1000000 /* a read later than this after its segment landed counts as late (1 ms) */

static inline int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* the wall clock was set between two reads when its lead over the monotonic clock moved by more than this */
#define CLOCK_SET_NS 1000000

/* a kernel stamp (CLOCK_REALTIME, the only clock the kernel stamps with) read just now, moved onto CLOCK_MONOTONIC
 * (Python's perf_counter) by the wall clock's lead over it now, so a wall clock set while the run goes (a VM's)
 * drops out of every offset. `*seen` is the lead at the reader's previous read: when it moved since, the clock
 * was set while this stamp waited and the stamp may predate it (a 3 s step made one gap in 5,544 read 3 s), so
 * the read's own time stands in (off by how late the read was) and `*lag` is 0; else `*lag` is the stamp's age */
static inline int64_t monotonic_of_stamp(int64_t stamp, int64_t *seen, int64_t *lag) {
    int64_t mono = monotonic_ns(), real = realtime_ns(), lead = real - mono, was = *seen;
    *seen = lead;
    int set = was && (lead - was > CLOCK_SET_NS || was - lead > CLOCK_SET_NS);
    if (lag)
        *lag = set ? 0 : real - stamp;
    return set ? mono : stamp - lead;
}

/* a message header over one buffer, with room for its control messages (the kernel's stamps) */
static inline void rx_msghdr(struct msghdr *msg, struct iovec *iov, void *ctl, size_t ctl_len) {
    memset(msg, 0, sizeof *msg);
    msg->msg_iov = iov;
    msg->msg_iovlen = 1;
    msg->msg_control = ctl;
    msg->msg_controllen = ctl_len;
}

/* _rx_body.c: a stream's queues, HTTP/1.1 heads, body decoding (chunked or by length) into lines, and one read */
void rx_free_segments(stream_t *s);
seg_t *rx_new_seg(const char *p, size_t n, int64_t stamp);
void rx_append_seg(seg_t **head, seg_t **tail, seg_t *g);
int rx_header_cut(int *matched, const char *p, size_t n, size_t *take);
size_t rx_peek_raw(const stream_t *s, char *dst, size_t n);
void rx_drop_raw(Reader *r, int fd, stream_t *s, size_t n);
void rx_start_body(Reader *r, int fd, stream_t *s, int chunked, long long length, sse_state *parse);
void rx_decline(Reader *r, int fd, stream_t *s);
void rx_expect_scan(Reader *r, int fd, stream_t *s, const char *p, size_t n);
void rx_read_one(Reader *r, int fd, stream_t *s, char *buf);
/* _rx_thread.c: the receive thread (epoll, kernel stamps, its priority) */
void *rx_run(void *arg);
/* what priority the thread got (Reader.priority; its name for stats()) */
enum { PRIO_NORMAL, PRIO_SLICE, PRIO_NICE_SLICE, PRIO_NICE, PRIO_REALTIME, PRIO_STARTING };
const char *rx_priority_name(int priority);
/* _rxnative.c: (re-)arm a stream's fd in the thread's epoll set, with the lock held */
int rx_arm(Reader *r, int fd, stream_t *s);

#endif
