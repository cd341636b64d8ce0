/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Fault guard: a SIGBUS in memory a VM can take away from under the backend breaks that VM, not the process.
 *
 * The backend maps files that another, untrusted process can truncate: the doorbell region (QEMU opens it by path)
 * and, where the memory backend allows it, guest RAM. An access past the new end of such a file raises SIGBUS at
 * whatever instruction touched it: in libvhost-user's ring reads, in the data engine's copies, in Python. The guard
 * knows the mappings the backend registered, each with an owner number. Its handler replaces the faulting mapping
 * with anonymous memory of the same size (so the access that faulted completes, reading zeros) and counts the
 * fault for the owner; the event loop learns of it through a pipe and closes that owner's device. A SIGBUS at an
 * address the guard does not know is a real bug: the default action runs (a core dump, not a silent recovery).
 *
 * Faults may be taken in any thread (the event loop's, the data engine's); ranges are changed from the event loop's
 * thread only, never while a fault in them can happen (faultguard.c says how).
 *
 * The text between FAULTGUARD-API-BEGIN and FAULTGUARD-API-END is also the cffi declaration (_build.py).
 */
#ifndef VRDMA_FAULTGUARD_H
#define VRDMA_FAULTGUARD_H

#include <stdint.h>

/* FAULTGUARD-API-BEGIN */
#define FG_MAX_RANGES 512
#define FG_MAX_OWNERS 4096

/* Install the SIGBUS handler; faults are announced by a byte on the returned fd (non-blocking), -1 on error. */
int fg_install(void);
/* Guard [start, start + length) for `owner` (any number but 0); 0 on success, -1 when the table is full. */
int fg_add(uint64_t start, uint64_t length, uint32_t owner);
/* Stop guarding every range of `owner`; returns how many ranges went. */
int fg_remove_owner(uint32_t owner);
/* Faults taken in `owner`'s ranges so far, and reset that count. */
uint64_t fg_take_faults(uint32_t owner);
/* Faults in `owner`'s ranges since fg_install (never reset). */
uint64_t fg_faults_total(uint32_t owner);
/* Map `fd` (from offset 0) shared over [start, start + length) again, replacing what is there; 0 or -errno. */
int fg_remap_shared(uint64_t start, uint64_t length, int fd);
/* Empty the wake-up pipe. */
void fg_drain(void);
/* FAULTGUARD-API-END */

#endif /* VRDMA_FAULTGUARD_H */
