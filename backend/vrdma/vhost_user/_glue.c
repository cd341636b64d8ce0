/* See _glue.h. */
#include <string.h>

#include "_glue.h"

static bool vrdma_read_pending(VuDev *dev, int sock, VhostUserMsg *vmsg)
{
    VrdmaVu *vu = (VrdmaVu *)dev;

    (void)sock;
    if (!vu->has_pending) {
        return false;
    }
    memcpy(vmsg, &vu->pending, sizeof(*vmsg));
    vmsg->data = NULL;
    vu->has_pending = 0;
    return true;
}

/* Sizes the Python protocol layer checks its own constants against. */
size_t vrdma_payload_size(void) { return sizeof(((VhostUserMsg *)0)->payload); }
int vrdma_max_fds(void) { return VHOST_MEMORY_BASELINE_NREGIONS; }

bool vrdma_vu_init(VrdmaVu *vu, uint16_t max_queues, int sock, void *handle, const VuDevIface *iface)
{
    vu->handle = handle;
    vu->has_pending = 0;
    return vu_init(&vu->dev, max_queues, sock, vrdma_panic, vrdma_read_pending, vrdma_set_watch,
                   vrdma_remove_watch, iface);
}

/* Whether [p, p + len) lies inside one guest memory region libvhost-user has mapped now. */
static bool ring_mapped(const VuDev *dev, const void *p, uint64_t len)
{
    uint64_t a = (uint64_t)(uintptr_t)p;

    for (unsigned int i = 0; i < dev->nregions; i++) {
        const VuDevRegion *r = &dev->regions[i];
        uint64_t start = r->mmap_addr + r->mmap_offset;

        if (a >= start && len <= r->size && a - start <= r->size - len) {
            return true;
        }
    }
    return false;
}

/*
 * libvhost-user forgets a queue's ring addresses on REM_MEM_REG only when all three of its rings lay in the region
 * removed (unmap_rings), and checks where a ring starts, never where it ends: a frontend that spreads a queue's
 * rings over two regions and removes one, or lays a ring across a region's end, leaves the queue reading memory
 * that is no longer (or never was) the guest's, which the heap may reuse (the campaign fuzzer found it:
 * vring_avail_ring reading a freed heap block). After every message, a queue with any ring not wholly inside one
 * mapped region has its rings forgotten: libvhost-user maps them again on the queue's next use if the memory table
 * has them (vu_is_vq_usable), and otherwise marks the device broken, which closes this connection only.
 */
static void forget_unmapped_rings(VuDev *dev)
{
    for (int i = 0; dev->vq && i < dev->max_queues; i++) {
        VuVirtq *vq = &dev->vq[i];
        uint64_t num = vq->vring.num;

        if (!vq->vring.desc && !vq->vring.avail && !vq->vring.used) {
            continue;
        }
        if (vq->vring.desc && vq->vring.avail && vq->vring.used &&
            ring_mapped(dev, vq->vring.desc, num * sizeof(struct vring_desc)) &&
            ring_mapped(dev, vq->vring.avail, sizeof(struct vring_avail) + num * sizeof(uint16_t) + 2) &&
            ring_mapped(dev, vq->vring.used, sizeof(struct vring_used) + num * sizeof(struct vring_used_elem) + 2)) {
            continue;
        }
        vq->vring.desc = NULL;
        vq->vring.avail = NULL;
        vq->vring.used = NULL;
    }
}

/*
 * Hand one validated message to libvhost-user. The caller owns `fds` until this returns; libvhost-user takes
 * ownership of the ones its handler keeps (memory regions, kick/call fds) and closes the others.
 * Returns 0 when processed, -1 when the message does not fit or libvhost-user failed (it called panic).
 */
int vrdma_vu_dispatch(VrdmaVu *vu, uint32_t request, uint32_t flags, const uint8_t *payload, uint32_t size,
                      const int *fds, int nfds)
{
    if (size > sizeof(vu->pending.payload) || nfds < 0 || nfds > VHOST_MEMORY_BASELINE_NREGIONS) {
        return -1;
    }
    memset(&vu->pending, 0, sizeof(vu->pending));
    vu->pending.request = (int)request;
    vu->pending.flags = flags;
    vu->pending.size = size;
    memcpy(&vu->pending.payload, payload, size);
    memcpy(vu->pending.fds, fds, sizeof(int) * (size_t)nfds);
    vu->pending.fd_num = nfds;
    vu->has_pending = 1;
    if (!vu_dispatch(&vu->dev)) {
        return -1;
    }
    forget_unmapped_rings(&vu->dev);
    return 0;
}

/*
 * Ask the frontend to map `len` bytes of `fd` (from `fd_offset`) into the device's shared memory region `shmid` at
 * `shm_offset` (VHOST_USER_BACKEND_SHMEM_MAP, no reply asked: see vu_shmem_map). Returns 0 when sent, -1 when the
 * protocol features or the backend channel it needs are missing.
 */
