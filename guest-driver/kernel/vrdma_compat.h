/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The kernel interfaces vrdma.ko meets differently on the guest kernels it supports, from Debian 12's 6.1 to the
 * newest kernel Debian carries (docs/guest-driver.md lists the ones every test run builds and boots). Every kernel
 * version check of the driver is in this file and vrdma_compat.c, nowhere else: the rest of the driver is written
 * once, against the functions and entry points named here.
 *
 * Where the first release with a change is known (its merge window), the check is on LINUX_VERSION_CODE. Where a
 * change landed between two kernels this project can build against and the exact release is not, Kbuild probes the
 * headers instead (VRDMA_HAVE_*), which is exact for every kernel.
 */
#ifndef VRDMA_COMPAT_H
#define VRDMA_COMPAT_H

#include <linux/mm.h>
#include <linux/version.h>
#include <linux/virtio_config.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>

/*
 * 6.11 gave virtio_find_vqs() one array of struct virtqueue_info instead of the parallel callback and name arrays.
 * Before it, the driver's table is split into the two arrays the old call takes.
 */
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 11, 0)
struct virtqueue_info {
	const char *name;
	vq_callback_t *callback;
	bool ctx;
};
#endif
int vrdma_find_vqs(struct virtio_device *vdev, unsigned int nvqs, struct virtqueue *vqs[],
		   struct virtqueue_info vqs_info[]);

/* cpuid(): in <asm/processor.h> on 6.1, <asm/cpuid.h> later, <asm/cpuid/api.h> since the x86 CPUID rework (the
 * headers themselves are probed: exact for every kernel). */
#ifdef CONFIG_X86
#if __has_include(<asm/cpuid/api.h>)
#include <asm/cpuid/api.h>
#elif __has_include(<asm/cpuid.h>)
#include <asm/cpuid.h>
#else
#include <asm/processor.h>
#endif
#endif

/* Pinning a user buffer: ib_umem_get() became ib_umem_get_va() (Kbuild's probe; between 7.0 and 7.2). */
static inline struct ib_umem *vrdma_umem_get(struct ib_device *ibdev, unsigned long addr, size_t size, int access)
{
#ifdef VRDMA_HAVE_IB_UMEM_GET_VA
	return ib_umem_get_va(ibdev, addr, size, access);
#else
	return ib_umem_get(ibdev, addr, size, access);
#endif
}

/*
 * The n-th page after a scatterlist entry's first. The pages of one entry are contiguous; nth_page() went away
 * (6.18) once the kernel guaranteed that such pages are contiguous in the memory map too.
 */
static inline struct page *vrdma_sg_page(struct scatterlist *sg, unsigned long n)
{
#ifdef nth_page
	return nth_page(sg_page(sg), n);
#else
	return sg_page(sg) + n;
#endif
}

/*
 * Entry points of struct ib_device_ops whose arguments changed. The driver implements each once (vrdma.h); these
 * adapt them to the running kernel's signature and are what vrdma_verbs.c's table names.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 11, 0)
/* 6.11: create_cq is given the whole uverbs attribute bundle (NULL for a kernel consumer's CQ), not the udata. */
int vrdma_ib_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr, struct uverbs_attr_bundle *attrs);
#else
int vrdma_ib_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr, struct ib_udata *udata);
#endif

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
/* 6.13: counters bind and unbind per port (optional counters); vrdma has one port. */
int vrdma_ib_counter_bind_qp(struct rdma_counter *counter, struct ib_qp *ibqp, u32 port);
int vrdma_ib_counter_unbind_qp(struct ib_qp *ibqp, u32 port);
#else
int vrdma_ib_counter_bind_qp(struct rdma_counter *counter, struct ib_qp *ibqp);
int vrdma_ib_counter_unbind_qp(struct ib_qp *ibqp);
#endif

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 17, 0)
/* 6.17: reg_user_mr takes a DMA handle (TPH steering hints); vrdma's device has no use for one and refuses it. */
struct ib_mr *vrdma_ib_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length, u64 virt, int access,
				   struct ib_dmah *dmah, struct ib_udata *udata);
#else
struct ib_mr *vrdma_ib_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length, u64 virt, int access,
				   struct ib_udata *udata);
#endif

#endif /* VRDMA_COMPAT_H */
