/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The knob block: what the parametric guest does, set per VM by the VMM in guest memory.
 *
 * Only #defines, so the guest's assembly, the VMM and the build-time preset generator
 * share one copy; reproducer/README.md ("The knob block") documents it and
 * tracekit/guests.py mirrors it. The block is 32 little-endian u64 words at KNOB_BASE.
 * Words 4-21 are the knobs (what a user sets), 24-31 are derived by the VMM from them
 * (register values, counter ticks), so the guest does no arithmetic it could get wrong.
 * Any change to the layout or to what a word means bumps KNOB_LAYOUT.
 */
#ifndef TRACEKIT_KNOBS_H
#define TRACEKIT_KNOBS_H

#define KNOB_LAYOUT		1		/* version of this layout */
/* Revision of the guest code and presets: bump when what any preset does changes, so
 * a bundle of the new guest never pools with one of an older guest of the same name.
 * Guests built before knobs carry no revision ("unknown"); those were revision 1. */
#define GUEST_REVISION		3	/* 3: HINT #0x76 after the MMU went on */
#define KNOB_BASE		0x40010000	/* RAM + 64 KiB: the block, a page of its own */
#define KNOB_MAGIC		0x424f4e4b4b54	/* "TKKNOB" in little-endian bytes */
#define KNOB_WORDS		32
#define KNOB_BYTES		(KNOB_WORDS * 8)

/* Word indexes (byte offset = 8 x index). */
#define KW_MAGIC		0
#define KW_LAYOUT		1
#define KW_SIZE			2		/* KNOB_BYTES */
#define KW_MARKER		3		/* what each vCPU writes at the end */
#define KW_MMU			4		/* 1: stage-1 MMU on */
#define KW_LEAF			5		/* stage-1 leaf: 12 (4 KiB pages), 21, 30 (blocks) */
#define KW_PRE_TLBI		6		/* 1: tlbi vmalle1; dsb ish; isb before SCTLR.M */
#define KW_PAGES		7		/* pages read with the MMU on (the dose) */
#define KW_ON_US		8		/* microseconds spun with the MMU on */
#define KW_NG			9		/* 1: non-global mappings */
#define KW_ASID			10		/* ASID in TTBR0 (0-255) */
#define KW_IRGN			11		/* TCR_EL1.IRGN0: 0 NC, 1 WBWA, 2 WT, 3 WBnWA */
#define KW_ORGN			12		/* TCR_EL1.ORGN0: same encoding */
#define KW_SH			13		/* TCR_EL1.SH0: 0 non, 2 outer, 3 inner */
#define KW_MMU_OFF		14		/* 1: MMU (and caches) off again before any TLBI */
#define KW_TLBI			15		/* TLBI_*: which TLBI the guest issues */
#define KW_TLBI_COUNT		16		/* how many times (--tlbi-count) */
#define KW_CACHES		17		/* 1: SCTLR.C and .I with SCTLR.M */
#define KW_SETWAY		18		/* SETWAY_*: set/way clean+invalidate, and when */
#define KW_TOUCH		19		/* 1: write one word per page of the x3 slice first */
#define KW_TOUCH_KB		20		/* slice size per vCPU (--touch-kb) */
#define KW_SPIN_US		21		/* spin before the marker (--spin-us) */
#define KW_FIRST_KNOB		KW_MMU
#define KW_LAST_KNOB		KW_SPIN_US
/* Derived by the VMM. */
#define KW_MAIR			24
#define KW_TCR			25
#define KW_TTBR0		26		/* table address | ASID << 48 */
#define KW_SCTLR_BITS		27		/* M, plus C and I with caches */
#define KW_ON_TICKS		28		/* on_us in CNTVCT ticks */
#define KW_SPIN_TICKS		29		/* spin_us in CNTVCT ticks */
#define KW_DOSE_BASE		30		/* IPA of the first dose page */
#define KW_TLBI_ARG		31		/* register operand of the TLBI (ASID << 48) */

#define KOFF(word)		((word) * 8)

/* KW_TLBI values. Under KVM every one of them is broadcast: HCR_EL2.FB upgrades a
 * guest's non-IS TLBI to its IS form and HCR_EL2.BSU=IS its DSB NSH to DSB ISH. */
#define TLBI_NONE		0
#define TLBI_VMALLE1		1		/* tlbi vmalle1; dsb nsh */
#define TLBI_VMALLE1IS		2		/* tlbi vmalle1is; dsb ish */
#define TLBI_ASIDE1		3		/* tlbi aside1, asid; dsb nsh */
#define TLBI_ASIDE1IS		4		/* tlbi aside1is, asid; dsb ish */

/* KW_SETWAY values. */
#define SETWAY_NONE		0
#define SETWAY_BEFORE		1		/* before the MMU goes on (cache-toggle) */
#define SETWAY_AFTER		2		/* right after it is on (setway-after-on) */

/* Per-vCPU results the guest writes before its marker (the VMM prints vCPU 0's). */
#define RESULT_BASE		0x40110000	/* RAM + 1 MiB + 64 KiB, RESULT_STRIDE per vCPU */
#define RESULT_STRIDE		64
#define RW_SCTLR_ON		0		/* SCTLR_EL1 just after the MMU went on (0: never) */
#define RW_TCR			1		/* TCR_EL1 as programmed */
#define RW_TTBR0		2		/* TTBR0_EL1 as programmed */
#define RW_PAGES_READ		3		/* dose pages read with the MMU on */
#define RW_TLBIS		4		/* TLBIs issued */
#define RW_SCTLR_END		5		/* SCTLR_EL1 when the marker is written */

/* Marker of a guest that found no valid knob block (the VMM reports a bad marker). */
#define MARKER_BAD_KNOBS	0x746b0000deadb10c

#endif /* TRACEKIT_KNOBS_H */
