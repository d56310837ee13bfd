/* Per-thread record streams: each thread appends its calls to its own stream of 32-byte slots, without a
 * lock; a flush writes every stream's new slots, the new paths and a status block to the file in one writev.
 *
 * Why per thread: the recording path is the cost the program pays per call, and a per-process buffer behind a
 * mutex cost two atomic operations and a cache line moving between threads on every call. A stream is a ring
 * with one writer (its thread, which publishes `head`) and one reader (the flusher, under xio.lock, which
 * publishes `tail` once the slots are written), so neither waits for the other. Every thread flushes (all
 * streams) when its stream is full or when the last flush is more than XIO_FLUSH_INTERVAL_NS old, so an idle
 * thread's records still reach the file within about that interval while other threads run.
 *
 * Slots (struct xio_rec): `start` is relative to the stream's time base, set by a TIME slot whenever the next
 * start does not fit (a stream's first record, after 4.3 s, or when CLOCK_REALTIME steps back); a call
 * whose duration, descriptor, sizes or errno do not fit the slot's fields takes a WIDE slot and a second one
 * with the full values (struct xio_ext). Threads past MAX_STREAMS share stream 0 under the lock, and there
 * every record is preceded by a THREAD|TIME slot. Threads give their stream back when they exit (a pthread key
 * destructor): the next flush writes what is left in it and frees it (a claim finding none free flushes
 * first). A fork child keeps only the forking thread's stream, emptied: what it held is the parent's to
 * write. The record cap is handed to the streams in chunks, so a stream never takes the lock to count.
 */
#include "xio.h"

#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define STREAM_SLOTS 2048u /* 64 KiB per thread */
#define STREAM_MASK (STREAM_SLOTS - 1)
#define MAX_STREAMS 1024u /* threads with a stream of their own at one time */
#define PBUF_CAP (64u << 10) /* paths waiting for the next flush */
#define STREAMS_PER_WRITE 64

enum { STREAM_FREE = 0, STREAM_OWNED, STREAM_RETIRED };

/* The OPS block's header and the thread its slots belong to (0: given by THREAD slots). */
struct ops_header {
    struct xio_block_header block;
    int32_t tid;
    uint32_t pad;
};

struct stream {
    /* the writer's (the owner thread; for stream 0, whoever holds xio.lock) */
    uint64_t head;
    uint64_t tail_seen;
    int64_t base_ns;
    uint32_t grant;
    uint32_t gen; /* the file this stream writes into (xio.gen); changed under xio.lock */
    int base_valid;
    int state; /* STREAM_*, changed under xio.lock */
    pid_t tid;
    struct xio_rec *slots;
    /* the flusher's (under xio.lock) */
    uint64_t tail __attribute__((aligned(64)));
    uint64_t flushing;
    uint64_t converted;           /* slots before this one hold ns (clock.c) */
    int64_t out_base_ticks, out_base_ns; /* the last TIME slot converted, before and after */
    struct ops_header hdr;
} __attribute__((aligned(64)));

static struct stream *streams; /* [0]: shared by threads that found no free stream */
static uint32_t nstreams = 1;
static uint32_t nfree, nretired; /* streams below nstreams in those states */
static pthread_key_t stream_key;
static int key_ok;
static __thread struct stream *tls_stream __attribute__((tls_model("initial-exec")));
static __thread pid_t tls_tid __attribute__((tls_model("initial-exec")));
static char *pbuf;
static size_t pused;
static uint32_t npaths_buffered;

static pid_t current_tid(void)
{
    if (XIO_UNLIKELY(tls_tid == 0))
        tls_tid = (pid_t)syscall(SYS_gettid);
    return tls_tid;
}

/* ---- encoding ---- */

static int fits_i32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

/* Writes `ev` at `head` (one slot, or two when WIDE); the new head. */
static uint64_t encode(struct xio_rec *slots, uint64_t head, const struct xio_ev *ev, uint32_t start)
{
    int64_t dur = ev->end_ns - ev->start_ns;
    struct xio_rec *r = &slots[head & STREAM_MASK];
    *r = (struct xio_rec){.start = start, .dur = (uint32_t)dur, .offset = ev->offset, .path_id = ev->path_id,
                          .bytes = (int32_t)ev->bytes, .requested = (int32_t)ev->requested,
                          .fd = (int16_t)ev->fd, .op = ev->op, .flags = (uint8_t)(ev->kind & XIO_SLOT_KIND)};
    int failed = ev->err != 0 && ev->bytes == -1;
    if (XIO_LIKELY((ev->err == 0 || failed) && dur >= 0 && dur <= UINT32_MAX && ev->fd == (int16_t)ev->fd &&
                   fits_i32(ev->bytes) && fits_i32(ev->requested))) {
        if (failed) {
            r->flags |= XIO_SLOT_FAILED;
            r->bytes = ev->err;
        }
        return head + 1;
    }
    r->flags |= XIO_SLOT_WIDE;
    struct xio_ext *x = (struct xio_ext *)&slots[(head + 1) & STREAM_MASK];
    *x = (struct xio_ext){.bytes = ev->bytes, .requested = ev->requested, .dur = dur, .fd = ev->fd, .err = ev->err};
    return head + 2;
}

