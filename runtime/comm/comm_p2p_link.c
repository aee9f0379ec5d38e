/* comm_p2p_link.c - one pair's byte stream (shared-memory rings or TCP); see comm_p2p_link.h. */
#include "runtime/comm/comm_p2p_link.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/util.h"
#include "runtime/comm/comm_tcp.h"

#define HELLO_MAGIC 0x6c656870u
#define PAIR_MAGIC 0x7269617070327064ull
#define PAIR_VERSION 1u
#define RING_CAP ((size_t)4 << 20)   /* bytes per direction of a shared-memory pair */
#define RING_CHUNK ((size_t)256 << 10) /* published in pieces, so the reader starts early */
#define PAIR_HDR 4096

/* The TCP greeting of the lower rank. */
typedef struct hello {
    uint32_t magic, pad;
    uint64_t tag;
    int32_t from, world;
} hello;

typedef struct dt_p2p_ring {
    _Atomic uint64_t head; /* bytes written, ever (the producer's) */
    char pad0[56];
    _Atomic uint64_t tail; /* bytes read, ever (the consumer's) */
    char pad1[56];
} ring_ctl;

/* The first fields mirror comm_shm.c's header up to creator_pid, so that dt_shm_clean (names
 * share its prefix) removes a pair whose creator died before its peer mapped it. */
typedef struct dt_p2p_seg {
    _Atomic uint64_t magic; /* set last by the creator */
    uint32_t version;
    int32_t pad0;
    uint64_t cap;
    uint64_t total_bytes;
    _Atomic int32_t creator_pid;
    _Atomic int32_t attached;
    _Atomic int32_t abort[2]; /* side 0 (lower rank) / 1 (higher rank) failed */
    _Atomic uint32_t bell[2];     /* futex words: side s's peer bumps bell[s] when it moved */
    _Atomic uint32_t sleeping[2]; /* side s waits on bell[s]: bumps must wake it */
    char pad1[48];
    ring_ctl ring[2];         /* ring[s]: written by side s */
} pair_hdr;

_Static_assert(sizeof(pair_hdr) <= PAIR_HDR, "pair header fits its page");

void dt_p2p_link_init(dt_p2p_link *l, bool shm, int side, const char *name, int pid)
{
    memset(l, 0, sizeof *l);
    l->shm = shm;
    l->side = side;
    l->fd = l->pidfd = -1;
    l->pid = pid;
    dt_strlcpy(l->name, name, sizeof l->name);
}

void dt_p2p_futex_wake(_Atomic uint32_t *w, bool shared)
{
    syscall(SYS_futex, (uint32_t *)w, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT32_MAX, NULL,
            NULL, 0);
}

void dt_p2p_link_ring(dt_p2p_link *l)
{
    int s = 1 - l->side;
    atomic_fetch_add(&l->h->bell[s], 1);
    if (atomic_load(&l->h->sleeping[s]))
        dt_p2p_futex_wake(&l->h->bell[s], true);
}

void dt_p2p_link_close(dt_p2p_link *l, bool aborting)
{
    if (l->fd >= 0) {
        if (aborting)
            shutdown(l->fd, SHUT_RDWR);
        close(l->fd);
        l->fd = -1;
    }
    if (l->h) {
        if (aborting) {
            atomic_store(&l->h->abort[l->side], 1);
            dt_p2p_link_ring(l);
        }
        if (l->creator && !l->unlinked)
            shm_unlink(l->name);
        munmap(l->h, l->map_bytes);
        l->h = NULL;
    }
    l->open = false;
}

void dt_p2p_link_destroy(dt_p2p_link *l)
{
    dt_p2p_link_close(l, false);
    if (l->pidfd >= 0)
        close(l->pidfd);
    l->pidfd = -1;
}

/* ---- streams ------------------------------------------------------------------------------ */

