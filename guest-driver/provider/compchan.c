// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libvrdma-compchan: completion channels for a container's vrdma devices (docs/containers.md).
 *
 * libibverbs makes a completion channel by a write to the device's command file, which a container's device does
 * not have (the tree names /dev/null), and it offers providers no hook for it. A container's image preloads this
 * library (/etc/ld.so.preload), which stands in for ibv_create_comp_channel and ibv_destroy_comp_channel:
 * - for a context whose command file is /dev/null's (a container's vrdma device, whatever else a process opens),
 *   a channel is a pipe: its read end is the channel's fd, which ibv_get_cq_event reads as libibverbs always does;
 *   libvrdma gives the device a write end for every CQ made with the channel (CQ_NOTIFY), and the device writes
 *   each completion event of the CQ into it. A blocking wait is a read of a pipe, woken by the backend;
 * - any other context's channel is libibverbs' own.
 * The library keeps a write end of each of its pipes until the channel is destroyed, so that a read with no CQ
 * yet blocks rather than reading an end of file.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <infiniband/verbs.h>

struct own_channel {
	struct ibv_comp_channel *channel;
	int write_end;
	struct own_channel *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct own_channel *channels;

static bool container_device(struct ibv_context *context)
{
	struct stat st;

	return !fstat(context->cmd_fd, &st) && S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3;
}

static void *real(const char *name)
{
	void *fn = dlvsym(RTLD_NEXT, name, "IBVERBS_1.0");

	if (!fn)
		errno = ENOSYS;
	return fn;
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct ibv_comp_channel *(*create)(struct ibv_context *);
	struct own_channel *own;
	int ends[2];

	if (!container_device(context)) {
		create = real("ibv_create_comp_channel");
		return create ? create(context) : NULL;
	}
	own = calloc(1, sizeof(*own));
	if (!own)
		return NULL;
	own->channel = malloc(sizeof(*own->channel));  /* (freed by libibverbs' ibv_destroy_comp_channel) */
	if (!own->channel || pipe2(ends, O_CLOEXEC)) {
		free(own->channel);
		free(own);
		return NULL;
	}
	own->channel->context = context;
	own->channel->fd = ends[0];
	own->channel->refcnt = 0;
	own->write_end = ends[1];
	pthread_mutex_lock(&lock);
	own->next = channels;
	channels = own;
	pthread_mutex_unlock(&lock);
	return own->channel;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	int (*destroy)(struct ibv_comp_channel *) = real("ibv_destroy_comp_channel");
	struct own_channel **link, *own = NULL;
	int write_end = -1, ret;

	if (!destroy)
		return ENOSYS;
	pthread_mutex_lock(&lock);
	for (link = &channels; *link; link = &(*link)->next) {
		if ((*link)->channel == channel) {
			own = *link;
			write_end = own->write_end;
			break;
		}
	}
	ret = destroy(channel);  /* (EBUSY while a CQ uses it: then it stays ours) */
	if (!ret && own) {
		*link = own->next;
		close(write_end);
		free(own);
	}
	pthread_mutex_unlock(&lock);
	return ret;
}
