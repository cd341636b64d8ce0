"""cffi (API mode) build of QEMU's libvhost-user together with vrdma's glue: `python -m vrdma.vhost_user._build`.

libvhost-user is compiled from ``subprojects/libvhost-user`` of the QEMU source tree that `make qemu` keeps
(the same pinned version as the QEMU the guests run), found through ``VRDMA_LIBVHOST_USER_DIR`` or the checkout's
``build/products.json``. The compiled module lands next to this file as ``_libvhost_user*.so``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent

CDEF = r"""
typedef struct VuDev VuDev;
typedef struct VuVirtq VuVirtq;

typedef struct VhostUserMsg VhostUserMsg;

typedef void (*vu_watch_cb)(VuDev *dev, int condition, void *data);
typedef void (*vu_queue_handler_cb)(VuDev *dev, int qidx);

typedef struct VuDevIface {
    uint64_t (*get_features)(VuDev *dev);
    void (*set_features)(VuDev *dev, uint64_t features);
    uint64_t (*get_protocol_features)(VuDev *dev);
    void (*set_protocol_features)(VuDev *dev, uint64_t features);
    int (*process_msg)(VuDev *dev, VhostUserMsg *vmsg, int *do_reply);
    void (*queue_set_started)(VuDev *dev, int qidx, bool started);
    bool (*queue_is_processed_in_order)(VuDev *dev, int qidx);
    int (*get_config)(VuDev *dev, uint8_t *config, uint32_t len);
    int (*set_config)(VuDev *dev, const uint8_t *data, uint32_t offset, uint32_t size, uint32_t flags);
    int (*get_shared_object)(VuDev *dev, const unsigned char *uuid);
} VuDevIface;

struct iovec { void *iov_base; size_t iov_len; };

typedef struct VuVirtqElement {
    unsigned int index;
    unsigned int out_num;
    unsigned int in_num;
    struct iovec *in_sg;
    struct iovec *out_sg;
} VuVirtqElement;

typedef struct VrdmaVu {
    VuDev dev;
    void *handle;
    ...;
} VrdmaVu;

typedef struct VuDevRegion {
    uint64_t gpa;
    uint64_t size;
    uint64_t qva;
    uint64_t mmap_offset;
    uint64_t mmap_addr;
} VuDevRegion;

struct VuDev {
    int sock;
    uint32_t nregions;
    VuDevRegion *regions;
    uint64_t features;
    uint64_t protocol_features;
    bool broken;
    uint16_t max_queues;
    ...;
};

@VrdmaQueueState@
bool vrdma_vu_queue_state(VrdmaVu *vu, uint16_t index, VrdmaQueueState *out);
int vrdma_vu_backend_fd(VrdmaVu *vu);

bool vrdma_vu_init(VrdmaVu *vu, uint16_t max_queues, int sock, void *handle, const VuDevIface *iface);
int vrdma_vu_dispatch(VrdmaVu *vu, uint32_t request, uint32_t flags, const uint8_t *payload, uint32_t size,
                      const int *fds, int nfds);
int vrdma_vu_shmem_map(VrdmaVu *vu, uint8_t shmid, uint64_t fd_offset, uint64_t shm_offset, uint64_t len,
                       uint64_t flags, int fd);
void vrdma_call_watch(vu_watch_cb cb, VuDev *dev, int condition, void *data);
int vrdma_vu_kick_fd(VrdmaVu *vu, uint16_t index);
bool vrdma_vu_queue_ready(VrdmaVu *vu, uint16_t index);
void vrdma_log_mark(uint8_t *bits, uint64_t bytes, uint64_t gpa, uint64_t len);
void vrdma_vu_log_used(VrdmaVu *vu, uint16_t index, uint8_t *bits, uint64_t bytes);
size_t vrdma_payload_size(void);
int vrdma_max_fds(void);

