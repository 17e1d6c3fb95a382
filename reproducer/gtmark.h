/* SPDX-License-Identifier: GPL-2.0-only */
/* The ground-truth marker: the same values as reproducer/groundtruth/tkgt.h's. */
#ifndef TRACEKIT_GTMARK_H
#define TRACEKIT_GTMARK_H

/* HINT #0x77 (CRm=0b1110, op2=0b111): unallocated in the hint space, so a NOP. */
#define GT_HINT_STR "0x77"
#define GT_SLOTS 64
#define GT_SLOTS_STR "64"
#define GT_SLOT_BYTES 8

#endif
