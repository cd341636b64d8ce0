// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * A container's device: no kernel between this process and the device, the backend's container channel instead
 * (vrdma_channel.h, docs/containers.md). What vrdma.ko does for a VM's process is done here:
 * - the commands: the device's own (vrdma_dev_cmd.h), one at a time over the channel's socket;
 * - the memory the device reaches: memfds shared with the backend (ADD_MEMORY), each placed in this process's
 *   window of device addresses. Rings and page lists come from an arena of such memfds; memory an application
 *   registers is remapped onto a memfd of its own at the same address (vrdma_chan_share), as FreeFlow does;
 * - the doorbells: the container's doorbell region, mapped whole (the backend gave its memfd at HELLO); the engine
 *   is woken by the wake eventfd when its parked slot says so.
 * Every value the backend hands back is checked before use, as the VM's provider checks the kernel's. The memory is
 * chan_mem.c's.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "channel.h"

static int chan_send(struct vrdma_channel *chan, uint16_t type, const void *body, size_t len, const int *fds,
		     int nfds)
{
	struct vrdma_chan_hdr hdr = { .type = htole16(type), .seq = htole32(++chan->seq) };
	struct iovec iov[2] = { { &hdr, sizeof(hdr) }, { (void *)body, len } };
	union { char buf[CMSG_SPACE(2 * sizeof(int))]; struct cmsghdr align; } control = {};
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 2 };

	if (nfds) {
		struct cmsghdr *cmsg;

		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
		cmsg = CMSG_FIRSTHDR(&msg);
		cmsg->cmsg_level = SOL_SOCKET;
		cmsg->cmsg_type = SCM_RIGHTS;
		cmsg->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
		memcpy(CMSG_DATA(cmsg), fds, (size_t)nfds * sizeof(int));
	}
	if (sendmsg(chan->sock, &msg, MSG_NOSIGNAL) != (ssize_t)(sizeof(hdr) + len))
		return errno ? errno : EPROTO;
	return 0;
}

/*
 * The answer to the request just sent: its bytes into `buf` (at most `size`), its descriptors into `fds` (at most
 * `max_fds`; more are closed), how many of each. EVENT messages before it are the device's news: dropped here (no
 * completion channel or async event reaches a container's process yet: docs/containers.md).
 */
static int chan_answer(struct vrdma_channel *chan, uint16_t type, void *buf, size_t size, size_t *len, int *fds,
		       int max_fds, int *nfds)
{
	for (;;) {
		union { char buf[CMSG_SPACE(4 * sizeof(int))]; struct cmsghdr align; } control;
		struct iovec iov = { buf, size };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
				      .msg_controllen = sizeof(control.buf) };
		const struct vrdma_chan_hdr *hdr = buf;
		ssize_t got = recvmsg(chan->sock, &msg, MSG_CMSG_CLOEXEC);
		int n = 0;

		if (got <= 0)
			return got == 0 ? ECONNRESET : errno;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
				int fd;

				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
				if (n < max_fds)
					fds[n++] = fd;
				else
					close(fd);
			}
		}
		if ((msg.msg_flags & MSG_TRUNC) || (size_t)got < sizeof(*hdr)) {
			while (n)
				close(fds[--n]);
			return EPROTO;
		}
		if (le16toh(hdr->type) == VRDMA_CHAN_EVENT) {
			while (n)
				close(fds[--n]);
			continue;
		}
		if (le16toh(hdr->type) != type || le32toh(hdr->seq) != chan->seq) {
			while (n)
				close(fds[--n]);
			return EPROTO;
		}
		*len = (size_t)got;
		*nfds = n;
		return 0;
	}
}

static int status_errno(uint16_t status)
{
	switch (status) {
	case VRDMA_STATUS_OK:
		return 0;
	case VRDMA_STATUS_NOT_SUPPORTED:
		return EOPNOTSUPP;
	case VRDMA_STATUS_NO_RESOURCES:
		return ENOMEM;
	case VRDMA_STATUS_BUSY:
		return EBUSY;
	default:
		return EINVAL;
	}
}

int vrdma_chan_request(struct vrdma_channel *chan, uint16_t type, const void *body, size_t len, const int *fds,
		       int nfds, void *answer, size_t answer_size)
{
	size_t got;
	int n, ret;

	ret = chan_send(chan, type, body, len, fds, nfds);
	if (!ret)
		ret = chan_answer(chan, type, answer, answer_size, &got, NULL, 0, &n);
	if (ret)
		return ret;
	ret = status_errno(le16toh(((struct vrdma_chan_hdr *)answer)->status));
	return !ret && got != answer_size ? EPROTO : ret;
}

