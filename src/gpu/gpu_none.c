/*
 * The device interface in a build without CUDA's headers (gpu_cuda.c is not compiled): no device is ever
 * found, so the host backend is chosen, and every device call is refused with a message.
 */
#include "base/log.h"
#include "gpu.h"

ncclResult_t gpu_cuda_probe(int *ndev_p, const char **what_p) {
  *ndev_p = 0;
  *what_p = "this build of Braid has no CUDA support (it was built without CUDA's headers)";
  return ncclSuccess;
}

static ncclResult_t no_cuda(const char *what) {
  return log_err(ncclInvalidUsage, "%s: this build of Braid has no CUDA support", what);
}

ncclResult_t gpu_cuda_mem_alloc(size_t bytes, void **ptr_p) {
  return no_cuda("ncclMemAlloc");
}
ncclResult_t gpu_cuda_mem_free(void *ptr) {
  return no_cuda("ncclMemFree");
}
ncclResult_t gpu_current_device(int *dev_p) {
  return no_cuda("gpu_current_device");
}
ncclResult_t gpu_device_count(int *count_p) {
  return no_cuda("gpu_device_count");
}
ncclResult_t gpu_device_sms(int dev, int *sms_p) {
  return no_cuda("gpu_device_sms");
}
ncclResult_t gpu_overlap_support(int dev, int *eager_p, int *captured_p) {
  return no_cuda("gpu_overlap_support");
}
ncclResult_t gpu_device_busid(int dev, char busid[16]) {
  return no_cuda("gpu_device_busid");
}
ncclResult_t gpu_can_access_peer(int dev, int peer_dev, int *yes_p) {
  return no_cuda("gpu_can_access_peer");
}
ncclResult_t gpu_enable_peer_access(int dev, int peer_dev) {
  return no_cuda("gpu_enable_peer_access");
}
ncclResult_t gpu_enter(int dev, gpu_scope_t *scope) {
  return no_cuda("gpu_enter");
}
void gpu_leave(gpu_scope_t *scope) {}
ncclResult_t gpu_dev_alloc(int dev, size_t bytes, gpu_mem_t **mem_p) {
  return no_cuda("gpu_dev_alloc");
}
void *gpu_mem_ptr(const gpu_mem_t *mem) {
  return NULL;
}
size_t gpu_mem_size(const gpu_mem_t *mem) {
  return 0;
}
void gpu_mem_release(gpu_mem_t *mem) {}
ncclResult_t gpu_mem_export(const gpu_mem_t *mem, gpu_export_t *blob_p) {
  return no_cuda("gpu_mem_export");
}
ncclResult_t gpu_mem_import(int dev, const gpu_export_t *blob, gpu_mem_t **mem_p) {
  return no_cuda("gpu_mem_import");
}
ncclResult_t gpu_host_alloc(size_t bytes, void **host_p, void **dev_p) {
  return no_cuda("gpu_host_alloc");
}
void gpu_host_free(void *host) {}
ncclResult_t gpu_host_register(void *host, size_t bytes, void **dev_p) {
  return no_cuda("gpu_host_register");
}
void gpu_host_unregister(void *host) {}
ncclResult_t gpu_copy_to_device(void *dst, const void *src, size_t bytes) {
  return no_cuda("gpu_copy_to_device");
}
ncclResult_t gpu_event_create(gpu_event_t **event_p) {
  return no_cuda("gpu_event_create");
}
void gpu_event_destroy(gpu_event_t *event) {}
ncclResult_t gpu_event_record(gpu_event_t *event, cudaStream_t stream) {
  return no_cuda("gpu_event_record");
}
ncclResult_t gpu_event_query(gpu_event_t *event, int *done_p) {
  return no_cuda("gpu_event_query");
}
ncclResult_t gpu_stream_wait(cudaStream_t stream, gpu_event_t *event) {
  return no_cuda("gpu_stream_wait");
}
ncclResult_t gpu_stream_capture(cudaStream_t stream, int *yes_p, void **graph_p, uint64_t *id_p) {
  return no_cuda("gpu_stream_capture");
}

ncclResult_t gpu_graph_hold(void *graph, void (*release)(void *), void *arg) {
  return no_cuda("gpu_graph_hold");
}

ncclResult_t gpu_capture_relax(int *saved_p) {
  return no_cuda("gpu_capture_relax");
}

void gpu_capture_restore(int saved) {}

ncclResult_t gpu_copy_async(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  return no_cuda("gpu_copy_async");
}
ncclResult_t gpu_stream_sync(cudaStream_t stream) {
  return no_cuda("gpu_stream_sync");
}
ncclResult_t gpu_func_load(int dev, const void *const *fatbins, int nfatbins, const char *name,
                           gpu_func_t **func_p) {
  return no_cuda("gpu_func_load");
}
ncclResult_t gpu_launch(gpu_func_t *func, unsigned grid, unsigned block, void *param, size_t param_bytes,
                        cudaStream_t stream, int overlap) {
  return no_cuda("gpu_launch");
}
ncclResult_t gpu_stream_write32(cudaStream_t stream, void *word, uint32_t value) {
  return no_cuda("gpu_stream_write32");
}
ncclResult_t gpu_stream_wait32(cudaStream_t stream, void *word, uint32_t value) {
  return no_cuda("gpu_stream_wait32");
}
ncclResult_t gpu_copy_dd_async(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  return no_cuda("gpu_copy_dd_async");
}
ncclResult_t gpu_stream_create(cudaStream_t *stream_p) {
  return no_cuda("gpu_stream_create");
}
void gpu_stream_destroy(cudaStream_t stream) {}
ncclResult_t gpu_event_sync(gpu_event_t *event) {
  return no_cuda("gpu_event_sync");
}
ncclResult_t gpu_ptr_export(int dev, const void *ptr, gpu_ptr_export_t *x, int *ok_p) {
  *ok_p = 0;
  return ncclSuccess;
}