int vrdma_vu_shmem_map(VrdmaVu *vu, uint8_t shmid, uint64_t fd_offset, uint64_t shm_offset, uint64_t len,
                       uint64_t flags, int fd)
{
    return vu_shmem_map(&vu->dev, shmid, fd_offset, shm_offset, len, flags, fd) ? 0 : -1;
}

/* Call a watch callback that libvhost-user registered through set_watch. */
void vrdma_call_watch(vu_watch_cb cb, VuDev *dev, int condition, void *data)
{
    cb(dev, condition, data);
}

/*
 * Whether queue `index` may be used now (popped, pushed, notified): its rings mapped, libvhost-user mapping them
 * again if a message forgot them (vu_is_vq_usable), and each wholly inside one region of guest memory, which
 * libvhost-user does not check (a ring across a region's end: the device is marked broken, as libvhost-user marks
 * it when a ring cannot be mapped at all).
 */
bool vrdma_vu_queue_ready(VrdmaVu *vu, uint16_t index)
{
    VuDev *dev = &vu->dev;

    if (!dev->vq || index >= dev->max_queues || !vu_is_vq_usable(dev, &dev->vq[index])) {
        return false;
    }
    forget_unmapped_rings(dev);
    if (!dev->vq[index].vring.avail) {
        vu_panic(dev, "queue %u's rings are not inside guest memory", index);
        return false;
    }
    return true;
}

/* The eventfd the frontend kicks queue `index` through (-1: none yet). */
int vrdma_vu_kick_fd(VrdmaVu *vu, uint16_t index)
{
    return vu->dev.vq && index < vu->dev.max_queues ? vu->dev.vq[index].kick_fd : -1;
}

/*
 * Mark guest pages [gpa, gpa + len) in a dirty log (VHOST_USER_SET_LOG_BASE's bitmap: a bit per 4 KiB page from guest
 * address 0), each bit atomically after the bytes are written: QEMU collects and clears bits meanwhile, and the VM's
 * other vhost back-ends mark theirs in the same log. A page past the log is one QEMU does not migrate.
 */
void vrdma_log_mark(uint8_t *bits, uint64_t bytes, uint64_t gpa, uint64_t len)
{
    if (!bits || !len || gpa + len < gpa) {
        return;
    }
    for (uint64_t page = gpa / VHOST_LOG_PAGE, last = (gpa + len - 1) / VHOST_LOG_PAGE;
         page <= last && page / 8 < bytes; page++) {
        __atomic_fetch_or(&bits[page / 8], (uint8_t)(1u << (page % 8)), __ATOMIC_RELEASE);
    }
}

/*
 * The used ring of queue `index` marked whole in a dirty log, when the frontend asked for its writes to be logged
 * (SET_VRING_ADDR's VHOST_VRING_F_LOG, at its log_guest_addr): libvhost-user would log it only into a log of its
 * own, which it never gets here (the protocol layer owns SET_LOG_BASE).
 */
void vrdma_vu_log_used(VrdmaVu *vu, uint16_t index, uint8_t *bits, uint64_t bytes)
{
    const VuVirtq *vq;

    if (!vu->dev.vq || index >= vu->dev.max_queues) {
        return;
    }
    vq = &vu->dev.vq[index];
    if (!(vq->vring.flags & (1u << VHOST_VRING_F_LOG)) || !vq->vring.num) {
        return;
    }
    vrdma_log_mark(bits, bytes, vq->vring.log_guest_addr,
                   offsetof(struct vring_used, ring) + (uint64_t)vq->vring.num * sizeof(struct vring_used_elem) +
                   sizeof(uint16_t));
}

/*
 * What queue `index` is, as a backend upgrade hands it to the next process (vrdma/vhost_user/handover.py), which
 * sets it up again with the messages that made it: its size and next index, its ring addresses as the frontend
 * gave them, its eventfds (the caller duplicates them) and whether it is enabled and started. False: no such queue.
 */
bool vrdma_vu_queue_state(VrdmaVu *vu, uint16_t index, VrdmaQueueState *out)
{
    const VuVirtq *vq;

    if (!vu->dev.vq || index >= vu->dev.max_queues) {
        return false;
    }
    vq = &vu->dev.vq[index];
    *out = (VrdmaQueueState){ .num = vq->vring.num, .last_avail_idx = vq->last_avail_idx, .used_idx = vq->used_idx,
                              .inuse = vq->inuse, .enable = vq->enable, .started = vq->started,
                              .kick_fd = vq->kick_fd, .call_fd = vq->call_fd, .err_fd = vq->err_fd,
                              .flags = vq->vra.flags, .desc_user_addr = vq->vra.desc_user_addr,
                              .used_user_addr = vq->vra.used_user_addr, .avail_user_addr = vq->vra.avail_user_addr,
                              .log_guest_addr = vq->vra.log_guest_addr };
    return true;
}

/* The backend channel's socket (-1: none). */
int vrdma_vu_backend_fd(VrdmaVu *vu)
{
    return vu->dev.backend_fd;
}