/* ---- the record cap ---- */

/* 1 when the record may be written (a grant was left or taken), else counted as dropped. */
static int admit(const struct xio_ev *ev, uint32_t *grant)
{
    if (ev->op == XIO_OP_INHERIT)
        return 1;
    if (XIO_UNLIKELY(*grant == 0) && !xio_take_grant(grant)) {
        xio_count_dropped(ev);
        return 0;
    }
    --*grant;
    return 1;
}

/* ---- streams ---- */

static void restart_locked(struct stream *s)
{
    s->head = s->tail_seen = s->tail = s->flushing = s->converted = 0;
    s->base_valid = 0;
    s->grant = 0;
    s->gen = xio.gen;
}

static void stream_release(void *p)
{
    struct stream *s = p;
    int saved = xio_guard;
    xio_guard = 1;
    pthread_mutex_lock(&xio.lock);
    if (s->state == STREAM_OWNED) {
        s->state = STREAM_RETIRED; /* the next flush writes what is left, then frees it */
        nretired++;
    }
    pthread_mutex_unlock(&xio.lock);
    tls_stream = NULL;
    xio_guard = saved;
}

static struct stream *claim_locked(void)
{
    struct stream *s = NULL;
    if (!nfree && nstreams > MAX_STREAMS && nretired)
        xio_flush_locked(XIO_END_RUNNING); /* frees the streams of threads that have exited */
    for (uint32_t i = 1; i < nstreams && nfree && !s; i++)
        if (streams[i].state == STREAM_FREE)
            s = &streams[i];
    if (s)
        nfree--;
    else if (nstreams <= MAX_STREAMS)
        s = &streams[nstreams++];
    else
        return NULL;
    if (!s->slots && !(s->slots = xio_sys_mmap(STREAM_SLOTS * sizeof(struct xio_rec)))) {
        nfree++; /* still free: the next claim tries again */
        return NULL;
    }
    restart_locked(s);
    s->state = STREAM_OWNED;
    s->tid = current_tid();
    return s;
}

/* This thread's stream, claimed on its first record or restarted for a new file; NULL: use the shared one. */
static struct stream *stream_for_thread(void)
{
    struct stream *s = tls_stream;
    pthread_mutex_lock(&xio.lock);
    if (s && s->state == STREAM_OWNED)
        restart_locked(s);
    else
        s = claim_locked();
    pthread_mutex_unlock(&xio.lock);
    if (s && s != tls_stream) {
        tls_stream = s;
        if (key_ok)
            pthread_setspecific(stream_key, s);
    }
    return s;
}

static void timed_flush(void)
{
    if (pthread_mutex_trylock(&xio.lock) != 0)
        return; /* another thread is flushing */
    if ((uint64_t)(xio_ticks() - xio.last_flush) > (uint64_t)xio.flush_interval)
        xio_flush_locked(XIO_END_RUNNING);
    pthread_mutex_unlock(&xio.lock);
}

/* Threads without a stream of their own: every record says its thread and time base. */
static void emit_shared(const struct xio_ev *ev)
{
    struct stream *s = &streams[0];
    pid_t tid = current_tid();
    pthread_mutex_lock(&xio.lock);
    if (admit(ev, &s->grant)) {
        if (s->head + 3 - s->tail > STREAM_SLOTS)
            xio_flush_locked(XIO_END_RUNNING);
        s->slots[s->head & STREAM_MASK] = (struct xio_rec){.offset = ev->start_ns, .bytes = tid,
                                                            .flags = XIO_SLOT_THREAD | XIO_SLOT_TIME};
        __atomic_store_n(&s->head, encode(s->slots, s->head + 1, ev, 0), __ATOMIC_RELEASE);
        if ((uint64_t)(ev->end_ns - xio.last_flush) > (uint64_t)xio.flush_interval)
            xio_flush_locked(XIO_END_RUNNING);
    }
    pthread_mutex_unlock(&xio.lock);
}

