// SPDX-License-Identifier: GPL-2.0-only
/* The fault guard (see faultguard.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "faultguard.h"

struct fg_range {
	uintptr_t start;
	uintptr_t length;
	uint32_t owner;           /* 0: free slot */
};

/* Read by the handler in whichever thread faults (the event loop's, the data engine's); written by the event loop's
 * thread: a slot's owner is stored last when it is taken and first when it is freed (release), and read first by the
 * handler (acquire), so the handler never uses a half-written slot. The backend changes the ranges of guest memory
 * only while the engine's thread is held between passes (vhost-user's memory messages), and a VM's ranges go only
 * after its engine device has closed: no fault can be in a range that is changing. */
static struct fg_range ranges[FG_MAX_RANGES];
static uint64_t pending[FG_MAX_OWNERS];  /* atomic: counted in the handler, taken by the event loop */
static uint64_t total[FG_MAX_OWNERS];
static int wake_r = -1, wake_w = -1;

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
	uintptr_t addr = (uintptr_t)info->si_addr;
	int saved_errno = errno;

	(void)context;
	for (unsigned int i = 0; i < FG_MAX_RANGES; i++) {
		struct fg_range *r = &ranges[i];

		uint32_t owner = __atomic_load_n(&r->owner, __ATOMIC_ACQUIRE);

		if (!owner || addr - r->start >= r->length)
			continue;
		/* mmap is a plain system call: safe here. The range stays registered (the owner removes it when it
		 * tears the mapping down); a second fault in it cannot happen, its pages are anonymous now. */
		if (mmap((void *)r->start, r->length, PROT_READ | PROT_WRITE,
			 MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED)
			break;
		__atomic_add_fetch(&pending[owner], 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&total[owner], 1, __ATOMIC_RELAXED);
		if (write(wake_w, "!", 1) < 0) {
			/* a full pipe already says "look" */
		}
		errno = saved_errno;
		return;
	}
	/* Not ours, or unrecoverable: the default action, on return, re-runs the access and ends the process. */
	signal(sig, SIG_DFL);
	errno = saved_errno;
}

int fg_install(void)
{
	struct sigaction sa;
	int fds[2];

	if (wake_r >= 0)
		return wake_r;
	if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0)
		return -1;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, NULL) < 0) {
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	wake_r = fds[0];
	wake_w = fds[1];
	return wake_r;
}

int fg_add(uint64_t start, uint64_t length, uint32_t owner)
{
	long page = sysconf(_SC_PAGESIZE);

	if (!owner || owner >= FG_MAX_OWNERS || !length || start % (uint64_t)page || start + length < start)
		return -1;
	for (unsigned int i = 0; i < FG_MAX_RANGES; i++) {
		if (!ranges[i].owner) {
			ranges[i].start = (uintptr_t)start;  /* a free slot: the handler skips it until owner is set */
			/* the replacement mapping covers whole pages */
			ranges[i].length = (uintptr_t)((length + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page);
			__atomic_store_n(&ranges[i].owner, owner, __ATOMIC_RELEASE);
			return 0;
		}
	}
	return -1;
}

int fg_remove_owner(uint32_t owner)
{
	int removed = 0;

	if (!owner)
		return 0;
	for (unsigned int i = 0; i < FG_MAX_RANGES; i++) {
		if (ranges[i].owner == owner) {
			__atomic_store_n(&ranges[i].owner, 0, __ATOMIC_RELEASE);
			removed++;
		}
	}
	return removed;
}

uint64_t fg_take_faults(uint32_t owner)
{
	uint64_t n;

	if (owner >= FG_MAX_OWNERS)
		return 0;
	n = __atomic_exchange_n(&pending[owner], 0, __ATOMIC_RELAXED);
	return n;
}

uint64_t fg_faults_total(uint32_t owner)
{
	return owner < FG_MAX_OWNERS ? __atomic_load_n(&total[owner], __ATOMIC_RELAXED) : 0;
}

int fg_remap_shared(uint64_t start, uint64_t length, int fd)
{
	if (mmap((void *)(uintptr_t)start, (size_t)length, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_SHARED, fd, 0) ==
	    MAP_FAILED)
		return -errno;
	return 0;
}

void fg_drain(void)
{
	char buf[64];

	while (wake_r >= 0 && read(wake_r, buf, sizeof(buf)) > 0) {
	}
}
