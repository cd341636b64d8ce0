// SPDX-License-Identifier: GPL-2.0-only
/*
 * The engine's own thread (vre_thread_start): the data path runs here, beside the backend's event loop, which keeps
 * the control path (commands, vhost-user, the admin socket). They meet at one lock, the engine's: the thread holds
 * it for one pass at a time (every device's turn, at most about a piece of each busy VM: poll.c), and every call the
 * event loop makes takes it, so a command waits for at most one pass, never for a spin or a whole transfer, and no
 * control change (a destroy, a new memory table) ever meets a pass half done. A caller that waits gets the lock at
 * the end of the pass it waits behind: the thread steps aside while anyone waits.
 *
 * Idle for park_after_ns, the thread parks (poll.c's vre_park: the parked slot of every doorbell page, one more
 * look) and sleeps in ppoll(2) on its kick eventfd (vre_kick: a guest's wake-up, a change of deadlines or sockets),
 * the RoCE sockets, until the next deadline (a retry, a moderation timer, a limited VM's bucket) and, while a driver
 * asked for it, at most the recheck period. Events for the model wake the event loop through its eventfd.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* ppoll */
#endif
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "vre.h"

static void *engine_main(void *arg);

void vre_lock(struct vre_engine *e)
{
	__atomic_add_fetch(&e->thread.waiters, 1, __ATOMIC_ACQ_REL);
	pthread_mutex_lock(&e->thread.lock);
	__atomic_sub_fetch(&e->thread.waiters, 1, __ATOMIC_ACQ_REL);
}

void vre_unlock(struct vre_engine *e)
{
	pthread_mutex_unlock(&e->thread.lock);
}

void vre_kick(struct vre_engine *e)
{
	int fd = __atomic_load_n(&e->thread.kick_fd, __ATOMIC_ACQUIRE);

	if (fd >= 0)
		(void)eventfd_write(fd, 1);  /* a counter already non-zero says "look" too */
}

int vre_thread_start(struct vre_engine *e, const struct vre_thread_config *config)
{
	struct vre_thread *t = &e->thread;
	int err;

	if (t->running)
		return vre_fail(e, EBUSY, "the engine's thread is running");
	if (!config->budget || config->events_fd < 0)
		return vre_fail(e, EINVAL, "an engine thread needs a budget and an events fd");
	t->config = *config;
	t->stop = 0;
	t->events_told = false;
	t->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (t->kick_fd < 0)
		return vre_fail(e, errno, "no eventfd for the engine's thread: %s", strerror(errno));
	err = pthread_create(&t->id, NULL, engine_main, e);
	if (err) {
		close(t->kick_fd);
		t->kick_fd = -1;
		return vre_fail(e, err, "cannot start the engine's thread: %s", strerror(err));
	}
	t->running = true;
	return 0;
}

/* Not under the lock: the thread takes it to finish its pass. */
void vre_thread_stop(struct vre_engine *e)
{
	struct vre_thread *t = &e->thread;

	if (!t->running)
		return;
	__atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
	vre_kick(e);
	pthread_join(t->id, NULL);
	t->running = false;
	close(t->kick_fd);
	__atomic_store_n(&t->kick_fd, -1, __ATOMIC_RELEASE);
	vre_unpark(e);  /* posters need not wake an engine nobody runs: the caller polls now */
}

void vre_thread_recheck(struct vre_engine *e, uint64_t period_ns)
{
	e->thread.recheck_ns = period_ns;
	vre_kick(e);  /* a parked thread sleeps by the old period */
}

void vre_thread_stats(struct vre_engine *e, struct vre_thread_stats *out)
{
	*out = e->thread.stats;
}

/* While a caller waits for the lock, let it have it: the thread's next pass waits for it, not the other way. */
static void step_aside(struct vre_thread *t)
{
	while (__atomic_load_n(&t->waiters, __ATOMIC_ACQUIRE))
		sched_yield();
}