void xio_emit(const struct xio_ev *ev)
{
    if (ev->path_id && !ev->path_queued)
        xio_path_note_use(ev->path_id);
    struct stream *s = tls_stream;
    if (XIO_UNLIKELY(!s || s->gen != xio.gen) && !(s = stream_for_thread())) {
        emit_shared(ev);
        return;
    }
    if (!admit(ev, &s->grant))
        return;
    uint64_t head = s->head;
    if (XIO_UNLIKELY(head + 3 - s->tail_seen > STREAM_SLOTS)) {
        s->tail_seen = __atomic_load_n(&s->tail, __ATOMIC_ACQUIRE);
        if (head + 3 - s->tail_seen > STREAM_SLOTS) {
            pthread_mutex_lock(&xio.lock);
            xio_flush_locked(XIO_END_RUNNING);
            pthread_mutex_unlock(&xio.lock);
            s->tail_seen = __atomic_load_n(&s->tail, __ATOMIC_ACQUIRE);
        }
    }
    int64_t delta = ev->start_ns - s->base_ns;
    if (XIO_UNLIKELY(!s->base_valid || delta < 0 || delta > UINT32_MAX)) {
        s->slots[head++ & STREAM_MASK] = (struct xio_rec){.offset = ev->start_ns, .flags = XIO_SLOT_TIME};
        s->base_ns = ev->start_ns;
        s->base_valid = 1;
        delta = 0;
    }
    __atomic_store_n(&s->head, encode(s->slots, head, ev, (uint32_t)delta), __ATOMIC_RELEASE);
    if (XIO_UNLIKELY((uint64_t)(ev->end_ns - __atomic_load_n(&xio.last_flush, __ATOMIC_RELAXED)) >
                     (uint64_t)xio.flush_interval))
        timed_flush();
}

/* ---- flushing (under xio.lock) ---- */

void xio_append_path_locked(uint32_t id)
{
    uint32_t len;
    const char *bytes = xio_path_bytes(id, &len);
    size_t need = (8 + len + 7) & ~(size_t)7;
    if (pused + need > PBUF_CAP)
        xio_flush_locked(XIO_END_RUNNING);
    char *p = pbuf + pused;
    memcpy(p, &id, 4);
    memcpy(p + 4, &len, 4);
    memcpy(p + 8, bytes, len);
    memset(p + 8 + len, 0, need - 8 - len);
    pused += need;
    npaths_buffered++;
}

/* Calls among the slots [from, to) of a stream (TIME, THREAD and second slots are not calls). */
static uint64_t count_calls(const struct stream *s, uint64_t from, uint64_t to)
{
    uint64_t n = 0;
    for (uint64_t i = from; i < to; i++) {
        const struct xio_rec *r = &s->slots[i & STREAM_MASK];
        if (r->flags & (XIO_SLOT_TIME | XIO_SLOT_THREAD))
            continue;
        n += r->op != XIO_OP_INHERIT;
        i += (r->flags & XIO_SLOT_WIDE) != 0;
    }
    return n;
}

static uint32_t clamp_u32(int64_t v) { return v < 0 ? 0u : v > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)v; }

/* Ticks to ns in the slots [from, head) of a stream, in place: the flusher owns them until it moves `tail`. A
 * TIME slot's base becomes ns; a call's start stays relative to it; durations are scaled. */
static void convert_slots(struct stream *s, uint64_t head, const struct xio_clock_map *m)
{
    uint64_t i = s->converted > s->tail ? s->converted : s->tail;
    for (; i < head; i++) {
        struct xio_rec *r = &s->slots[i & STREAM_MASK];
        if (r->flags & (XIO_SLOT_TIME | XIO_SLOT_THREAD)) {
            if (r->flags & XIO_SLOT_TIME) {
                s->out_base_ticks = r->offset;
                s->out_base_ns = r->offset = xio_clock_ns(m, r->offset);
            }
            continue;
        }
        r->start = clamp_u32(xio_clock_ns(m, s->out_base_ticks + r->start) - s->out_base_ns);
        if (r->flags & XIO_SLOT_WIDE) {
            struct xio_ext *x = (struct xio_ext *)&s->slots[++i & STREAM_MASK];
            x->dur = x->dur > 0 ? (int64_t)((double)x->dur * m->slope) : 0; /* < 0: TSC skew between CPUs */
        } else {
            r->dur = clamp_u32((int64_t)((double)r->dur * m->slope));
        }
    }
    s->converted = i;
}

/* Adds a stream's unwritten slots to `iov` (header, then one or two slices of the ring). */
static int add_stream(struct stream *s, struct iovec *iov, const struct xio_clock_map *m)
{
    uint64_t head = __atomic_load_n(&s->head, __ATOMIC_ACQUIRE), tail = s->tail;
    if (m)
        convert_slots(s, head, m);
    uint64_t count = head - tail;
    s->flushing = head;
    xio.records += count_calls(s, tail, head);
    s->hdr = (struct ops_header){{XIO_BLOCK_OPS, (uint32_t)count, 8 + count * sizeof(struct xio_rec)},
                                 s == streams ? 0 : s->tid, 0};
    int n = 0;
    iov[n++] = (struct iovec){&s->hdr, sizeof s->hdr};
    uint32_t from = (uint32_t)(tail & STREAM_MASK);
    uint64_t first = count < STREAM_SLOTS - from ? count : STREAM_SLOTS - from;
    iov[n++] = (struct iovec){&s->slots[from], first * sizeof(struct xio_rec)};
    if (count > first)
        iov[n++] = (struct iovec){s->slots, (count - first) * sizeof(struct xio_rec)};
    return n;
}

