/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The engine's threads and their locks (lock.c: the locks, each thread's context, waking a thread; thread.c: the
 * threads; poll.c: a pass over one thread's devices). Part of vre.h, which includes it before struct vre_engine.
 */
#ifndef VRDMA_ENGINE_THREADS_H
#define VRDMA_ENGINE_THREADS_H

struct vre_engine;
struct vre_device;

/* A device changes thread at most this often (struct vre_device.moved_at): two senders on two threads do not toss
 * their receiver between them (req.c's follow), and threads whose drivers come and go in bursts do not toss busy
 * devices between them (thread.c's balance), each move costing the device's cache lines. */
#define VRE_MOVE_EVERY_NS 10000000

/* One of the engine's threads (thread.c): it runs the devices it owns (struct vre_device.owner). */
struct vre_worker {
	struct vre_engine *engine;
	uint32_t index;
	pthread_t id;
	bool started;
	uint32_t stop;            /* atomic: the thread ends at its next pass */
	int kick_fd;              /* eventfd: vre_kick wakes it when parked */
	int32_t cpu;              /* the CPU it is pinned to, -1: any */
	uint32_t busy_devices;    /* atomic: devices that had work in its last pass (what balance() looks at) */
	uint32_t sleeping;        /* atomic: parked and asleep (wake_idle kicks only such a thread) */
	struct pollfd *fds;       /* what it sleeps on: its kick, its rings, its devices' wake fds */
	uint32_t nfds_room;
	struct vre_thread_stats stats;  /* its own; read (racily, they are statistics) by vre_thread_stats */
	struct vre_ctx ctx;
};

/* The engine's threads and the locks they share with their callers (thread.c). */
struct vre_threads {
	struct vre_worker *workers;
	uint32_t count;           /* 0: none running, the caller polls */
	struct vre_thread_config config;
	uint64_t recheck_ns;      /* atomic */
	bool events_told;         /* events_fd was written since the caller last took events (under ev_lock) */
	uint32_t events_posted;   /* atomic: events were posted since a thread last looked (thread.c's tell_events) */
	pthread_mutex_t ev_lock;  /* the event ring's: any thread posts, the caller takes */
	pthread_mutex_t net_lock; /* recursive: the packets waiting to go, the network counters' writers */
	pthread_mutex_t gid_lock; /* recursive: the GID index (changed under every lock, read under this one) */
};

/* A thread's statistic counted (vre_thread_stats reads them from another thread). */
static inline void stat_add(uint64_t *field, uint64_t n)
{
	__atomic_fetch_add(field, n, __ATOMIC_RELAXED);
}

VRE_FN struct vre_worker *vre_workers(struct vre_engine *e, uint32_t *count);
VRE_FN int vre_locks_init(struct vre_engine *e);
VRE_FN void vre_locks_destroy(struct vre_engine *e);
VRE_FN bool device_trylock(struct vre_device *d);
VRE_FN void device_lock_blocking(struct vre_device *d);
VRE_FN void device_unlock(struct vre_device *d);
VRE_FN void net_lock(struct vre_engine *e);
VRE_FN void net_unlock(struct vre_engine *e);
VRE_FN void gid_lock(struct vre_engine *e);
VRE_FN void gid_unlock(struct vre_engine *e);
VRE_FN void events_lock(struct vre_engine *e);
VRE_FN void events_unlock(struct vre_engine *e);
VRE_FN uint32_t vre_new_owner(struct vre_engine *e, uint32_t dev);
VRE_FN void vre_kick_sleeping(struct vre_engine *e, uint32_t dev);
/* A pass, parking, unparking and the next deadline over thread w's devices, or every device (w NULL). */
VRE_FN uint32_t vre_poll_owned(struct vre_engine *e, struct vre_worker *w, uint32_t budget);
VRE_FN int vre_park_owned(struct vre_engine *e, struct vre_worker *w);
VRE_FN void vre_unpark_owned(struct vre_engine *e, struct vre_worker *w);
VRE_FN int64_t vre_next_deadline_owned(struct vre_engine *e, struct vre_worker *w);

#endif /* VRDMA_ENGINE_THREADS_H */
