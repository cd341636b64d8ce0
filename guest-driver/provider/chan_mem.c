// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * The memory a container's device reaches (channel.c): memfds shared with the backend, each placed in this
 * process's window of device addresses. Rings and page lists come from an arena of them, handed out first-fit in
 * pages; memory an application registers is remapped, at the same address, onto a memfd of its own
 * (vrdma_chan_share), as FreeFlow does, and back to private memory when its last registration goes.
 */
#define _GNU_SOURCE
#include <fcntl.h>

#include "channel.h"

#define CHUNK_MIN (1u << 20)       /* the arena's first memfd; each next one doubles, up to CHUNK_MAX */
#define CHUNK_MAX (64u << 20)
#define MAPS_LINE 512

/* A memfd of `bytes`, sealed so that neither side can shrink it under the other; mapped here at `at` (or anywhere),
 * shared with the device: its device address. Call with the lock held. */
static int share_memfd(struct vrdma_channel *chan, const char *name, size_t bytes, int *fd_out, uint64_t *dev)
{
	struct vrdma_chan_add_memory req = { .size = htole64(bytes) };
	struct vrdma_chan_memory_resp resp;
	int fd, ret;

	if (chan->regions >= chan->max_regions)
		return ENOSPC;
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return errno;
	if (ftruncate(fd, (off_t)bytes) || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)) {
		ret = errno;
		close(fd);
		return ret;
	}
	ret = vrdma_chan_request(chan, VRDMA_CHAN_ADD_MEMORY, (const uint8_t *)&req + sizeof(req.hdr),
			   sizeof(req) - sizeof(req.hdr), &fd, 1, &resp, sizeof(resp));
	if (!ret) {
		*dev = le64toh(resp.addr);
		if (*dev < chan->window_base || *dev - chan->window_base > chan->window_size - bytes)
			ret = EPROTO;  /* not in the window the device gave */
	}
	if (ret) {
		close(fd);
		return ret;
	}
	chan->regions++;
	*fd_out = fd;
	return 0;
}

static void unshare_memfd(struct vrdma_channel *chan, uint64_t dev)
{
	struct vrdma_chan_remove_memory req = { .addr = htole64(dev) };
	struct vrdma_chan_memory_resp resp;

	if (vrdma_chan_request(chan, VRDMA_CHAN_REMOVE_MEMORY, (const uint8_t *)&req + sizeof(req.hdr),
			 sizeof(req) - sizeof(req.hdr), NULL, 0, &resp, sizeof(resp)) == 0)
		chan->regions--;
}

static struct chan_chunk *chunk_new(struct vrdma_channel *chan, size_t pages)
{
	size_t bytes = CHUNK_MIN;
	struct chan_chunk *chunk, *last;
	int fd;

	for (last = chan->chunks; last && last->next; last = last->next)
		;
	if (last && last->pages * VRDMA_PAGE_SIZE < CHUNK_MAX)
		bytes = last->pages * VRDMA_PAGE_SIZE * 2;
	while (bytes < pages * VRDMA_PAGE_SIZE)
		bytes *= 2;
	chunk = calloc(1, sizeof(*chunk));
	if (!chunk)
		return NULL;
	chunk->pages = bytes / VRDMA_PAGE_SIZE;
	chunk->used = calloc(chunk->pages, 1);
	if (!chunk->used || share_memfd(chan, "vrdma-rings", bytes, &fd, &chunk->dev)) {
		free(chunk->used);
		free(chunk);
		return NULL;
	}
	chunk->va = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);  /* (the mapping keeps it) */
	if (chunk->va == MAP_FAILED) {
		unshare_memfd(chan, chunk->dev);
		free(chunk->used);
		free(chunk);
		return NULL;
	}
	if (last)
		last->next = chunk;
	else
		chan->chunks = chunk;
	return chunk;
}

int vrdma_chan_buf_alloc(struct vrdma_channel *chan, struct vrdma_buf *buf, size_t size)
{
	size_t pages = page_align(size) / VRDMA_PAGE_SIZE;
	struct chan_chunk *chunk;

	pthread_mutex_lock(&chan->lock);
	for (chunk = chan->chunks;; chunk = chunk->next) {
		if (!chunk)
			chunk = chunk_new(chan, pages);
		if (!chunk) {
			pthread_mutex_unlock(&chan->lock);
			return ENOMEM;
		}
		for (size_t first = 0, run = 0; first + run < chunk->pages;) {
			if (chunk->used[first + run]) {
				first += run + 1;
				run = 0;
			} else if (++run == pages) {
				memset(chunk->used + first, 1, pages);
				pthread_mutex_unlock(&chan->lock);
				buf->addr = chunk->va + first * VRDMA_PAGE_SIZE;
				buf->size = pages * VRDMA_PAGE_SIZE;
				buf->dev = chunk->dev + first * VRDMA_PAGE_SIZE;
				buf->chan = chan;
				memset(buf->addr, 0, buf->size);
				return 0;
			}
		}
	}
}

