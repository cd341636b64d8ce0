// SPDX-License-Identifier: GPL-2.0-only
/*
 * Finding the doorbell region: the device's own VIRTIO shared memory region VRDMA_SHM_DOORBELL (QEMU's
 * vhost-user-rdma-pci, BAR 2, filled by the backend over vhost-user), or, on a QEMU with only the generic
 * vhost-user-device-pci, the ivshmem-plain device (1af4:1110) whose BAR2 header carries the magic and the pairing
 * identifier this virtio device's config space announces.
 */
#include <linux/io.h>
#include <linux/ioport.h>
#include <linux/pci.h>
#include <linux/virtio_config.h>

#include "vrdma.h"

#define IVSHMEM_VENDOR 0x1af4
#define IVSHMEM_DEVICE 0x1110
#define IVSHMEM_BAR 2

static bool vrdma_doorbell_matches(struct vrdma_dev *dev, void __iomem *header)
{
	return readq(header + offsetof(struct vrdma_doorbell_header, magic)) == VRDMA_DOORBELL_MAGIC &&
	       readq(header + offsetof(struct vrdma_doorbell_header, pairing_id)) == dev->pairing_id;
}

/* Undo what pairing took of a candidate: the BAR mapping (if any), the region, the enable. */
static void vrdma_doorbell_release(struct pci_dev *pdev, void __iomem *header)
{
	if (header)
		pci_iounmap(pdev, header);
	pci_release_region(pdev, IVSHMEM_BAR);
	pci_disable_device(pdev);
}

/*
 * The device's shared memory region: -ENODEV when it has none (an older QEMU: pair with an ivshmem device instead);
 * any other error is final.
 */
static int vrdma_doorbell_shm(struct vrdma_dev *dev)
{
	struct virtio_shm_region region;
	u64 size = (u64)dev->doorbell_pages * VRDMA_DOORBELL_PAGE_SIZE;
	u32 pages;

	if (!virtio_get_shm_region(dev->vdev, &region, VRDMA_SHM_DOORBELL))
		return -ENODEV;
	if (region.len < size) {
		dev_err(&dev->vdev->dev, "doorbell region: shared memory region of %llu bytes, config says %u pages\n",
			(unsigned long long)region.len, dev->doorbell_pages);
		return -EINVAL;
	}
	if (!request_mem_region(region.addr, size, "vrdma-doorbell"))
		return -EBUSY;
	dev->db_region = ioremap(region.addr, size);
	if (!dev->db_region) {
		release_mem_region(region.addr, size);
		return -ENOMEM;
	}
	if (!vrdma_doorbell_matches(dev, dev->db_region)) {
		/* The backend maps the region when QEMU connects to it; its log says why it did not. */
		dev_err(&dev->vdev->dev, "doorbell region: shared memory region %d holds no header of this device\n",
			VRDMA_SHM_DOORBELL);
		iounmap(dev->db_region);
		dev->db_region = NULL;
		release_mem_region(region.addr, size);
		return -EPROTO;
	}
	pages = readl(dev->db_region + offsetof(struct vrdma_doorbell_header, num_pages));
	if (pages != dev->doorbell_pages) {
		dev_err(&dev->vdev->dev, "doorbell region: header says %u pages, config %u\n", pages,
			dev->doorbell_pages);
		iounmap(dev->db_region);
		dev->db_region = NULL;
		release_mem_region(region.addr, size);
		return -EINVAL;
	}
	dev->db_header = dev->db_region;
	dev->db_phys = region.addr;
	dev->db_shm_size = size;
	dev_info(&dev->vdev->dev, "doorbell region: shared memory region %d, %u pages\n", VRDMA_SHM_DOORBELL, pages);
	return 0;
}

int vrdma_doorbell_pair(struct vrdma_dev *dev)
{
	struct pci_dev *pdev = NULL;
	void __iomem *header;
	u32 pages;
	int ret;

	ret = vrdma_doorbell_shm(dev);
	if (ret != -ENODEV)
		return ret;
	while ((pdev = pci_get_device(IVSHMEM_VENDOR, IVSHMEM_DEVICE, pdev))) {
		if (pci_resource_len(pdev, IVSHMEM_BAR) < sizeof(struct vrdma_doorbell_header))
			continue;
		ret = pci_enable_device_mem(pdev);
		if (ret)
			continue;
		if (pci_request_region(pdev, IVSHMEM_BAR, "vrdma-doorbell")) {
			pci_disable_device(pdev);
			continue;	/* another vrdma device took it */
		}
		header = pci_iomap_range(pdev, IVSHMEM_BAR, 0, PAGE_SIZE);
		if (header && vrdma_doorbell_matches(dev, header)) {
			pages = readl(header + offsetof(struct vrdma_doorbell_header, num_pages));
			if (pages != dev->doorbell_pages ||
			    (u64)pages * VRDMA_DOORBELL_PAGE_SIZE > pci_resource_len(pdev, IVSHMEM_BAR)) {
				dev_err(&dev->vdev->dev, "doorbell region %s: %u pages, config says %u, BAR holds %llu bytes\n",
					pci_name(pdev), pages, dev->doorbell_pages,
					(unsigned long long)pci_resource_len(pdev, IVSHMEM_BAR));
				vrdma_doorbell_release(pdev, header);
				pci_dev_put(pdev);
				return -EINVAL;
			}
			/* The kernel's queues take slots in whichever pages the device gives context 0. */
			dev->db_region = pci_iomap_range(pdev, IVSHMEM_BAR, 0, (unsigned long)pages * VRDMA_DOORBELL_PAGE_SIZE);
			if (!dev->db_region) {
				vrdma_doorbell_release(pdev, header);
				pci_dev_put(pdev);
				return -ENOMEM;
			}
			dev->db_pdev = pdev;	/* keeps the reference pci_get_device took */
			dev->db_header = header;
			dev->db_phys = pci_resource_start(pdev, IVSHMEM_BAR);
			dev_info(&dev->vdev->dev, "doorbell region: %s, %u pages\n", pci_name(pdev), pages);
			return 0;
		}
		vrdma_doorbell_release(pdev, header);
	}
	dev_err(&dev->vdev->dev, "no ivshmem device carries doorbell region %016llx\n", dev->pairing_id);
	return -ENODEV;
}

void vrdma_doorbell_unpair(struct vrdma_dev *dev)
{
	if (dev->db_shm_size) {
		iounmap(dev->db_region);
		release_mem_region(dev->db_phys, dev->db_shm_size);
		dev->db_region = NULL;
		dev->db_header = NULL;
		dev->db_shm_size = 0;
		return;
	}
	if (!dev->db_pdev)
		return;
	pci_iounmap(dev->db_pdev, dev->db_region);
	dev->db_region = NULL;
	vrdma_doorbell_release(dev->db_pdev, dev->db_header);
	pci_dev_put(dev->db_pdev);
	dev->db_pdev = NULL;
	dev->db_header = NULL;
}
