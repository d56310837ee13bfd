/* Per-thread record streams: each thread appends its calls to its own stream of 32-byte slots, without a
 * lock; a flush writes every stream's new slots and a status block to the file in one writev.
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
 *
 * Paths: a call that names a path for the first time (an open, a stat, a descriptor met without its open)
 * writes a PATH slot with a new id and the path's bytes into its stream just before its record, and the
 * descriptor's later records name the id. Ids are handed to the streams in blocks, like the record cap, and
 * are unique within the process image; the reader interns the paths (the same path opened twice has two
 * ids). Copying a path of about 60 bytes into a line already in the cache costs a few ns, against a hash
 * lookup with its cache misses, and a shared table growing in every new process, for an interned id.
 */
#include "xio.h"

#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define STREAM_SLOTS 2048u /* 64 KiB per thread */
#define STREAM_MASK (STREAM_SLOTS - 1)
#define MAX_STREAMS 1024u /* threads with a stream of their own at one time */
#define STREAMS_PER_WRITE 64
#define PATH_ID_CHUNK 64u /* path ids a stream takes at a time */

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
    uint32_t id_next, id_end; /* this stream's block of path ids */
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
static __thread uint32_t tls_unsampled __attribute__((tls_model("initial-exec"))); /* calls since the last timed */
static __thread int tls_flushed __attribute__((tls_model("initial-exec"))); /* this thread flushed since it was 0 */

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

/* Writes a PATH slot and the path's bytes, zero-padded to whole slots, at `head`; the new head. */
static uint64_t encode_path(struct xio_rec *slots, uint64_t head, uint32_t id, const char *path, size_t len)
{
    slots[head++ & STREAM_MASK] = (struct xio_rec){.path_id = id, .bytes = (int32_t)len, .op = XIO_OP_PATH};
    for (size_t done = 0; done < len; head++, done += sizeof(struct xio_rec)) {
        char *slot = (char *)&slots[head & STREAM_MASK];
        size_t n = len - done < sizeof(struct xio_rec) ? len - done : sizeof(struct xio_rec);
        if (n < sizeof(struct xio_rec))
            memset(slot + n, 0, sizeof(struct xio_rec) - n);
        memcpy(slot, path + done, n);
    }
    return head;
}

/* Slots that follow the slot `r` as part of it: a PATH slot's bytes, a WIDE slot's second. */
static uint64_t extra_slots(const struct xio_rec *r)
{
    if (r->op == XIO_OP_PATH && !r->flags)
        return XIO_PATH_SLOTS((uint32_t)r->bytes);
    return (r->flags & (XIO_SLOT_TIME | XIO_SLOT_THREAD)) ? 0 : (r->flags & XIO_SLOT_WIDE) != 0;
}

