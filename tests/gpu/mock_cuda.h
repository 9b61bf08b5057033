/*
 * A stand-in CUDA driver for testing src/gpu/gpu_cuda.c on machines without a GPU (tests/gpu/mock_cuda.c,
 * built as libcuda.so.1). "Device memory" is host memory: cuMem allocations are memfds (so exporting them
 * as file descriptors really crosses processes), cuMemAlloc allocations are POSIX shared memory (so legacy
 * IPC handles do too). Its environment knobs: MOCK_CUDA_DEVICES (default 2; 0: cuInit reports no device),
 * MOCK_CUDA_NO_VMM (set: no cuMem support, so allocations fall back to cuMemAlloc), MOCK_CUDA_STUCK (set: a
 * recorded event never completes, as on a GPU whose kernels never finish), MOCK_CUDA_FAIL_DEVICE (a device
 * ordinal: cuMemCreate and cuMemAlloc on it are out of memory), MOCK_CUDA_FAIL_LAUNCHES (set: every kernel
 * launch fails, as when a launch is out of resources).
 *
 * Stream memory operations, copies and the copy-engine path's kernels run at once, in the calling thread; a
 * stream wait spins there until its word comes (MOCK_CUDA_WAIT_S at most). The general kernels move nothing;
 * with MOCK_CUDA_RUN_LOCAL set, a launch whose every transfer is local (no peer) is run as the kernels cut
 * it, block by block, the last channel's first (run_local), so that work one rank does on memory it maps
 * from others is checked on its data, in an order a GPU may take (other tests pass made-up addresses to the
 * kernels).
 *
 * What it saw is exported as `mock_cuda_stats`, which tests read through dlsym.
 */
#ifndef BRAID_TESTS_MOCK_CUDA_H
#define BRAID_TESTS_MOCK_CUDA_H

#include <stdint.h>

#define MOCK_CUDA_GRANULARITY       (64 * 1024) /* cuMemGetAllocationGranularity */
#define MOCK_CUDA_MEM_LIMIT         (1ull << 32) /* larger cuMemCreate / cuMemAlloc requests are out of memory */
#define MOCK_CUDA_SMS               132          /* multiprocessors per device */
#define MOCK_CUDA_CC_MAJOR          9 /* compute capability 9.0, unless MOCK_CUDA_CC_MAJOR in the environment */
#define MOCK_CUDA_NO_CODE_IMAGE     "no code for sm_90" /* a fatbin starting so has no code the devices run */
#define MOCK_CUDA_ONLY_IMAGE        "only:" /* a fatbin "only:a,b" holds kernels a and b alone (else: all) */
#define MOCK_CUDA_CAPTURING         ((void *)0xCA7ull) /* the stream that reports an active capture */
#define MOCK_CUDA_KERNEL            "braid_kernel"     /* the kernels every module holds */
#define MOCK_CUDA_KERNEL_SMALL      "braid_kernel_small"
#define MOCK_CUDA_KERNEL_LL         "braid_kernel_ll"
#define MOCK_CUDA_KERNEL_BULK       "braid_kernel_bulk"
#define MOCK_CUDA_KERNEL_PAIR       "braid_kernel_pair"
#define MOCK_CUDA_KERNEL_PAIR_AR    "braid_kernel_pair_ar"
#define MOCK_CUDA_KERNEL_PAIR_AR128 "braid_kernel_pair_ar128"
#define MOCK_CUDA_KERNEL_WAIT       "braid_kernel_wait"    /* run at once: waits for its word (below) */
#define MOCK_CUDA_KERNEL_COMBINE    "braid_kernel_combine" /* run at once: waits for each chunk, combines it */
#define MOCK_CUDA_KERNEL_PUSH       "braid_kernel_push"    /* run at once: its handshake and copies */
#define MOCK_CUDA_GARBAGE           0xAB /* fresh device and pinned memory is filled with this */
#define MOCK_CUDA_MAX_OBJS          64   /* user objects the capturing stream's one graph can hold */
#define MOCK_CUDA_WAIT_S                                                                                     \
  30 /* a MOCK_CUDA_KERNEL_WAIT (or COMBINE) whose value never comes fails after this */

