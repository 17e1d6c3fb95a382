/* SPDX-License-Identifier: GPL-2.0-only */
/* The ground-truth marker: the same values as reproducer/groundtruth/tkgt.h's. */
#ifndef TRACEKIT_GTMARK_H
#define TRACEKIT_GTMARK_H

/* HINT #0x77 (CRm=0b1110, op2=0b111): unallocated in the hint space, so a NOP. */
#define GT_HINT_STR "0x77"
#define GT_SLOTS 64
#define GT_SLOTS_STR "64"
#define GT_SLOT_BYTES 8
/* Slot 63 is the sync marker's (gt_sync_mark, common.c: the VMM and the probe), so
 * gtmark's per-CPU markers use slots 0-62 (CPU % 63) and the plugin's logged VA says
 * which kind a marker is. */
#define GT_SYNC_SLOT 63
#define GT_CPU_SLOTS 63
#define GT_SYNC_OFFSET_STR "504"

#endif