int vrdma_chan_cmd(struct vrdma_context *ctx, uint16_t opcode, void *req, size_t req_len, void *resp,
		   size_t resp_len)
{
	struct vrdma_channel *chan = ctx->chan;
	uint8_t answer[VRDMA_CHANNEL_MAX_MESSAGE];
	struct vrdma_cmd_hdr *cmd = req;
	const struct vrdma_resp_hdr *rh = (const void *)(answer + sizeof(struct vrdma_chan_hdr));
	size_t got;
	int n, ret;

	pthread_mutex_lock(&chan->lock);
	cmd->opcode = htole16(opcode);
	cmd->seq = htole32(chan->seq + 1);
	ret = chan_send(chan, VRDMA_CHAN_COMMAND, req, req_len, NULL, 0);
	if (!ret)
		ret = chan_answer(chan, VRDMA_CHAN_COMMAND, answer, sizeof(answer), &got, NULL, 0, &n);
	if (!ret && got < sizeof(struct vrdma_chan_hdr) + sizeof(*rh))
		ret = EPROTO;
	if (!ret && (le16toh(rh->opcode) != opcode || le32toh(rh->seq) != chan->seq))
		ret = EPROTO;
	if (!ret)
		ret = status_errno(le16toh(rh->status));
	if (!ret && got - sizeof(struct vrdma_chan_hdr) != resp_len)
		ret = EPROTO;  /* a good response is exactly its struct */
	if (!ret)
		memcpy(resp, rh, resp_len);
	pthread_mutex_unlock(&chan->lock);
	if (ret && ret != EINVAL && ret != ENOMEM && ret != EBUSY && ret != EOPNOTSUPP)
		verbs_err(&ctx->ibv_ctx, "vrdma: command %u over the container channel failed: %s\n", opcode,
			  strerror(ret));
	return ret;
}

/*
 * A CQ's completion events into the pipe whose read end is `channel_fd` (a completion channel's): the device is
 * given a write end of it, opened anew through /proc (a pipe's read end opened for writing is a write end).
 */
int vrdma_chan_cq_notify(struct vrdma_context *ctx, uint32_t cq, uint64_t cookie, int channel_fd)
{
	struct vrdma_chan_cq_notify req = { .cq = htole32(cq), .cookie = htole64(cookie) };
	struct vrdma_chan_hdr answer;
	char path[64];
	int fd, ret;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", channel_fd);
	fd = open(path, O_WRONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		ret = errno;
		verbs_err(&ctx->ibv_ctx, "vrdma: the completion channel's fd %d is no pipe to give the device: %s\n",
			  channel_fd, strerror(ret));
		return ret;
	}
	pthread_mutex_lock(&ctx->chan->lock);
	ret = vrdma_chan_request(ctx->chan, VRDMA_CHAN_CQ_NOTIFY, (const uint8_t *)&req + sizeof(req.hdr),
				 sizeof(req) - sizeof(req.hdr), &fd, 1, &answer, sizeof(answer));
	pthread_mutex_unlock(&ctx->chan->lock);
	close(fd);
	return ret;
}

/* -- doorbells --------------------------------------------------------------------------------------------------- */

volatile uint32_t *vrdma_chan_db(struct vrdma_context *ctx, uint32_t index)
{
	uint32_t page = VRDMA_DB_PAGE(index), slot = VRDMA_DB_SLOT(index);

	if (page < VRDMA_FIRST_USER_DOORBELL_PAGE || page >= ctx->chan->doorbell_pages ||
	    slot == VRDMA_DB_SLOT_PARKED || slot == VRDMA_DB_SLOT_ALIVE) {
		verbs_err(&ctx->ibv_ctx, "vrdma: the device gave doorbell index %u: not usable\n", index);
		errno = EPROTO;
		return NULL;
	}
	return (volatile uint32_t *)(ctx->chan->doorbells + (size_t)page * VRDMA_DOORBELL_PAGE_SIZE) + slot;
}

void vrdma_chan_wake(struct vrdma_context *ctx)
{
	if (eventfd_write(ctx->chan->wake_fd, 1))
		verbs_err(&ctx->ibv_ctx, "vrdma: waking the device failed: %s\n", strerror(errno));
}

/* -- the connection ---------------------------------------------------------------------------------------------- */

/* Where the container's socket is: the device's `vrdma_socket` file, else /run/vrdma/<device>.sock. */
static void socket_path(struct verbs_sysfs_dev *sysfs, struct sockaddr_un *addr)
{
	char path[sizeof(addr->sun_path)] = "";

	addr->sun_family = AF_UNIX;
	if (ibv_read_ibdev_sysfs_file(path, sizeof(path), sysfs, "vrdma_socket") > 0)
		path[strcspn(path, "\n")] = 0;
	if (!path[0])
		snprintf(path, sizeof(path), "/run/vrdma/%s.sock", sysfs->ibdev_name);
	memcpy(addr->sun_path, path, sizeof(addr->sun_path));
}