typedef struct {
  int proc_version;          /* cudaVersion of the last cuGetProcAddress */
  int legacy_stream;         /* it asked for the legacy default stream's variants */
  int retains;               /* cuDevicePrimaryCtxRetain calls */
  int module_loads;          /* modules loaded and not unloaded */
  int launches;              /* cuLaunchKernel calls, MOCK_CUDA_KERNEL_WAIT, _COMBINE and _PUSH aside */
  uint64_t last_param;       /* the first 8 bytes of the last launch's parameter */
  const void *last_param_at; /* where the caller passed that parameter from */
  unsigned last_grid, last_block;
  int last_small;                /* the last launch was of MOCK_CUDA_KERNEL_SMALL */
  unsigned char last_work[4096]; /* the last launch's parameter: as many bytes as its kernel takes */
  uint64_t small_launches;       /* launches of MOCK_CUDA_KERNEL_SMALL */
  int last_ll;                   /* the last launch was of MOCK_CUDA_KERNEL_LL (it takes the small work) */
  uint64_t ll_launches;          /* launches of MOCK_CUDA_KERNEL_LL */
  int last_bulk;                 /* the last launch was of MOCK_CUDA_KERNEL_BULK (it takes the small work) */
  uint64_t bulk_launches;        /* launches of MOCK_CUDA_KERNEL_BULK */
  int last_pair;                 /* the last launch was of MOCK_CUDA_KERNEL_PAIR or _PAIR_AR (a dev_pair_t) */
  int last_pair_ar;              /* 1: the last launch was of MOCK_CUDA_KERNEL_PAIR_AR, 2: of _PAIR_AR128 */
  uint64_t pair_launches;        /* launches of MOCK_CUDA_KERNEL_PAIR and MOCK_CUDA_KERNEL_PAIR_AR* */
  int last_access_devices;       /* devices granted access by the last cuMemSetAccess */
  int last_create_device;        /* location of the last cuMemCreate */
  int live_handles;              /* cuMem handles created or imported, not released */
  int live_ranges;               /* reserved address ranges not freed */
  int live_maps;                 /* mapped ranges not unmapped */
  int live_legacy;               /* cuMemAlloc and opened IPC allocations not freed or closed */
  int live_host;                 /* cuMemHostAlloc allocations and registrations not freed */
  int live_events;               /* events not destroyed */
  int capture_mode;          /* the calling thread's capture mode as last exchanged (CUstreamCaptureMode) */
  uint64_t stream_writes;    /* cuStreamWriteValue32 calls */
  uint64_t stream_waits;     /* cuStreamWaitValue32 calls */
  uint64_t stream_waits_cut; /* those whose word never came within MOCK_CUDA_WAIT_S (a GPU would wait on) */
  uint64_t local_launches;   /* launches of local transfers alone, run by the stand-in (run_local) */
  uint64_t dd_copies;        /* cuMemcpyDtoDAsync calls */
  uint64_t wait_launches;    /* launches of MOCK_CUDA_KERNEL_WAIT */
  uint64_t wait_raises;      /* those that raised a word of the peer's first */
  uint64_t combine_launches; /* launches of MOCK_CUDA_KERNEL_COMBINE */
  uint64_t combine_chunks;   /* chunks they combined */
  uint64_t push_launches;    /* launches of MOCK_CUDA_KERNEL_PUSH */
  uint64_t push_copies;      /* copies they made (sends and local copies) */
  uint64_t push_bytes;       /* bytes they copied */
  uint64_t plain_launches;   /* every cuLaunchKernel call */
  uint64_t overlap_launches; /* every cuLaunchKernelEx call (each asks to overlap the previous kernel) */
} mock_cuda_stats_t;

/* What the library enqueued, told to the recorder that a test installs in `mock_cuda_on_op` (found with
 * dlsym). With MOCK_CUDA_RECORD set in the environment the stand-in only tells: it moves no byte, waits for
 * no word and leaves fresh memory untouched, so that buffers of any size cost address space only. */
typedef enum {
  MOCK_OP_LAUNCH,
  MOCK_OP_COPY,
  MOCK_OP_WRITE,
  MOCK_OP_WAIT,
  MOCK_OP_EVENT_RECORD, /* cuEventRecord: the event in src */
  MOCK_OP_EVENT_WAIT    /* cuStreamWaitEvent: the event in src */
} mock_op_kind_t;
typedef struct {
  mock_op_kind_t kind;
  int dev;            /* the current context's device */
  const char *kernel; /* a launch: the kernel's name */
  unsigned grid, block;
  int overlap;        /* a launch: asked to overlap the stream's previous kernel */
  const void *params; /* a launch: its one parameter (as many bytes as its kernel takes) */
  const void *dst, *src;
  uint64_t bytes; /* a copy: its bytes; a stream write or wait: the value */
  const void *stream;
} mock_cuda_op_t;
typedef void (*mock_cuda_op_fn)(const mock_cuda_op_t *op);
#define MOCK_CUDA_ON_OP "mock_cuda_on_op"

/* Destroys the capturing stream's graph: runs the destructor of every user object it holds (exported; tests
 * find it with dlsym) and returns how many ran. */
typedef int (*mock_cuda_graph_destroy_fn)(void);
#define MOCK_CUDA_GRAPH_DESTROY "mock_cuda_graph_destroy"

#endif