void vrdma_chan_buf_free(struct vrdma_buf *buf)
{
	struct vrdma_channel *chan = buf->chan;

	pthread_mutex_lock(&chan->lock);
	for (struct chan_chunk *chunk = chan->chunks; chunk; chunk = chunk->next) {
		if ((uint8_t *)buf->addr >= chunk->va && (uint8_t *)buf->addr < chunk->va + chunk->pages * VRDMA_PAGE_SIZE) {
			memset(chunk->used + ((uint8_t *)buf->addr - chunk->va) / VRDMA_PAGE_SIZE, 0,
			       buf->size / VRDMA_PAGE_SIZE);
			break;
		}
	}
	pthread_mutex_unlock(&chan->lock);
	buf->addr = NULL;
}

/*
 * The page list of `npages` consecutive device pages from `first`: one page of entries (levels 1) or a directory
 * of them (levels 2), in `scratch` (freed by the caller once the command that names it is done).
 */
int vrdma_chan_pages(struct vrdma_context *ctx, uint64_t first, uint32_t npages, struct vrdma_page_list *list,
		     struct vrdma_buf *scratch)
{
	uint32_t lists = (npages + VRDMA_PBL_ENTRIES - 1) / VRDMA_PBL_ENTRIES;
	bool two = lists > 1;
	uint64_t *entries;
	int ret;

	if (!npages || lists > VRDMA_PBL_ENTRIES)
		return EINVAL;
	ret = vrdma_chan_buf_alloc(ctx->chan, scratch, (size_t)(lists + two) * VRDMA_PAGE_SIZE);
	if (ret)
		return ret;
	entries = (uint64_t *)((uint8_t *)scratch->addr + (two ? VRDMA_PAGE_SIZE : 0));
	for (uint32_t i = 0; i < npages; i++)
		entries[i] = htole64(first + (uint64_t)i * VRDMA_PAGE_SIZE);
	if (two) {
		uint64_t *dir = scratch->addr;

		for (uint32_t i = 0; i < lists; i++)
			dir[i] = htole64(scratch->dev + (uint64_t)(i + 1) * VRDMA_PAGE_SIZE);
	}
	list->addr = htole64(scratch->dev);
	list->npages = htole32(npages);
	list->levels = htole32(two ? 2 : 1);
	return 0;
}

/*
 * Whether [start, end) is, as /proc/self/maps says, readable and either (`ours` false) this process's private
 * anonymous memory (heap, stack, anonymous mmap) or (`ours` true) a registration's memfd that vrdma_chan_share
 * mapped there; each piece's protection into `prot` (from `from`, at most `max` pieces), their count into `*n`.
 * Other memory (a file mapping, shared memory) cannot be remapped without changing what it is: refused.
 */
static int mapped_as(uintptr_t start, uintptr_t end, bool ours, uintptr_t *from, int *prot, int max, int *n)
{
	char line[MAPS_LINE];
	uintptr_t covered = start;
	FILE *maps = fopen("/proc/self/maps", "re");

	*n = 0;
	if (!maps)
		return errno;
	while (covered < end && fgets(line, sizeof(line), maps)) {
		unsigned long lo, hi;
		char perms[5], path[MAPS_LINE] = "";
		bool anonymous;

		if (sscanf(line, "%lx-%lx %4s %*s %*s %*s %511[^\n]", &lo, &hi, perms, path) < 3 || hi <= covered)
			continue;
		anonymous = !path[0] || !strcmp(path, "[heap]") || !strcmp(path, "[stack]") || !strncmp(path, "[anon", 5);
		if (lo > covered || perms[0] != 'r' || *n == max ||
		    (ours ? perms[3] != 's' || strncmp(path, "/memfd:vrdma-mr", 15) : perms[3] != 'p' || !anonymous))
			break;
		from[*n] = covered;
		prot[(*n)++] = PROT_READ | (perms[1] == 'w' ? PROT_WRITE : 0);
		covered = hi < end ? hi : end;
	}
	fclose(maps);
	return covered >= end ? 0 : EFAULT;
}

