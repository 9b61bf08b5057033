/*
 * Collective, point-to-point, group and reduction-operation entry points: argument checks, then the call
 * goes to the group (core/group.c) as a task.
 */
#include <stdint.h>

#include "api.h"
#include "base/check.h"
#include "base/dtype.h"
#include "base/log.h"
#include "core/comm.h"
#include "core/group.h"

/* What a call needs of its buffers on this rank. */
enum { NEEDS_SEND = 1, NEEDS_RECV = 2 };

/* Which buffers a call reads or writes on this rank (NCCL ignores the others, e.g. recvbuff off the root). */
static int needs(op_kind_t kind, int is_root) {
  switch (kind) {
  case OP_BROADCAST:
    return NEEDS_RECV | (is_root ? NEEDS_SEND : 0);
  case OP_REDUCE:
  case OP_GATHER:
    return NEEDS_SEND | (is_root ? NEEDS_RECV : 0);
  case OP_SCATTER:
    return NEEDS_RECV | (is_root ? NEEDS_SEND : 0);
  case OP_SEND:
    return NEEDS_SEND;
  case OP_RECV:
    return NEEDS_RECV;
  default:
    return NEEDS_SEND | NEEDS_RECV;
  }
}

static int is_reducing(op_kind_t kind) {
  return kind == OP_ALLREDUCE || kind == OP_REDUCE || kind == OP_REDUCESCATTER;
}

static int is_rooted(op_kind_t kind) {
  return kind == OP_BROADCAST || kind == OP_REDUCE || kind == OP_GATHER || kind == OP_SCATTER ||
         kind == OP_SEND || kind == OP_RECV;
}

/* Checks a call's arguments against its communicator. */
static ncclResult_t check_call(const char *func, const task_t *t, ncclComm_t comm) {
  CHECK(comm_check_ready(comm, func));
  if ((unsigned)t->type >= ncclNumTypes)
    return log_err(ncclInvalidArgument, "%s: invalid datatype %d", func, (int)t->type);
  if (is_reducing(t->kind)) CHECK(redop_check(&comm->redops, t->op, t->type, func));
  if (is_rooted(t->kind) && (t->root < 0 || t->root >= comm->nranks))
    return log_err(ncclInvalidArgument, "%s: %s %d is outside 0..%d", func,
                   t->kind == OP_SEND || t->kind == OP_RECV ? "peer" : "root", t->root, comm->nranks - 1);
  if (t->count > SIZE_MAX / dtype_size(t->type) / (size_t)comm->nranks)
    return log_err(ncclInvalidArgument, "%s: count %zu of %s overflows the address space", func, t->count,
                   dtype_name(t->type));
  if (t->count == 0) return ncclSuccess;
  int need = needs(t->kind, comm->rank == t->root);
  if ((need & NEEDS_SEND) && t->sendbuff == NULL)
    return log_err(ncclInvalidArgument, "%s: sendbuff is NULL with count %zu", func, t->count);
  if ((need & NEEDS_RECV) && t->recvbuff == NULL)
    return log_err(ncclInvalidArgument, "%s: recvbuff is NULL with count %zu", func, t->count);
  return ncclSuccess;
}

static ncclResult_t enqueue(const char *func, op_kind_t kind, const void *sendbuff, void *recvbuff,
                            size_t count, ncclDataType_t type, ncclRedOp_t op, int root, ncclComm_t comm,
                            cudaStream_t stream) {
  task_t t = {.kind = kind,
              .sendbuff = sendbuff,
              .recvbuff = recvbuff,
              .count = count,
              .type = type,
              .op = is_reducing(kind) ? op : ncclSum,
              .root = is_rooted(kind) ? root : -1,
              .stream = stream};
  CHECK(group_error(check_call(func, &t, comm)));
  t.seq = comm->next_seq++;
  INFO(LOG_COLL,
       "%s: opCount %lx sendbuff %p recvbuff %p count %zu datatype %d op %d root %d comm %p [nranks=%d] "
       "stream %p",
       func + 4, (unsigned long)t.seq, sendbuff, recvbuff, count, (int)type, (int)op, root, (void *)comm,
       comm->nranks, (void *)stream);
  return group_enqueue(comm, &t);
}

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclAllReduce", OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclReduce", OP_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclBroadcast", OP_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm,
                 stream);
}

NCCL_API(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root,
         ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclBcast", OP_BROADCAST, buff, buff, count, datatype, ncclSum, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclReduceScatter", OP_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm,
                 stream);
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclAllGather", OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm,
                 stream);
}

NCCL_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclAlltoAll", OP_ALLTOALL, sendbuff, recvbuff, count, datatype, ncclSum, 0, comm, stream);
}

NCCL_API(ncclResult_t, ncclGather, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclGather", OP_GATHER, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclScatter, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclScatter", OP_SCATTER, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclSend", OP_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream);
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclRecv", OP_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream);
}

NCCL_API(ncclResult_t, ncclGroupStart, void) {
  return group_start();
}

NCCL_API(ncclResult_t, ncclGroupEnd, void) {
  return group_end();
}

#define SIM_INFO_MAGIC 0x74685283u

NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t *simInfo) {
  if (simInfo == NULL) return log_err(ncclInvalidArgument, "ncclGroupSimulateEnd: simInfo is NULL");
  if (simInfo->magic != SIM_INFO_MAGIC)
    return log_err(ncclInvalidArgument,
                   "ncclGroupSimulateEnd: simInfo magic 0x%x is not 0x%x; initialise it with "
                   "NCCL_SIM_INFO_INITIALIZER",
                   simInfo->magic, SIM_INFO_MAGIC);
  if (simInfo->size < sizeof(ncclSimInfo_t))
    return log_err(ncclInvalidArgument, "ncclGroupSimulateEnd: simInfo size %zu is smaller than %zu",
                   simInfo->size, sizeof(ncclSimInfo_t));
  return group_simulate_end(simInfo);
}

NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
         ncclScalarResidence_t residence, ncclComm_t comm) {
  CHECK(comm_check_ready(comm, "ncclRedOpCreatePreMulSum"));
  if (op == NULL) return log_err(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: op is NULL");
  if (scalar == NULL) return log_err(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: scalar is NULL");
  if ((unsigned)datatype >= ncclNumTypes)
    return log_err(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid datatype %d", (int)datatype);
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    return log_err(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid residence %d", (int)residence);
  return redop_create(&comm->redops, scalar, datatype, residence, op);
}

NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm) {
  CHECK(comm_check(comm, "ncclRedOpDestroy"));
  return redop_destroy(&comm->redops, op);
}
