// SPDX-License-Identifier: GPL-2.0-only
/*
 * The engine's threads (vre_thread_start): the data path runs here, beside the backend's event loop, which keeps the
 * control path (commands, vhost-user, the admin socket).
 *
 * Each thread runs the devices it owns (struct vre_device.owner: given out in turn as they open); a thread that
 * finds nothing to do takes a busy device from a thread running two or more (balance), so two busy VMs do not share
 * a thread while another idles. The unit of locking is the device: whatever a device holds (its objects, its guest
 * memory, its counters) is touched only under its lock. Its owner takes it for the device's turn; a thread
 * delivering into another device (a WRITE from a VM of its own into a VM of another thread's) tries that device's
 * lock and, if it is taken, leaves the work request for its next pass, so a thread never waits holding a lock and
 * no two threads wait for each other. A caller takes the lock of the device its call is about (vre_lock_device), or
 * every lock for a call about the engine (vre_lock: devices in index order, then the GID index's, then the
 * network's); a thread lets a waiting caller have a device first (waiters), so a call waits for at most one turn,
 * never for a spin or a whole transfer, and no control change (a destroy, a new memory table) ever meets a turn
 * half done. Lock order: devices, the GID index, the network, the event ring.
 *
 * The network (RoCE v2) is received on rings the kernel's fanout gives each a share of the flows (thread i reads
 * rings i, i + threads, ...: sockio.c), and a thread takes the lock of each packet's device to handle
 * it; packets go out from whichever thread built them, through the one queue the network lock guards. Each thread has
 * its own context (struct vre_ctx: its clock and its scratch for a WQE's copies).
 *
 * Idle for park_after_ns, a thread parks its devices (the parked slot of every doorbell page, one more look: poll.c)
 * and sleeps in ppoll(2) on its kick eventfd (vre_kick: a guest's wake-up, a change of deadlines or devices), the
 * RoCE rings it reads, until the next deadline of its devices (a retry, a moderation timer, a limited VM's
 * bucket) and, while a driver asked for it, at most the recheck period. Events for the model wake the event loop
 * through its eventfd.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* ppoll, pthread_setaffinity_np */
#endif
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "vre.h"

static void *worker_main(void *arg);

/* -- events --------------------------------------------------------------------------------------------------- */

/* After a pass: write the events eventfd once for events the caller has not been told of (posted by any thread or
 * by the caller's own calls). The event ring's lock only when something was posted: every thread taking it every
 * pass passed its cache line from core to core. */
static void tell_events(struct vre_engine *e)
{
	bool tell;

	if (!__atomic_load_n(&e->threads.events_posted, __ATOMIC_ACQUIRE))
		return;
	events_lock(e);
	__atomic_store_n(&e->threads.events_posted, 0, __ATOMIC_RELAXED);
	tell = e->ev_head != e->ev_tail && !e->threads.events_told;
	e->threads.events_told |= tell;
	events_unlock(e);
	if (tell)
		(void)eventfd_write(e->threads.config.events_fd, 1);
}

/* -- starting, stopping, waking ------------------------------------------------------------------------------- */

static void stop_workers(struct vre_engine *e, struct vre_worker *w, uint32_t n)
{
	for (uint32_t k = 0; k < n; k++)
		__atomic_store_n(&w[k].stop, 1, __ATOMIC_RELEASE);
	for (uint32_t k = 0; k < n; k++) {
		if (w[k].kick_fd >= 0)
			(void)eventfd_write(w[k].kick_fd, 1);
	}
	for (uint32_t k = 0; k < n; k++) {
		if (w[k].started)
			pthread_join(w[k].id, NULL);
	}
	__atomic_store_n(&e->threads.count, 0, __ATOMIC_RELEASE);
	for (uint32_t k = 0; k < n; k++) {
		if (w[k].kick_fd >= 0)
			close(w[k].kick_fd);
		free(w[k].fds);
	}
	e->threads.workers = NULL;
	free(w);
}

static int pin(struct vre_engine *e, struct vre_worker *w)
{
	cpu_set_t set;
	int err;

	if (w->cpu < 0)
		return 0;
	if (w->cpu >= CPU_SETSIZE)
		return vre_fail(e, EINVAL, "engine thread %u: no CPU %d", w->index, w->cpu);
	CPU_ZERO(&set);
	CPU_SET(w->cpu, &set);
	err = pthread_setaffinity_np(w->id, sizeof(set), &set);
	return err ? vre_fail(e, err, "engine thread %u: cannot run on CPU %d: %s", w->index, w->cpu, strerror(err)) : 0;
}

