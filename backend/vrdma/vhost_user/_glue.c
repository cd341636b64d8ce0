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
    return vu_dispatch(&vu->dev) ? 0 : -1;
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

/* The eventfd the frontend kicks queue `index` through (-1: none yet). */
int vrdma_vu_kick_fd(VrdmaVu *vu, uint16_t index)
{
    return vu->dev.vq && index < vu->dev.max_queues ? vu->dev.vq[index].kick_fd : -1;
}
