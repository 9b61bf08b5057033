/*
 * A stable 64-bit hash of bytes (FNV-1a): the same value on every rank and every run, for ids, checksums
 * and host identities.
 */
#ifndef BRAID_BASE_HASH_H
#define BRAID_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

/* FNV-1a of n bytes. */
uint64_t hash_bytes(const void *data, size_t n);

#endif