int vre_thread_start(struct vre_engine *e, const struct vre_thread_config *config)
{
	struct vre_worker *w;
	uint32_t n = config->threads;
	int err;

	if (e->threads.count)
		return vre_fail(e, EBUSY, "the engine's threads are running");
	if (!config->budget || config->events_fd < 0 || n < 1 || n > VRE_MAX_THREADS)
		return vre_fail(e, EINVAL, "engine threads need a budget, an events fd and a count of 1 to %u",
				VRE_MAX_THREADS);
	w = vre_alloc_lines(n, sizeof(*w));  /* each its own cache lines (its context's scratch is aligned) */
	if (!w)
		return vre_fail(e, ENOMEM, "no memory for %u engine threads", n);
	e->threads.config = *config;
	e->threads.events_told = false;
	for (uint32_t k = 0; k < n; k++) {
		w[k] = (struct vre_worker){ .engine = e, .index = k, .cpu = config->cpus[k], .ctx.engine = e,
					    .ctx.worker = k };
		w[k].nfds_room = e->ndevices + e->nrings + 1;  /* its kick, rings, devices */
		w[k].fds = calloc(w[k].nfds_room, sizeof(*w[k].fds));
		w[k].kick_fd = w[k].fds ? eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) : -1;
		if (w[k].kick_fd < 0) {
			err = w[k].fds ? errno : ENOMEM;
			free(w[k].fds);
			for (uint32_t j = 0; j < k; j++) {
				close(w[j].kick_fd);
				free(w[j].fds);
			}
			free(w);
			return vre_fail(e, err, "no eventfd for an engine thread: %s", strerror(err));
		}
	}
	vre_unpark(e);  /* the caller's parking ends: each thread parks its own devices */
	for (uint32_t i = 0; i < e->devices_hi; i++)
		__atomic_store_n(&e->devices[i].owner, i % n, __ATOMIC_RELAXED);
	e->threads.workers = w;
	__atomic_store_n(&e->threads.count, n, __ATOMIC_RELEASE);
	/* The threads start with every signal blocked that is meant for the process (SIGTERM, SIGINT, ...), so that the
	 * kernel gives it to a thread that can handle it: Python runs handlers in its main thread only, and takes a
	 * signal in another only through the wake-up fd of set_wakeup_fd (server.py), which a C thread knows nothing
	 * of. Not the faults a thread causes itself: the fault guard takes a SIGBUS of guest memory that shrank under
	 * the engine in the thread that touched it, and one raised while blocked kills the process instead. */
	sigset_t all, caller;

	sigfillset(&all);
	for (const int *fault = (const int[]){ SIGBUS, SIGSEGV, SIGILL, SIGFPE, SIGTRAP, SIGSYS, 0 }; *fault; fault++)
		sigdelset(&all, *fault);
	pthread_sigmask(SIG_SETMASK, &all, &caller);
	for (uint32_t k = 0; k < n; k++) {
		err = pthread_create(&w[k].id, NULL, worker_main, &w[k]);
		if (err) {
			pthread_sigmask(SIG_SETMASK, &caller, NULL);
			stop_workers(e, w, n);
			return vre_fail(e, err, "cannot start engine thread %u: %s", k, strerror(err));
		}
		w[k].started = true;
		if (pin(e, &w[k])) {
			char why[sizeof(e->error)];

			pthread_sigmask(SIG_SETMASK, &caller, NULL);
			memcpy(why, e->error, sizeof(why));
			stop_workers(e, w, n);
			return vre_fail(e, EINVAL, "%s", why);
		}
	}
	pthread_sigmask(SIG_SETMASK, &caller, NULL);
	return 0;
}

/* Not under a lock: the threads take them to finish their passes. */
void vre_thread_stop(struct vre_engine *e)
{
	uint32_t n;
	struct vre_worker *w = vre_workers(e, &n);

	if (!n)
		return;
	stop_workers(e, w, n);
	vre_unpark(e);  /* posters need not wake an engine nobody runs: the caller polls now */
}

void vre_thread_recheck(struct vre_engine *e, uint64_t period_ns)
{
	__atomic_store_n(&e->threads.recheck_ns, period_ns, __ATOMIC_RELEASE);
	vre_kick(e, VRE_NO_DEVICE);  /* a parked thread sleeps by the old period */
}