/* One pass under the lock; the events eventfd written once for events the caller has not been told of. */
static uint32_t pass(struct vre_engine *e)
{
	struct vre_thread *t = &e->thread;
	int64_t start = vre_monotonic_ns();
	bool tell;
	uint32_t work;

	if (pthread_mutex_trylock(&t->lock)) {
		t->stats.lock_waits++;
		pthread_mutex_lock(&t->lock);
	}
	work = vre_poll(e, t->config.budget);
	tell = e->ev_head != e->ev_tail && !t->events_told;
	t->events_told |= tell;
	t->stats.passes++;
	if (work) {
		t->stats.work += work;
		t->stats.busy_ns += (uint64_t)(vre_monotonic_ns() - start);
	}
	pthread_mutex_unlock(&t->lock);
	if (tell)
		(void)eventfd_write(t->config.events_fd, 1);
	return work;
}

/* Parked: sleep until a kick, a packet, the next deadline or the recheck period, whichever comes first. */
static void park_and_sleep(struct vre_engine *e)
{
	struct vre_thread *t = &e->thread;
	struct pollfd fds[3] = { { .fd = t->kick_fd, .events = POLLIN } };
	struct timespec wait, *timeout = NULL;
	int64_t deadline, until = -1;
	nfds_t n = 1;
	eventfd_t drained;
	int parked, ready = -1;
	int64_t slept;

	pthread_mutex_lock(&t->lock);
	parked = vre_park(e);
	deadline = vre_next_deadline(e);
	if (parked) {
		t->stats.parks++;
		if (!e->capture) {
			for (int i = 0, fd; i < 2; i++) {
				fd = i ? e->udp6_fd : e->rx_fd;
				if (fd >= 0)
					fds[n++] = (struct pollfd){ .fd = fd, .events = POLLIN };
			}
		}
		if (deadline >= 0) {
			until = deadline - vre_monotonic_ns();
			until = until > 0 ? until : 0;  /* already due: look again at once */
		}
		if (t->recheck_ns && (until < 0 || (uint64_t)until > t->recheck_ns))
			until = (int64_t)t->recheck_ns;
	}
	if (!parked)
		t->stats.park_declined++;
	pthread_mutex_unlock(&t->lock);
	if (!parked)
		return;
	if (until >= 0) {
		wait = (struct timespec){ .tv_sec = until / 1000000000, .tv_nsec = until % 1000000000 };
		timeout = &wait;
	}
	slept = vre_monotonic_ns();
	if (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE))
		ready = ppoll(fds, n, timeout, NULL);
	t->stats.sleep_ns += (uint64_t)(vre_monotonic_ns() - slept);  /* EINTR: a signal; look again like any wake-up */
	(void)eventfd_read(t->kick_fd, &drained);
	pthread_mutex_lock(&t->lock);
	if (ready == 0)
		t->stats.woken_by_time++;
	else if (ready > 0 && (fds[0].revents & POLLIN))
		t->stats.woken_by_kick++;
	else if (ready > 0)
		t->stats.woken_by_packet++;
	vre_unpark(e);
	pthread_mutex_unlock(&t->lock);
}

static void *engine_main(void *arg)
{
	struct vre_engine *e = arg;
	struct vre_thread *t = &e->thread;
	int64_t idle_since = vre_monotonic_ns();

	while (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
		uint32_t work = pass(e);
		int64_t idle;

		step_aside(t);
		if (work) {
			idle_since = vre_monotonic_ns();
			continue;
		}
		idle = vre_monotonic_ns() - idle_since;
		if (idle < (int64_t)t->config.park_after_ns) {
			/* Idle but not parked yet: spin on the core, never yield it. A thread that yields is runnable but
			 * not running while a busy neighbour (a TCG vCPU) has the core, for a whole time slice (ms), with
			 * the parked flag clear, so no poster kicks it: rsockets between TCG guests crawled at ~250
			 * messages/s that way. Spinning, then sleeping when parked, it is woken at once (a waking task
			 * preempts), as the event loop's engine always was. */
			__builtin_ia32_pause();
			continue;
		}
		park_and_sleep(e);
		idle_since = vre_monotonic_ns();
	}
	return NULL;
}
