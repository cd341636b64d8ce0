/*
 * vrdma glue around QEMU's libvhost-user, compiled together with it by cffi (see _build.py).
 *
 * The Python side frames and validates every vhost-user message before libvhost-user sees it (libvhost-user's own
 * reader asserts on peer data and blocks on partial messages). A validated message is parked in the device's
 * `pending` slot and vu_dispatch() is called; the custom read_msg below hands it over.
 */
#ifndef VRDMA_VHOST_USER_GLUE_H
#define VRDMA_VHOST_USER_GLUE_H

#include "libvhost-user.h"

typedef struct VrdmaVu {
    VuDev dev;                /* first member: a VuDev * is a VrdmaVu * */
    void *handle;             /* the Python VhostUserConnection (cffi handle) */
    VhostUserMsg pending;     /* the next message for vu_dispatch() */
    int has_pending;
} VrdmaVu;

/* A queue as vrdma_vu_queue_state reports it (a backend upgrade's hand-over). */
typedef struct VrdmaQueueState {
    uint32_t num;
    uint16_t last_avail_idx;
    uint16_t used_idx;
    uint32_t inuse;
    uint32_t enable;
    bool started;
    int kick_fd;
    int call_fd;
    int err_fd;
    uint32_t flags;
    uint64_t desc_user_addr;
    uint64_t used_user_addr;
    uint64_t avail_user_addr;
    uint64_t log_guest_addr;
} VrdmaQueueState;

#endif
