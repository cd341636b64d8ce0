/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause */
/*
 * The container channel: how a host process (in a container: docs/containers.md) reaches the device that a VM
 * reaches through virtio. The device model is the same; only the transport differs:
 *
 *   virtio (a VM)                              the channel (a host process)
 *   control virtqueue: commands                COMMAND messages carrying the same commands (vrdma_dev_cmd.h)
 *   event virtqueue: struct vrdma_event        EVENT messages carrying the same struct
 *   guest RAM (the vhost-user memory table)    memfds the process adds (ADD_MEMORY), each placed in the
 *                                              process's own window of device addresses
 *   the doorbell region (BAR 2)                the container's doorbell region, a memfd given at HELLO
 *   the wake virtqueue's kick                  an eventfd given at HELLO
 *
 * The channel is a SOCK_SEQPACKET unix socket: one message per packet, file descriptors as SCM_RIGHTS. The process
 * speaks first (HELLO) and waits for each answer before its next request; the device answers every request with a
 * message of the same type, the same seq and a status, and sends EVENT messages of its own accord. Each connection
 * is one user context of the container's device: its commands may name only the objects it made and only the
 * memory it added. The backend checks every message as it checks a guest's (docs/containers.md).
 *
 * Rules as in vrdma_dev_api.h: fixed-width little-endian types, explicit padding, sizes checked below and by the
 * backend, which loads the text between the markers (vrdma.channel.wire). VRDMA_STATUS_* are vrdma_dev_cmd.h's.
 */
#ifndef VRDMA_CHANNEL_H
#define VRDMA_CHANNEL_H

#include <linux/types.h>

/* CHANNEL-API-BEGIN */
#define VRDMA_CHANNEL_VERSION 1
#define VRDMA_CHANNEL_MAX_MESSAGE 4096  /* the longest message either side sends (a header and a command) */

/* Message types */
#define VRDMA_CHAN_HELLO 1          /* process -> device, first: answered with the doorbell region and wake eventfd */
#define VRDMA_CHAN_ADD_MEMORY 2     /* process -> device, one memfd attached: placed in the process's window */
#define VRDMA_CHAN_REMOVE_MEMORY 3  /* process -> device: a region no object of the process uses any more */
#define VRDMA_CHAN_COMMAND 4        /* process -> device: a control command follows the header; its response too */
#define VRDMA_CHAN_EVENT 5          /* device -> process: struct vrdma_event follows the header */
#define VRDMA_CHAN_CQ_NOTIFY 6      /* process -> device, a pipe's write end attached: where a CQ's events go */

/* Statuses in answers: VRDMA_STATUS_*'s numbers (vrdma_dev_cmd.h), named here for the channel's own refusals. */
#define VRDMA_CHAN_STATUS_OK 0
#define VRDMA_CHAN_STATUS_NOT_SUPPORTED 1  /* a message type the device does not know */
#define VRDMA_CHAN_STATUS_INVALID 2        /* a value the device refuses (the backend's log says which) */
#define VRDMA_CHAN_STATUS_BAD_LENGTH 3     /* a message of the wrong size for its type */
#define VRDMA_CHAN_STATUS_NO_RESOURCES 4   /* no room: regions, the window, the device's contexts */

/* Every message starts with this header. */
struct vrdma_chan_hdr {
	__le16 type;              /* VRDMA_CHAN_* */
	__le16 status;            /* in answers: VRDMA_CHAN_STATUS_* (a COMMAND's own is in its response) */
	__le32 seq;               /* chosen by the process, echoed in the answer; 0 in EVENT messages */
};

struct vrdma_chan_hello {
	struct vrdma_chan_hdr hdr;
	__le32 version;           /* VRDMA_CHANNEL_VERSION the process speaks */
	__le32 reserved;
};

/* HELLO's answer, with two descriptors: the doorbell region (a memfd of doorbell_pages pages) and the wake
 * eventfd (written when the region's parked slot says the engine sleeps, as a guest kicks the wake queue). */
struct vrdma_chan_hello_resp {
	struct vrdma_chan_hdr hdr;
	__le32 version;           /* VRDMA_CHANNEL_VERSION the device speaks */
	__le32 ucontext;          /* the connection's user context: what its commands' ucontext fields must say */
	__le32 doorbell_page;     /* the context's first doorbell page */
	__le32 doorbell_pages;    /* pages in the doorbell region, header page included */
	__le64 window_base;       /* the connection's device addresses: every region it adds is placed in */
	__le64 window_size;       /*   [window_base, window_base + window_size) */
	__le32 max_regions;       /* regions the connection may hold at once */
	__le32 max_message;       /* VRDMA_CHANNEL_MAX_MESSAGE */
};

/* ADD_MEMORY, with one descriptor: a memfd, sealed against shrinking (F_SEAL_SHRINK), of at least size bytes. */
struct vrdma_chan_add_memory {
	struct vrdma_chan_hdr hdr;
	__le64 size;              /* bytes of the memfd to map, a multiple of 4096 */
};

struct vrdma_chan_memory_resp {
	struct vrdma_chan_hdr hdr;
	__le64 addr;              /* the device address of the region's first byte (page lists and rings name it) */
};

struct vrdma_chan_remove_memory {
	struct vrdma_chan_hdr hdr;
	__le64 addr;              /* what ADD_MEMORY answered */
};

/*
 * CQ_NOTIFY, with one descriptor: the write end of a pipe (a completion channel's, whose read end libibverbs'
 * ibv_get_cq_event reads). From then on each completion event of the CQ (armed through its doorbell slot) is
 * written into it as the 8 bytes of `cookie` (struct ib_uverbs_comp_event_desc: the ibv_cq's address) instead of
 * an EVENT message; one the pipe has no room for is dropped and counted. Answered with a bare header.
 */
struct vrdma_chan_cq_notify {
	struct vrdma_chan_hdr hdr;
	__le32 cq;                /* the CQ's handle (one of the process's) */
	__le32 reserved;
	__le64 cookie;
};
/* CHANNEL-API-END */

#ifndef VRDMA_ASSERT_SIZE
#define VRDMA_ASSERT_SIZE(type, size) _Static_assert(sizeof(struct type) == (size), #type " changed size")
#endif
VRDMA_ASSERT_SIZE(vrdma_chan_hdr, 8);
VRDMA_ASSERT_SIZE(vrdma_chan_hello, 16);
VRDMA_ASSERT_SIZE(vrdma_chan_hello_resp, 48);
VRDMA_ASSERT_SIZE(vrdma_chan_add_memory, 16);
VRDMA_ASSERT_SIZE(vrdma_chan_memory_resp, 16);
VRDMA_ASSERT_SIZE(vrdma_chan_remove_memory, 16);
VRDMA_ASSERT_SIZE(vrdma_chan_cq_notify, 24);

#endif /* VRDMA_CHANNEL_H */