ssize_t dt_p2p_link_write(dt_p2p_link *l, const void *src, size_t n)
{
    if (!l->shm) {
        ssize_t k = send(l->fd, src, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k >= 0)
            return k;
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
    }
    uint64_t head = atomic_load_explicit(&l->out->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&l->out->tail, memory_order_acquire);
    size_t k = DT_MIN(DT_MIN(n, RING_CAP - (size_t)(head - tail)), RING_CHUNK);
    if (k == 0)
        return 0;
    size_t off = (size_t)(head % RING_CAP), first = DT_MIN(k, RING_CAP - off);
    memcpy(l->out_data + off, src, first);
    memcpy(l->out_data, (const char *)src + first, k - first);
    atomic_store_explicit(&l->out->head, head + k, memory_order_release);
    return (ssize_t)k;
}

ssize_t dt_p2p_link_read(dt_p2p_link *l, void *dst, size_t n)
{
    if (!l->shm) {
        ssize_t k = recv(l->fd, dst, n, MSG_DONTWAIT);
        if (k > 0)
            return k;
        if (k == 0)
            return -ECONNRESET;
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
    }
    uint64_t tail = atomic_load_explicit(&l->in->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&l->in->head, memory_order_acquire);
    size_t k = DT_MIN(DT_MIN(n, (size_t)(head - tail)), RING_CHUNK);
    if (k == 0)
        return 0;
    size_t off = (size_t)(tail % RING_CAP), first = DT_MIN(k, RING_CAP - off);
    memcpy(dst, l->in_data + off, first);
    memcpy((char *)dst + first, l->in_data, k - first);
    atomic_store_explicit(&l->in->tail, tail + k, memory_order_release);
    return (ssize_t)k;
}

bool dt_p2p_link_ready(const dt_p2p_link *l, bool has_out)
{
    uint64_t ih = atomic_load_explicit(&l->in->head, memory_order_acquire);
    uint64_t it = atomic_load_explicit(&l->in->tail, memory_order_relaxed);
    if (ih != it)
        return true;
    uint64_t oh = atomic_load_explicit(&l->out->head, memory_order_relaxed);
    uint64_t ot = atomic_load_explicit(&l->out->tail, memory_order_acquire);
    return has_out && oh - ot < RING_CAP;
}

_Atomic uint32_t *dt_p2p_link_bell(dt_p2p_link *l, bool sleeping)
{
    atomic_store(&l->h->sleeping[l->side], sleeping ? 1 : 0);
    return &l->h->bell[l->side];
}

/* ---- the peer ----------------------------------------------------------------------------- */

bool dt_p2p_link_peer_failed(const dt_p2p_link *l)
{
    return l->h && atomic_load(&l->h->abort[1 - l->side]);
}

static int open_pidfd(int pid)
{
#ifdef SYS_pidfd_open
    int fd = pid > 0 ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
    if (fd >= 0)
        dt_set_cloexec(fd);
    return fd;
#else
    (void)pid;
    return -1;
#endif
}

