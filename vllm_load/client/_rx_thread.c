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
#include "_rx.h"

static void read_errqueue(Reader *r, int fd, stream_t *s) {
    for (int i = 0; i < 64; i++) {
        union {
            char space[512];
            struct cmsghdr align;
        } ctl;
        char data[1];
        struct iovec iov = {data, sizeof data};
        struct msghdr msg;
        rx_msghdr(&msg, &iov, ctl.space, sizeof ctl.space);
        if (recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
            return; /* EAGAIN: drained */
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPING) {
                struct scm_timestamping ts;
                memcpy(&ts, CMSG_DATA(c), sizeof ts);
                int64_t ns = monotonic_of_stamp((int64_t)ts.ts[0].tv_sec * 1000000000LL + ts.ts[0].tv_nsec,
                                                &r->lead_ns, NULL);
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
        read_errqueue(r, fd, s); /* before the data: the request left before its answer came */
    if (!s->raw.paused)
        rx_read_one(r, fd, s, buf);
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
static const char *PRIO_NAMES[] = {"normal priority", "normal priority with a 0.1 ms slice",
                                   "nice -10 with a 0.1 ms slice", "nice -10", "real-time priority (SCHED_FIFO 1)",
                                   "starting"};

const char *rx_priority_name(int priority) {
    return PRIO_NAMES[priority];
}

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

void *rx_run(void *arg) {
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