int vre_thread_stats(struct vre_engine *e, uint32_t thread, struct vre_thread_stats *out)
{
	uint32_t n;
	struct vre_worker *w = vre_workers(e, &n);

	if (thread != VRE_MAX_THREADS && thread >= n)
		return -1;
	*out = (struct vre_thread_stats){ 0 };
	for (uint32_t k = 0; k < n; k++) {
		const uint64_t *from = (const uint64_t *)&w[k].stats;
		uint64_t *to = (uint64_t *)out;

		if (thread != VRE_MAX_THREADS && k != thread)
			continue;
		for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
			to[i] += __atomic_load_n(&from[i], __ATOMIC_RELAXED);
	}
	return 0;
}

int vre_device_owner(struct vre_engine *e, uint32_t dev)
{
	if (dev >= e->ndevices || !__atomic_load_n(&e->devices[dev].open, __ATOMIC_ACQUIRE) || !vre_thread_count(e))
		return -1;
	return (int)__atomic_load_n(&e->devices[dev].owner, __ATOMIC_RELAXED);
}

/* -- a thread ------------------------------------------------------------------------------------------------- */

/* One pass over the thread's devices and its receive rings; the events it produced told. */
static uint32_t pass(struct vre_worker *w)
{
	struct vre_engine *e = w->engine;
	int64_t start = vre_monotonic_ns();
	uint32_t work = vre_poll_owned(e, w, e->threads.config.budget);

	tell_events(e);
	stat_add(&w->stats.passes, 1);
	if (work) {
		stat_add(&w->stats.work, work);
		stat_add(&w->stats.busy_ns, (uint64_t)(vre_monotonic_ns() - start));
	}
	return work;
}

/*
 * Nothing to do for park_after_ns: take a device that had work in its last turn from a thread that had two or more
 * such (and wake a parked thread for one, below). One at a time, so that two idle threads share a busy one's
 * devices out, and only a device that has not changed thread in the last VRE_MOVE_EVERY_NS. Drivers that post in
 * bursts leave threads idle for moments: taking a device at the first empty pass tossed busy devices between
 * threads all the time (16 VMs on two threads: another placement in every sample taken 200 ms apart).
 */
static bool balance(struct vre_worker *w)
{
	struct vre_engine *e = w->engine;
	uint32_t n, hi = __atomic_load_n(&e->devices_hi, __ATOMIC_ACQUIRE);
	struct vre_worker *all = vre_workers(e, &n);

	for (uint32_t k = 0; k < n; k++) {
		if (k == w->index || __atomic_load_n(&all[k].busy_devices, __ATOMIC_ACQUIRE) < 2)
			continue;
		for (uint32_t i = 0; i < hi; i++) {
			struct vre_device *d = &e->devices[i];

			if (!__atomic_load_n(&d->open, __ATOMIC_ACQUIRE) ||
			    __atomic_load_n(&d->owner, __ATOMIC_ACQUIRE) != k || !__atomic_load_n(&d->worked, __ATOMIC_ACQUIRE))
				continue;
			if (!device_trylock(d))
				continue;
			if (d->open && d->owner == k && w->ctx.now - d->moved_at >= VRE_MOVE_EVERY_NS) {
				d->moved_at = w->ctx.now;
				__atomic_store_n(&d->owner, w->index, __ATOMIC_RELEASE);
				__atomic_sub_fetch(&all[k].busy_devices, 1, __ATOMIC_ACQ_REL);
				device_unlock(d);
				stat_add(&w->stats.devices_taken, 1);
				return true;
			}
			device_unlock(d);
		}
	}
	return false;
}

/* A thread with two or more busy devices wakes a parked one, which may then take one (balance). */
static void wake_idle(struct vre_worker *w)
{
	uint32_t n;
	struct vre_worker *all = vre_workers(w->engine, &n);

	if (__atomic_load_n(&w->busy_devices, __ATOMIC_ACQUIRE) < 2)
		return;
	for (uint32_t k = 0; k < n; k++) {
		if (k != w->index && __atomic_load_n(&all[k].sleeping, __ATOMIC_ACQUIRE) &&
		    __atomic_exchange_n(&all[k].sleeping, 0, __ATOMIC_ACQ_REL)) {  /* one kick per sleep */
			(void)eventfd_write(all[k].kick_fd, 1);
			return;
		}
	}
}

/* Whether any of fds[from, to) is ready. */
static bool any_ready(const struct pollfd *fds, nfds_t from, nfds_t to)
{
	for (nfds_t i = from; i < to; i++) {
		if (fds[i].revents)
			return true;
	}
	return false;
}

/* Parked: sleep until a kick, a guest's wake-up, a packet, the next deadline or the recheck period, whichever comes
 * first. */