static int hello(struct vrdma_channel *chan, struct vrdma_chan_hello_resp *resp, int *fds)
{
	struct vrdma_chan_hello req = { .version = htole32(VRDMA_CHANNEL_VERSION) };
	size_t got;
	int n, ret;

	ret = chan_send(chan, VRDMA_CHAN_HELLO, (const uint8_t *)&req + sizeof(req.hdr), sizeof(req) - sizeof(req.hdr),
			NULL, 0);
	if (!ret)
		ret = chan_answer(chan, VRDMA_CHAN_HELLO, resp, sizeof(*resp), &got, fds, 2, &n);
	if (ret)
		return ret;
	ret = status_errno(le16toh(resp->hdr.status));
	if (!ret && (got != sizeof(*resp) || n != 2))
		ret = EPROTO;
	if (ret)
		while (n)
			close(fds[--n]);
	return ret;
}

int vrdma_chan_open(struct vrdma_context *ctx, struct verbs_sysfs_dev *sysfs)
{
	struct vrdma_channel *chan = calloc(1, sizeof(*chan));
	struct sockaddr_un addr = {};
	struct vrdma_chan_hello_resp resp;
	int fds[2] = { -1, -1 }, ret;

	if (!chan)
		return ENOMEM;
	pthread_mutex_init(&chan->lock, NULL);
	chan->wake_fd = chan->event_pipe[0] = chan->event_pipe[1] = -1;
	chan->doorbells = MAP_FAILED;
	ctx->chan = chan;
	socket_path(sysfs, &addr);
	chan->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (chan->sock < 0 || connect(chan->sock, (struct sockaddr *)&addr, sizeof(addr))) {
		ret = errno;
		verbs_err(&ctx->ibv_ctx, "vrdma: cannot reach the container's device at %s: %s\n", addr.sun_path,
			  strerror(ret));
		goto err;
	}
	ret = hello(chan, &resp, fds);
	if (ret) {
		verbs_err(&ctx->ibv_ctx, "vrdma: the device at %s refused this process: %s\n", addr.sun_path,
			  strerror(ret));
		goto err;
	}
	chan->wake_fd = fds[1];
	chan->ucontext = ctx->ucontext = le32toh(resp.ucontext);
	chan->doorbell_pages = le32toh(resp.doorbell_pages);
	chan->window_base = le64toh(resp.window_base);
	chan->window_size = le64toh(resp.window_size);
	chan->max_regions = le32toh(resp.max_regions);
	if (le32toh(resp.version) != VRDMA_CHANNEL_VERSION || chan->doorbell_pages > 65536 ||
	    le32toh(resp.doorbell_page) < VRDMA_FIRST_USER_DOORBELL_PAGE ||
	    le32toh(resp.doorbell_page) >= chan->doorbell_pages || !chan->window_size ||
	    chan->window_base + chan->window_size < chan->window_base) {
		verbs_err(&ctx->ibv_ctx, "vrdma: the device's HELLO is not usable\n");
		close(fds[0]);
		ret = EPROTO;
		goto err;
	}
	chan->doorbell_bytes = (size_t)chan->doorbell_pages * VRDMA_DOORBELL_PAGE_SIZE;
	chan->doorbells = mmap(NULL, chan->doorbell_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	close(fds[0]);
	if (chan->doorbells == MAP_FAILED) {
		ret = errno;
		goto err;
	}
	ctx->doorbell_page = le32toh(resp.doorbell_page);
	ctx->doorbell_size = VRDMA_DOORBELL_PAGE_SIZE;
	ctx->doorbell_pages = chan->doorbell_pages;
	ctx->doorbell = (volatile uint32_t *)(chan->doorbells + (size_t)ctx->doorbell_page * VRDMA_DOORBELL_PAGE_SIZE);
	/* What libibverbs reads async events from: nothing is written to it yet (docs/containers.md). */
	if (pipe2(chan->event_pipe, O_CLOEXEC)) {
		ret = errno;
		goto err;
	}
	ctx->ibv_ctx.context.async_fd = chan->event_pipe[0];
	return 0;

err:
	vrdma_chan_close(ctx);
	return ret;
}

/* The process lets the device go: the backend frees what it still holds of this context when the socket closes. */
void vrdma_chan_close(struct vrdma_context *ctx)
{
	struct vrdma_channel *chan = ctx->chan;

	if (!chan)
		return;
	if (chan->sock >= 0)
		close(chan->sock);
	if (chan->doorbells != MAP_FAILED)
		munmap(chan->doorbells, chan->doorbell_bytes);
	if (chan->wake_fd >= 0)
		close(chan->wake_fd);
	if (chan->event_pipe[1] >= 0)
		close(chan->event_pipe[1]);  /* (libibverbs closes async_fd, the read end) */
	while (chan->chunks) {
		struct chan_chunk *chunk = chan->chunks;

		chan->chunks = chunk->next;
		munmap(chunk->va, chunk->pages * VRDMA_PAGE_SIZE);
		free(chunk->used);
		free(chunk);
	}
	while (chan->shares) {  /* registrations never deregistered: their memory stays as it is, the app's */
		struct chan_share *share = chan->shares;

		chan->shares = share->next;
		close(share->fd);
		free(share);
	}
	pthread_mutex_destroy(&chan->lock);
	free(chan);
	ctx->chan = NULL;
}