bool dt_p2p_link_peer_exited(dt_p2p_link *l)
{
    int pid = l->pid;
    if (!l->pidfd_tried) {
        l->pidfd_tried = true;
        l->pidfd = open_pidfd(pid);
        if (l->pidfd < 0 && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
            return true;
    }
    if (l->pidfd >= 0) {
        struct pollfd pf = {l->pidfd, POLLIN, 0};
        return poll(&pf, 1, 0) > 0 && (pf.revents & POLLIN);
    }
    return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

/* ---- opening ------------------------------------------------------------------------------ */

static void link_map(dt_p2p_link *l, void *m)
{
    l->h = m;
    l->out = &l->h->ring[l->side];
    l->in = &l->h->ring[1 - l->side];
    l->out_data = (char *)m + PAIR_HDR + (size_t)l->side * RING_CAP;
    l->in_data = (char *)m + PAIR_HDR + (size_t)(1 - l->side) * RING_CAP;
    l->open = true;
}

int dt_p2p_link_open_shm(dt_p2p_link *l, const char *who, dt_err *err)
{
    if (l->open)
        return 0;
    l->map_bytes = PAIR_HDR + 2 * RING_CAP;
    if (l->side == 0) { /* the lower rank creates */
        int fd = shm_open(l->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0 && errno == EEXIST) { /* left by a dead process of the same identity */
            shm_unlink(l->name);
            fd = shm_open(l->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        }
        if (fd < 0) {
            int e = errno;
            return dt_err_set(err, -e, "point-to-point: creating shared memory %s for %s: %s",
                              l->name, who, strerror(e));
        }
        /* Reserve the pages now: a tmpfs that runs full later (docker's 64 MiB /dev/shm)
         * would kill the process with SIGBUS on first touch instead of failing here. */
        int e = ftruncate(fd, (off_t)l->map_bytes) != 0 ? errno
                                                        : posix_fallocate(fd, 0,
                                                                          (off_t)l->map_bytes);
        if (e != 0) {
            close(fd);
            shm_unlink(l->name);
            return dt_err_set(err, e == ENOSPC || e == ENOMEM || e == EFBIG ? -ENOSPC : -e,
                              "point-to-point: /dev/shm has no room for the %zu bytes shared "
                              "with %s (%s): give it more (docker run --shm-size) or set "
                              "DTRAIN_COMM_TRANSPORT=tcp",
                              l->map_bytes, who, strerror(e));
        }
        void *m = mmap(NULL, l->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED) {
            int me = errno;
            shm_unlink(l->name);
            return dt_err_set(err, -me, "point-to-point: mapping %s: %s", l->name,
                              strerror(me));
        }
        pair_hdr *h = m;
        atomic_store(&h->creator_pid, (int32_t)getpid());
        h->version = PAIR_VERSION;
        h->cap = RING_CAP;
        h->total_bytes = l->map_bytes;
        atomic_store(&h->attached, 1);
        atomic_store(&h->magic, PAIR_MAGIC);
        l->creator = true;
        link_map(l, m);
        return 0;
    }
    int fd = shm_open(l->name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return 0; /* not created yet */
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < l->map_bytes) {
        close(fd);
        return 0;
    }
    void *m = mmap(NULL, l->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        int e = errno;
        return dt_err_set(err, -e, "point-to-point: mapping %s: %s", l->name, strerror(e));
    }
    pair_hdr *h = m;
    if (atomic_load(&h->magic) != PAIR_MAGIC) {
        munmap(m, l->map_bytes);
        return 0;
    }
    atomic_fetch_add(&h->attached, 1);
    shm_unlink(l->name); /* both mapped it: nothing to leave behind */
    l->unlinked = true;
    link_map(l, m);
    return 0;
}

int dt_p2p_link_connect(dt_p2p_link *l, const char *addr, int port, uint64_t tag, int rank,
                        int world, uint64_t deadline_ns, const char *who, dt_err *err)
{
    dt_err e = {0};
    int fd = -1, rc = dt_tcp_connect(addr, port, deadline_ns, &fd, &e);
    if (rc)
        return dt_err_set(err, rc, "point-to-point: connecting to %s: %s", who, e.msg);
    hello hl = {HELLO_MAGIC, 0, tag, rank, world};
    if ((rc = dt_tcp_io_all(fd, &hl, sizeof hl, true, deadline_ns)) != 0) {
        close(fd);
        return dt_err_set(err, rc, "point-to-point: greeting %s at %s:%d: %s", who, addr, port,
                          strerror(-rc));
    }
    dt_tcp_tune(fd);
    l->fd = fd;
    l->open = true;
    return 0;
}

int dt_p2p_link_accept(int listen_fd, uint64_t tag, int world, int *fd, int *from)
{
    int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0)
        return 0;
    hello in;
    uint64_t hd = dt_now_ns() + 5000000000ull;
    if (dt_tcp_io_all(c, &in, sizeof in, false, hd) != 0 || in.magic != HELLO_MAGIC ||
        in.tag != tag || in.world != world) {
        close(c);
        return -1;
    }
    *fd = c;
    *from = in.from;
    return 1;
}

void dt_p2p_link_adopt(dt_p2p_link *l, int fd)
{
    dt_tcp_tune(fd);
    l->fd = fd;
    l->open = true;
}