static void park_and_sleep(struct vre_worker *w)
{
	struct vre_engine *e = w->engine;
	struct pollfd *fds = w->fds;
	struct timespec wait, *timeout = NULL;
	uint64_t recheck = __atomic_load_n(&e->threads.recheck_ns, __ATOMIC_ACQUIRE);
	uint32_t hi = __atomic_load_n(&e->devices_hi, __ATOMIC_ACQUIRE);
	int64_t deadline, until = -1, slept;
	nfds_t n = 1, sockets;
	eventfd_t drained;
	int ready = -1;

	if (!vre_park_owned(e, w)) {
		stat_add(&w->stats.park_declined, 1);
		return;
	}
	stat_add(&w->stats.parks, 1);
	deadline = vre_next_deadline_owned(e, w);
	fds[0] = (struct pollfd){ .fd = w->kick_fd, .events = POLLIN };
	if (!e->capture) {  /* the sockets do not change while threads run (vre_net_attach) */
		for (uint32_t i = 0; i < e->nrings; i++)
			if (ring_mine(e, w, i))
				fds[n++] = (struct pollfd){ .fd = e->rings[i].fd, .events = POLLIN };
	}
	sockets = n;
	/* Its devices' wake-up eventfds: a guest's kick wakes it here, in one hop, not through the event loop, which
	 * reads them (never read here: one the loop read first wakes it through vre_kick, as before). */
	for (uint32_t i = 0; i < hi && n < w->nfds_room; i++) {
		struct vre_device *d = &e->devices[i];

		if (!__atomic_load_n(&d->open, __ATOMIC_ACQUIRE) || __atomic_load_n(&d->owner, __ATOMIC_ACQUIRE) != w->index)
			continue;
		device_lock_blocking(d);
		if (d->open && d->wake_fd >= 0)
			fds[n++] = (struct pollfd){ .fd = d->wake_fd, .events = POLLIN };
		device_unlock(d);
	}
	if (deadline >= 0) {
		until = deadline - vre_monotonic_ns();
		until = until > 0 ? until : 0;  /* already due: look again at once */
	}
	if (recheck && (until < 0 || (uint64_t)until > recheck))
		until = (int64_t)recheck;
	if (until >= 0) {
		wait = (struct timespec){ .tv_sec = until / 1000000000, .tv_nsec = until % 1000000000 };
		timeout = &wait;
	}
	slept = vre_monotonic_ns();
	__atomic_store_n(&w->sleeping, 1, __ATOMIC_RELEASE);
	if (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE))
		ready = ppoll(fds, n, timeout, NULL);  /* EINTR: a signal; look again like any wake-up */
	__atomic_store_n(&w->sleeping, 0, __ATOMIC_RELEASE);
	stat_add(&w->stats.sleep_ns, (uint64_t)(vre_monotonic_ns() - slept));
	(void)eventfd_read(w->kick_fd, &drained);
	if (ready == 0)
		stat_add(&w->stats.woken_by_time, 1);
	else if (ready > 0)
		stat_add(fds[0].revents ? &w->stats.woken_by_kick : any_ready(fds, 1, sockets) ?
			 &w->stats.woken_by_packet : &w->stats.woken_by_guest, 1);
	vre_unpark_owned(e, w);
}

static void *worker_main(void *arg)
{
	struct vre_worker *w = arg;
	int64_t idle_since = vre_monotonic_ns();

	vre_current_ctx = &w->ctx;
	while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
		uint32_t work = pass(w);
		int64_t idle;

		if (work) {
			wake_idle(w);
			idle_since = vre_monotonic_ns();
			continue;
		}
		idle = vre_monotonic_ns() - idle_since;
		if (idle < (int64_t)w->engine->threads.config.park_after_ns) {
			/* Idle but not parked yet: spin on the core, never yield it. A thread that yields is runnable but
			 * not running while a busy neighbour (a TCG vCPU) has the core, for a whole time slice (ms), with
			 * the parked flag clear, so no poster kicks it: rsockets between TCG guests crawled at ~250
			 * messages/s that way. Spinning, then sleeping when parked, it is woken at once (a waking task
			 * preempts), as the event loop's engine always was. */
			__builtin_ia32_pause();
			continue;
		}
		/* Idle for park_after_ns, not for a moment between a driver's bursts: take a busy device if a thread
		 * has two or more, else park. */
		if (balance(w)) {
			idle_since = vre_monotonic_ns();
			continue;
		}
		park_and_sleep(w);
		idle_since = vre_monotonic_ns();
	}
	vre_current_ctx = NULL;
	return NULL;
}
