/* SPDX-License-Identifier: GPL-2.0-only */
/* tlbiprobe's sample file format and summary statistics (reproducer/README.md). */
#ifndef TRACEKIT_PROBE_H
#define TRACEKIT_PROBE_H

#include <stdint.h>
#include <stdio.h>

#include "common.h"

#define PROBE_MAGIC		"TKPROBE\0"
/* Version 2 added each sample's direction (version 1: 16-byte records without it). */
#define PROBE_VERSION		2
#define PROBE_HEADER_SIZE	64

/* What each timed call does. */
enum probe_mode {
	MODE_PAGE = 1,		/* mprotect of a one-page mapping */
	MODE_RANGE = 2,		/* mprotect of an N-page mapping */
	MODE_MUNMAP = 3,	/* munmap of a freshly touched N-page mapping */
};

/*
 * Which protection change a timed syscall made: RW->RO and RO->RW mprotect take different
 * kernel paths, so their samples are kept apart; munmap mode's calls are all unmaps.
 */
enum probe_direction {
	DIRECTION_UNKNOWN = 0,	/* never written; version 1 files read as this */
	DIRECTION_RW_TO_RO = 1,
	DIRECTION_RO_TO_RW = 2,
	DIRECTION_UNMAP = 3,
};

/* One timed syscall: when it started (CLOCK_BOOTTIME), how long it took, what it did. */
struct probe_sample {
	uint64_t timestamp_ns;
	uint64_t duration_ns;
	uint32_t direction;	/* enum probe_direction */
	uint32_t reserved;	/* 0 */
};

_Static_assert(sizeof(struct probe_sample) == 24, "record layout");

/* The 64-byte little-endian file header; samples follow it. */
struct probe_header {
	char magic[8];
	uint32_t version;
	uint32_t header_size;
	uint32_t record_size;
	uint32_t cpu;
	uint32_t mode;
	uint32_t pages;
	uint64_t counter_hz;
	uint64_t count;
	uint32_t clock_id;
	uint32_t helpers;
	uint64_t reserved;
};

_Static_assert(sizeof(struct probe_header) == PROBE_HEADER_SIZE, "header layout");

/* The name of a mode as the command line and the summary spell it. */
const char *probe_mode_name(enum probe_mode mode);

/* Write the header and every sample to PATH; dies on failure. */
void probe_write_file(const char *path, const struct probe_header *header,
		      const struct probe_sample *samples);

/* The ground-truth sync markers around the samples (reproducer/README.md). */
struct probe_sync {
	struct gt_sync start;	/* just before the first sample */
	struct gt_sync stop;	/* just after the last */
};

/* Print the one-line JSON summary (with the sync markers) and log2 histogram. */
void probe_print_summary(FILE *out, const struct probe_header *header, const char *helpers,
			 const char *thp, const struct probe_sample *samples,
			 const struct probe_sync *sync);

#endif /* TRACEKIT_PROBE_H */