/* A new path id from the stream's block; 0 once a process image has used 4G of them (counted). */
static uint32_t new_path_id(struct stream *s)
{
    if (XIO_UNLIKELY(s->id_next == s->id_end)) {
        uint64_t first = __atomic_fetch_add(&xio.path_ids, PATH_ID_CHUNK, __ATOMIC_RELAXED);
        if (first + PATH_ID_CHUNK >= UINT32_MAX) {
            __atomic_add_fetch(&xio.paths_dropped, 1, __ATOMIC_RELAXED);
            return 0;
        }
        s->id_next = (uint32_t)first + 1; /* id 0 means "no path" */
        s->id_end = (uint32_t)first + 1 + PATH_ID_CHUNK;
    }
    return s->id_next++;
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
    xio_run_flush(); /* a run of calls the thread left open */
    int saved = xio_guard;
    xio_guard = 1;
    if (xio.mode != XIO_MODE_OFF && !xio.ended)
        xio_sched_thread_ended(current_tid()); /* its wait for a CPU, before its schedstat file goes */
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

/* Room for `need` more slots in a thread's own stream: flushes when the flusher has not freed enough. */
static void make_room(struct stream *s, uint64_t need)
{
    uint64_t head = s->head;
    if (XIO_LIKELY(head + need - s->tail_seen <= STREAM_SLOTS))
        return;
    s->tail_seen = __atomic_load_n(&s->tail, __ATOMIC_ACQUIRE);
    if (head + need - s->tail_seen > STREAM_SLOTS) {
        pthread_mutex_lock(&xio.lock);
        xio_flush_locked(XIO_END_RUNNING);
        pthread_mutex_unlock(&xio.lock);
        s->tail_seen = __atomic_load_n(&s->tail, __ATOMIC_ACQUIRE);
    }
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

static inline void emit(const struct xio_ev *ev)
{
    if (XIO_UNLIKELY(xio_run.calls))
        xio_run_flush(); /* the thread's run of calls ends before its next record */
    struct stream *s = tls_stream;
    if (XIO_UNLIKELY(!s || s->gen != xio.gen) && !(s = stream_for_thread())) {
        emit_shared(ev);
        return;
    }
    if (!admit(ev, &s->grant))
        return;
    make_room(s, 3);
    uint64_t head = s->head;
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

/* The record of the call that just ended (ev->end_ns: its second clock read); 1 call in XIO_SELF_EVERY per
 * thread is timed from there to the end of its record (struct xio_self). A call that flushed is not taken (the
 * flushes are timed whole), nor one that took longer than XIO_SELF_MAX_NS (the thread was descheduled
 * meanwhile): the next call is timed instead. */
#define XIO_SELF_MAX_NS 10000 /* no recording path takes that long: a longer one was descheduled or interrupted */
void xio_emit(const struct xio_ev *ev)
{
    if (XIO_LIKELY(++tls_unsampled < XIO_SELF_EVERY)) {
        emit(ev);
        return;
    }
    tls_flushed = 0;
    emit(ev);
    int64_t took = xio_ticks() - ev->end_ns;
    if (tls_flushed || took < 0 || (double)took * xio_clock_slope() > XIO_SELF_MAX_NS)
        return; /* tls_unsampled stays: the next call is timed */
    tls_unsampled = 0;
    __atomic_add_fetch(&xio.self.sampled_ticks, took, __ATOMIC_RELAXED);
    __atomic_add_fetch(&xio.self.samples, 1, __ATOMIC_RELAXED);
}

void xio_emit_run(const struct xio_ev *ev) { emit(ev); }

/* A path the calling thread's record names for the first time: a PATH slot with a new id and the path's bytes
 * go into its stream (the shared one under the lock). Its id, or 0 when the record cap is reached (the
 * record that would name it is dropped too) or the ids are spent. */
uint32_t xio_emit_path(const char *path, size_t len)
{
    struct stream *s = tls_stream;
    uint32_t id = 0;
    if (XIO_UNLIKELY(!s || s->gen != xio.gen) && !(s = stream_for_thread())) {
        s = &streams[0];
        pthread_mutex_lock(&xio.lock);
        if ((s->grant || xio_take_grant(&s->grant)) && (id = new_path_id(s)) != 0) {
            if (s->head + 1 + XIO_PATH_SLOTS(len) - s->tail > STREAM_SLOTS)
                xio_flush_locked(XIO_END_RUNNING);
            __atomic_store_n(&s->head, encode_path(s->slots, s->head, id, path, len), __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&xio.lock);
        return id;
    }
    if (XIO_UNLIKELY(s->grant == 0) && !xio_take_grant(&s->grant))
        return 0;
    if (!(id = new_path_id(s)))
        return 0;
    make_room(s, 1 + XIO_PATH_SLOTS(len));
    __atomic_store_n(&s->head, encode_path(s->slots, s->head, id, path, len), __ATOMIC_RELEASE);
    return id;
}

/* ---- flushing (under xio.lock) ---- */

/* Calls among the slots [from, to) of a stream (TIME, THREAD, PATH and second slots are not calls). */
static uint64_t count_calls(const struct stream *s, uint64_t from, uint64_t to)
{
    uint64_t n = 0;
    for (uint64_t i = from; i < to; i++) {
        const struct xio_rec *r = &s->slots[i & STREAM_MASK];
        n += !(r->flags & (XIO_SLOT_TIME | XIO_SLOT_THREAD)) && r->op != XIO_OP_INHERIT && r->op != XIO_OP_PATH;
        i += extra_slots(r);
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
        if (r->op == XIO_OP_PATH && !r->flags) {
            i += extra_slots(r);
            continue;
        }
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

/* Writes every stream's unwritten slots and a status block. After the final flush (a call
 * that was under way then, filling its stream), what is left is dropped: the file is complete. */
void xio_flush_locked(int end)
{
    if (xio.ended || !xio_output_is_open()) {
        for (uint32_t i = 0; i < nstreams; i++)
            if (streams[i].state != STREAM_FREE)
                __atomic_store_n(&streams[i].tail, __atomic_load_n(&streams[i].head, __ATOMIC_ACQUIRE),
                                 __ATOMIC_RELEASE);
        return;
    }
    struct timespec began;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &began);
    struct iovec iov[3 * STREAMS_PER_WRITE + 2];
    int n = 0;
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
    __atomic_store_n(&xio.last_flush, xio_ticks(), __ATOMIC_RELAXED);
    struct timespec done;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &done);
    xio.self.flush_ns += (done.tv_sec - began.tv_sec) * 1000000000LL + (done.tv_nsec - began.tv_nsec); /* locked */
    tls_flushed = 1;
}

/* ---- set-up, new files, fork ---- */

int xio_streams_init(void)
{
    if (streams)
        return 0;
    streams = xio_sys_mmap((MAX_STREAMS + 1) * sizeof *streams);
    if (!streams || !(streams[0].slots = xio_sys_mmap(STREAM_SLOTS * sizeof(struct xio_rec))))
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
    if (streams)
        restart_locked(&streams[0]);
}

/* In a fork child (one thread): the other threads' streams are gone with them; their records, and this
 * thread's unwritten ones, are the parent's to write. The streams' blocks of path ids are dropped: the child
 * takes new ones above every id its parent had handed out, so the ids it inherits (written in its parent's
 * file) keep one meaning, and the reader finds them there. */
void xio_streams_fork_child(void)
{
    tls_tid = 0;
    tls_unsampled = 0; /* the child's own calls are timed from its first */
    xio_run.calls = 0; /* the parent records the run it was in */
    nfree = nretired = 0;
    for (uint32_t i = 0; streams && i < nstreams; i++)
        streams[i].id_next = streams[i].id_end = 0;
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
