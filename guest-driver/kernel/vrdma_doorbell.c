// SPDX-License-Identifier: GPL-2.0-only
/*
 * Pairing with the doorbell region: the ivshmem-plain device (1af4:1110) whose BAR2 header carries the magic and
 * the pairing identifier this virtio device's config space announces.
 */
#include <linux/io.h>
#include <linux/pci.h>

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

int vrdma_doorbell_pair(struct vrdma_dev *dev)
{
	struct pci_dev *pdev = NULL;
	void __iomem *header;
	u32 pages;
	int ret;

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
	if (!dev->db_pdev)
		return;
	pci_iounmap(dev->db_pdev, dev->db_region);
	dev->db_region = NULL;
	vrdma_doorbell_release(dev->db_pdev, dev->db_header);
	pci_dev_put(dev->db_pdev);
	dev->db_pdev = NULL;
	dev->db_header = NULL;
}