/* The protection each piece had, back on the range (a remapping made it all read-write). */
static void restore_prot(const uintptr_t *from, const int *prot, int pieces, uintptr_t end)
{
	for (int i = 0; i < pieces; i++) {
		uintptr_t to = i + 1 < pieces ? from[i + 1] : end;

		if (!(prot[i] & PROT_WRITE))
			mprotect((void *)from[i], to - from[i], prot[i]);
	}
}

/*
 * Application memory [addr, addr + length) made shareable with the device: its pages remapped, at the same
 * address and with the same contents and protection, onto a memfd the device is given (or the memfd of an earlier
 * registration that holds the whole range). Its first page's device address into `dev`, a handle for unsharing
 * into `region`.
 */
int vrdma_chan_share(struct vrdma_context *ctx, void *addr, size_t length, uint64_t *dev, void **region)
{
	struct vrdma_channel *chan = ctx->chan;
	uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(VRDMA_PAGE_SIZE - 1);
	uintptr_t end = ((uintptr_t)addr + length + VRDMA_PAGE_SIZE - 1) & ~(uintptr_t)(VRDMA_PAGE_SIZE - 1);
	size_t bytes = end - start;
	struct chan_share *share;
	uintptr_t from[64];
	int prot[64], pieces, fd, ret;
	void *copy;

	if (!length || end < start)
		return EINVAL;
	pthread_mutex_lock(&chan->lock);
	for (share = chan->shares; share; share = share->next) {
		if (start >= share->start && end <= share->end) {
			share->refs++;
			*dev = share->dev + (start - share->start);
			*region = share;
			pthread_mutex_unlock(&chan->lock);
			return 0;
		}
		if (start < share->end && end > share->start) {
			pthread_mutex_unlock(&chan->lock);
			verbs_err(&ctx->ibv_ctx, "vrdma: %#lx+%zu overlaps a registration it does not lie within\n",
				  (unsigned long)start, bytes);
			return EINVAL;
		}
	}
	ret = mapped_as(start, end, false, from, prot, 64, &pieces);
	if (ret) {
		pthread_mutex_unlock(&chan->lock);
		verbs_err(&ctx->ibv_ctx, "vrdma: %#lx+%zu is not private anonymous readable memory (heap, stack, "
			  "anonymous mmap): a container's device cannot share it\n", (unsigned long)start, bytes);
		return EFAULT;
	}
	share = calloc(1, sizeof(*share));
	ret = share ? share_memfd(chan, "vrdma-mr", bytes, &fd, &share->dev) : ENOMEM;
	if (ret)
		goto err_free;
	copy = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (copy == MAP_FAILED) {
		ret = errno;
		goto err_unshare;
	}
	memcpy(copy, (void *)start, bytes);
	munmap(copy, bytes);
	if (mmap((void *)start, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
		ret = errno;  /* (the range is as it was: a failed MAP_FIXED leaves the old mapping) */
		goto err_unshare;
	}
	restore_prot(from, prot, pieces, end);
	share->start = start;
	share->end = end;
	share->fd = fd;
	share->refs = 1;
	share->next = chan->shares;
	chan->shares = share;
	*dev = share->dev;
	*region = share;
	pthread_mutex_unlock(&chan->lock);
	return 0;

err_unshare:
	unshare_memfd(chan, share->dev);
	close(fd);
err_free:
	free(share);
	pthread_mutex_unlock(&chan->lock);
	return ret;
}

/*
 * The last registration of a shared range is gone: its pages become private anonymous memory again (same address,
 * same contents), and the device forgets the memfd. A range the application unmapped meanwhile is not mapped back.
 */
void vrdma_chan_unshare(struct vrdma_context *ctx, void *region)
{
	struct vrdma_channel *chan = ctx->chan;
	struct chan_share *share = region, **link;
	size_t bytes = share->end - share->start;
	uintptr_t from[64];
	int prot[64], pieces;
	void *copy;

	pthread_mutex_lock(&chan->lock);
	if (--share->refs) {
		pthread_mutex_unlock(&chan->lock);
		return;
	}
	for (link = &chan->shares; *link != share; link = &(*link)->next)
		;
	*link = share->next;
	if (!mapped_as(share->start, share->end, true, from, prot, 64, &pieces)) {
		copy = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (copy != MAP_FAILED) {
			memcpy(copy, (void *)share->start, bytes);
			if (mremap(copy, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)share->start) == MAP_FAILED)
				munmap(copy, bytes);
			else
				restore_prot(from, prot, pieces, share->end);
		}
	}
	unshare_memfd(chan, share->dev);
	close(share->fd);
	free(share);
	pthread_mutex_unlock(&chan->lock);
}