void vu_deinit(VuDev *dev);
VuVirtq *vu_get_queue(VuDev *dev, int qidx);
void vu_set_queue_handler(VuDev *dev, VuVirtq *vq, vu_queue_handler_cb handler);
bool vu_queue_enabled(VuDev *dev, VuVirtq *vq);
bool vu_queue_started(const VuDev *dev, const VuVirtq *vq);
void *vu_queue_pop(VuDev *dev, VuVirtq *vq, size_t sz);
void vu_queue_push(VuDev *dev, VuVirtq *vq, const VuVirtqElement *elem, unsigned int len);
void vu_queue_notify(VuDev *dev, VuVirtq *vq);
void vu_config_change_msg(VuDev *dev);
const char *vu_request_to_string(unsigned int req);
void free(void *ptr);

extern "Python" void vrdma_panic(VuDev *dev, const char *err);
extern "Python" void vrdma_set_watch(VuDev *dev, int fd, int condition, vu_watch_cb cb, void *data);
extern "Python" void vrdma_remove_watch(VuDev *dev, int fd);
extern "Python" uint64_t vrdma_get_features(VuDev *dev);
extern "Python" void vrdma_set_features(VuDev *dev, uint64_t features);
extern "Python" uint64_t vrdma_get_protocol_features(VuDev *dev);
extern "Python" void vrdma_set_protocol_features(VuDev *dev, uint64_t features);
extern "Python" void vrdma_queue_set_started(VuDev *dev, int qidx, bool started);
extern "Python" int vrdma_get_config(VuDev *dev, uint8_t *config, uint32_t len);
extern "Python" void vrdma_queue_handler(VuDev *dev, int qidx);
"""



def _declared_in_glue(name: str) -> str:
    """The typedef of struct ``name`` as _glue.h declares it, for the cdef: declared once, in the header the C side
    compiles with (cffi's parser takes its comments)."""
    match = re.search(rf"typedef struct {name} \{{.*?\}} {name};", (HERE / "_glue.h").read_text(), re.S)
    if match is None:
        raise RuntimeError(f"_glue.h declares no struct {name}")
    return match.group(0)


CDEF = CDEF.replace("@VrdmaQueueState@", _declared_in_glue("VrdmaQueueState"))

PRELUDE = r"""
#include <stdlib.h>
#include <sys/uio.h>
#include "_glue.h"
static void vrdma_panic(VuDev *dev, const char *err);
static void vrdma_set_watch(VuDev *dev, int fd, int condition, vu_watch_cb cb, void *data);
static void vrdma_remove_watch(VuDev *dev, int fd);
"""


def libvhost_user_dir() -> Path:
    env = os.environ.get("VRDMA_LIBVHOST_USER_DIR")
    if env:
        return Path(env)
    sys.path.insert(0, str(HERE.parents[1]))
    from vrdma.buildchain.cache import product

    return Path(product("qemu")["source_dir"]) / "subprojects" / "libvhost-user"


def make_ffi() -> cffi.FFI:
    lvu = libvhost_user_dir()
    if not (lvu / "libvhost-user.c").is_file():
        raise SystemExit(f"libvhost-user source not found in {lvu}: run `make qemu` first "
                         "(or set VRDMA_LIBVHOST_USER_DIR)")
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    # One translation unit: libvhost-user.c is included (no separate source file, so nothing outside the project
    # is named to setuptools, which refuses such paths), then the glue, as text, because the extern "Python"
    # callbacks it hands to vu_init are static functions cffi defines in this same unit.
    glue = (HERE / "_glue.c").read_text().replace('#include "_glue.h"', "")
    ffi.set_source(
        "vrdma.vhost_user._libvhost_user",
        '#include "libvhost-user.c"\n' + PRELUDE + glue,
        include_dirs=[str(HERE), str(lvu), str(lvu / "include")],
        define_macros=[("_GNU_SOURCE", None)],
        extra_compile_args=["-O2", "-Wno-unused-function"],
    )
    return ffi


def main() -> None:
    sys.path.insert(0, str(HERE.parents[1]))
    from vrdma._cffi_inplace import compile_in_place, inputs_key

    lvu = libvhost_user_dir()
    # Everything the compiled module depends on: glue, this recipe, libvhost-user's source.
    key = inputs_key([HERE / "_glue.c", HERE / "_glue.h", Path(__file__), lvu / "libvhost-user.c",
                      lvu / "libvhost-user.h"])
    compile_in_place(make_ffi(), HERE, "_libvhost_user", key, "libvhost-user binding")


if __name__ == "__main__":
    main()