/* After a write: the slots may be reused; a stream whose thread has exited is free once drained. */
static void release_streams(uint32_t from, uint32_t to)
{
    for (uint32_t i = from; i < to; i++) {
        struct stream *s = &streams[i];
        if (s->state == STREAM_FREE)
            continue;
        if (s->gen == xio.gen && s->flushing > s->tail)
            __atomic_store_n(&s->tail, s->flushing, __ATOMIC_RELEASE);
        if (s->state == STREAM_RETIRED && (s->gen != xio.gen || __atomic_load_n(&s->head, __ATOMIC_ACQUIRE) == s->tail)) {
            s->state = STREAM_FREE;
            nretired--;
            nfree++;
        }
    }
}

/* Writes the new paths, every stream's unwritten slots and a status block. After the final flush (a call
 * that was under way then, filling its stream), what is left is dropped: the file is complete. */
void xio_flush_locked(int end)
{
    if (xio.ended || !xio_output_is_open()) {
        for (uint32_t i = 0; i < nstreams; i++)
            if (streams[i].state != STREAM_FREE)
                __atomic_store_n(&streams[i].tail, __atomic_load_n(&streams[i].head, __ATOMIC_ACQUIRE),
                                 __ATOMIC_RELEASE);
        pused = 0;
        npaths_buffered = 0;
        return;
    }
    struct iovec iov[2 + 3 * STREAMS_PER_WRITE + 2];
    struct xio_block_header bp = {XIO_BLOCK_PATHS, npaths_buffered, pused};
    int n = 0;
    if (pused) {
        iov[n++] = (struct iovec){&bp, sizeof bp};
        iov[n++] = (struct iovec){pbuf, pused};
    }
    struct xio_clock_map map, *m = xio_clock_map(&map) ? &map : NULL; /* taken after the records it converts */
    uint32_t batch_from = 0, in_batch = 0;
    for (uint32_t i = 0; i < nstreams; i++) {
        struct stream *s = &streams[i];
        if (s->state == STREAM_FREE || s->gen != xio.gen || __atomic_load_n(&s->head, __ATOMIC_ACQUIRE) == s->tail)
            continue;
        n += add_stream(s, iov + n, m);
        if (++in_batch == STREAMS_PER_WRITE) { /* many threads: write in parts, the status comes last */
            xio_output_write(iov, n);
            release_streams(batch_from, i + 1);
            batch_from = i + 1;
            in_batch = 0;
            n = 0;
        }
    }
    xio_status_iov(end, iov + n);
    n += 2;
    xio_output_write(iov, n);
    release_streams(batch_from, nstreams);
    pused = 0;
    npaths_buffered = 0;
    __atomic_store_n(&xio.last_flush, xio_ticks(), __ATOMIC_RELAXED);
}

/* ---- set-up, new files, fork ---- */

int xio_streams_init(void)
{
    if (streams)
        return 0;
    streams = xio_sys_mmap((MAX_STREAMS + 1) * sizeof *streams);
    pbuf = xio_sys_mmap(PBUF_CAP);
    if (!streams || !pbuf || !(streams[0].slots = xio_sys_mmap(STREAM_SLOTS * sizeof(struct xio_rec))))
        return -1;
    streams[0].state = STREAM_OWNED;
    key_ok = pthread_key_create(&stream_key, stream_release) == 0;
    return 0;
}

/* A new file starts (under xio.lock, or in a fork child): streams restart on their next record. */
void xio_streams_new_file(void)
{
    xio.gen++;
    xio.granted = xio.records = 0;
    pused = 0;
    npaths_buffered = 0;
    if (streams)
        restart_locked(&streams[0]);
}

/* In a fork child (one thread): the other threads' streams are gone with them; their records, and this
 * thread's unwritten ones, are the parent's to write. */
void xio_streams_fork_child(void)
{
    tls_tid = 0;
    nfree = nretired = 0;
    for (uint32_t i = 1; streams && i < nstreams; i++) {
        if (&streams[i] == tls_stream && streams[i].state == STREAM_OWNED) {
            restart_locked(&streams[i]);
            streams[i].tid = current_tid();
        } else {
            streams[i].state = STREAM_FREE;
            nfree++;
        }
    }
}
