// SPDX-License-Identifier: GPL-2.0-only
/*
 * The locks the engine's threads and their callers share (thread.c says who takes which, and when), each thread's
 * context, and waking a thread: the bottom layer, so that every room may lock, post an event or wake a thread.
 * Lock order: devices (by index), the GID index, the network, the event ring.
 */
#include <sys/eventfd.h>

#include "vre.h"

__thread struct vre_ctx *vre_current_ctx __attribute__((tls_model("initial-exec")));

VRE_FN struct vre_worker *vre_workers(struct vre_engine *e, uint32_t *count)
{
	*count = __atomic_load_n(&e->threads.count, __ATOMIC_ACQUIRE);
	return e->threads.workers;
}

/* -- locks ---------------------------------------------------------------------------------------------------- */

static int recursive_mutex(pthread_mutex_t *m)
{
	pthread_mutexattr_t attr;
	int err;

	if (pthread_mutexattr_init(&attr))
		return -1;
	err = pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE) || pthread_mutex_init(m, &attr);
	pthread_mutexattr_destroy(&attr);
	return err ? -1 : 0;
}

VRE_FN int vre_locks_init(struct vre_engine *e)
{
	uint32_t i;

	if (pthread_mutex_init(&e->threads.ev_lock, NULL))
		return -1;
	if (recursive_mutex(&e->threads.net_lock))
		goto no_net;
	if (recursive_mutex(&e->threads.gid_lock))
		goto no_gid;
	for (i = 0; i < e->ndevices; i++) {
		if (recursive_mutex(&e->devices[i].lock))
			goto no_device;
	}
	return 0;
no_device:
	while (i--)
		pthread_mutex_destroy(&e->devices[i].lock);
	pthread_mutex_destroy(&e->threads.gid_lock);
no_gid:
	pthread_mutex_destroy(&e->threads.net_lock);
no_net:
	pthread_mutex_destroy(&e->threads.ev_lock);
	return -1;
}

VRE_FN void vre_locks_destroy(struct vre_engine *e)
{
	for (uint32_t i = 0; i < e->ndevices; i++)
		pthread_mutex_destroy(&e->devices[i].lock);
	pthread_mutex_destroy(&e->threads.gid_lock);
	pthread_mutex_destroy(&e->threads.net_lock);
	pthread_mutex_destroy(&e->threads.ev_lock);
}

static void device_lock(struct vre_device *d)
{
	__atomic_add_fetch(&d->waiters, 1, __ATOMIC_ACQ_REL);
	pthread_mutex_lock(&d->lock);
	__atomic_sub_fetch(&d->waiters, 1, __ATOMIC_ACQ_REL);
}

void vre_lock(struct vre_engine *e)
{
	for (uint32_t i = 0; i < e->ndevices; i++)
		device_lock(&e->devices[i]);
	pthread_mutex_lock(&e->threads.gid_lock);
	pthread_mutex_lock(&e->threads.net_lock);
}

void vre_unlock(struct vre_engine *e)
{
	pthread_mutex_unlock(&e->threads.net_lock);
	pthread_mutex_unlock(&e->threads.gid_lock);
	for (uint32_t i = e->ndevices; i--;)
		pthread_mutex_unlock(&e->devices[i].lock);
}

void vre_lock_device(struct vre_engine *e, uint32_t dev)
{
	if (dev < e->ndevices)
		device_lock(&e->devices[dev]);
	else
		vre_lock(e);
}

void vre_unlock_device(struct vre_engine *e, uint32_t dev)
{
	if (dev < e->ndevices)
		pthread_mutex_unlock(&e->devices[dev].lock);
	else
		vre_unlock(e);
}

/* A thread's try for a device not its own (delivering into it): false if anyone holds it or a caller waits. */
VRE_FN bool device_trylock(struct vre_device *d)
{
	return pthread_mutex_trylock(&d->lock) == 0;
}

VRE_FN void device_unlock(struct vre_device *d)
{
	pthread_mutex_unlock(&d->lock);
}

/* A thread's wait for a device of its own, holding no other lock (parking, its deadlines). */
VRE_FN void device_lock_blocking(struct vre_device *d)
{
	pthread_mutex_lock(&d->lock);
}

VRE_FN void net_lock(struct vre_engine *e)
{
	pthread_mutex_lock(&e->threads.net_lock);
}

VRE_FN void net_unlock(struct vre_engine *e)
{
	pthread_mutex_unlock(&e->threads.net_lock);
}

VRE_FN void gid_lock(struct vre_engine *e)
{
	pthread_mutex_lock(&e->threads.gid_lock);
}

VRE_FN void gid_unlock(struct vre_engine *e)
{
	pthread_mutex_unlock(&e->threads.gid_lock);
}

/* -- the event ring's lock ------------------------------------------------------------------------------------ */

VRE_FN void events_lock(struct vre_engine *e)
{
	pthread_mutex_lock(&e->threads.ev_lock);
}

VRE_FN void events_unlock(struct vre_engine *e)
{
	pthread_mutex_unlock(&e->threads.ev_lock);
}

/* -- waking a thread, giving it a device ------------------------------------------------------------------------ */

uint32_t vre_thread_count(struct vre_engine *e)
{
	uint32_t n;

	(void)vre_workers(e, &n);
	return n;
}

/* The thread that runs `dev` among the n running, or NULL (no such device, or no threads). */
static struct vre_worker *owner_of(struct vre_engine *e, uint32_t dev, struct vre_worker *w, uint32_t n)
{
	uint32_t k = dev < e->ndevices ? __atomic_load_n(&e->devices[dev].owner, __ATOMIC_RELAXED) : n;

	return k < n ? &w[k] : NULL;
}

/* The thread that runs `dev`, if it sleeps (a thread handing it work; cheaper than vre_kick: no system call when the
 * owner is awake, as it is while it has work). */
VRE_FN void vre_kick_sleeping(struct vre_engine *e, uint32_t dev)
{
	uint32_t n;
	struct vre_worker *w = vre_workers(e, &n), *owner = owner_of(e, dev, w, n);

	if (owner && __atomic_load_n(&owner->sleeping, __ATOMIC_ACQUIRE))
		(void)eventfd_write(owner->kick_fd, 1);
}

void vre_kick(struct vre_engine *e, uint32_t dev)
{
	uint32_t n;
	struct vre_worker *w = vre_workers(e, &n), *owner = owner_of(e, dev, w, n);

	if (owner) {
		(void)eventfd_write(owner->kick_fd, 1);  /* a counter already non-zero says "look" too */
		return;
	}
	for (uint32_t k = 0; k < n; k++)
		(void)eventfd_write(w[k].kick_fd, 1);
}

/* The thread a device opened while the threads run is given to: the one with the fewest devices. */
VRE_FN uint32_t vre_new_owner(struct vre_engine *e, uint32_t dev)
{
	uint32_t n, best = 0, fewest = UINT32_MAX;

	(void)vre_workers(e, &n);
	for (uint32_t k = 0; k < n; k++) {
		uint32_t owned = 0;

		for (uint32_t i = 0; i < e->devices_hi; i++) {
			if (i != dev && e->devices[i].open && __atomic_load_n(&e->devices[i].owner, __ATOMIC_RELAXED) == k)
				owned++;
		}
		if (owned < fewest) {
			fewest = owned;
			best = k;
		}
	}
	return best;
}
