/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The ground-truth log's layout and the instruction classifier (docs/tables.md).
 * Encodings (Arm ARM, A64 system instruction class, checked against QEMU 7.2's
 * target/arm decode): SYS is 1101 0101 0000 1 op1 CRn CRm op2 Rt; TLBI is SYS with
 * CRn=8 (CRn=9: the FEAT_XS nXS forms); DSB is 0xd503309f | CRm<<8 (CRm<3:2> domain,
 * CRm<1:0> type); DSB nXS is 0xd503323f | imm2<<10; HINT is 0xd503201f | CRm:op2<<5.
 */
#ifndef TKGT_H
#define TKGT_H

#include <stdint.h>

#define TKGT_MAGIC "TKGTLOG"
#define TKGT_VERSION 2u	/* 2: SSBB/PSSBB are TKGT_SSB; DSB #8/#12 as SY */
#define TKGT_DEFAULT_LIMIT (16u << 20)	/* records: 512 MiB of log */
#define TKGT_MAX_LIMIT (1ull << 28)	/* 8 GiB: refuse anything larger */
/* Markers have slots of their own, so a full log still aligns its clock. */
/* 65536: gtmark's, plus three sync markers per VM the VMM runs (a 256-VM rollover adds
 * 768) and two per probe slot; 2 MiB of the default 512 MiB log. */
#define TKGT_MARKER_SLOTS 65536u

/* HINT #0x77 (CRm=0b1110, op2=0b111): unallocated, so a NOP on every Armv8/v9 core. */
#define TKGT_MARKER 0xd5032effu

enum tkgt_kind {
	TKGT_TLBI = 1,
	TKGT_TLBI_NXS = 2,
	TKGT_DSB = 3,
	TKGT_DSB_NXS = 4,
	TKGT_IC = 5,
	TKGT_MARK = 6,
	/* SSBB (DSB encoding CRm=0000) and PSSBB (CRm=0100): speculative store bypass
	 * barriers, which name no shareability domain (flags 0). */
	TKGT_SSB = 7,
};

/* flags bits 0-1: shareability the encoding names. */
enum tkgt_share {
	TKGT_NONSHARED = 0,	/* TLBI local, DSB NSH, IC IALLU */
	TKGT_INNER = 1,		/* ...IS, DSB ISH, IC IALLUIS */
	TKGT_OUTER = 2,		/* ...OS, DSB OSH */
	TKGT_SYSTEM = 3,	/* DSB SY, and the reserved DSB #8 and #12 */
};
#define TKGT_FLAG_RANGE 0x10u	/* bit 4: a range TLBI (FEAT_TLBIRANGE) */
/* flags bits 2-3: a DSB's type, CRm<1:0> (1 loads, 2 stores, 3 all). */

struct tkgt_header {
	char magic[8];
	uint32_t version;
	uint32_t record_size;
	uint64_t capacity;		/* records the file can hold */
	uint64_t reserved;		/* other records seen; past capacity - marker_capacity:
					 * not written */
	uint32_t complete;		/* 1 once QEMU exited and the log was closed */
	uint32_t clock;			/* clockid of ts_ns: CLOCK_MONOTONIC (1) */
	uint32_t vcpus;			/* -smp's maximum */
	uint32_t marker_capacity;	/* the last slots of the file, kept for markers */
	uint64_t untracked_sites;	/* sites given no callback for lack of memory: their
					 * executions, of unknown number, were not logged */
	uint64_t markers_reserved;	/* markers seen; past marker_capacity: not written */
};

struct tkgt_record {
	uint64_t ts_ns;		/* CLOCK_MONOTONIC of the machine running QEMU */
	uint64_t vaddr;		/* virtual address of the instruction */
	uint64_t haddr;		/* QEMU's host address of its bytes (0: not RAM) */
	uint32_t insn;		/* the instruction word */
	uint16_t vcpu;		/* QEMU's vCPU index */
	uint8_t kind;		/* enum tkgt_kind */
	uint8_t flags;		/* enum tkgt_share | DSB type << 2 | TKGT_FLAG_RANGE */
};

_Static_assert(sizeof(struct tkgt_header) == 64, "header is 64 bytes");
_Static_assert(sizeof(struct tkgt_record) == 32, "record is 32 bytes");

/* TLBI shareability from CRm; CRm 0 and 4 hold only op1=4 IPA forms (IS, and OS/local).
 * In CRm 2/5/6 only odd op2 are range forms: op1=4 op2=2 there is FEAT_TLBIW's
 * VMALLWS2E1(IS/OS), not a range. Not named (docs/tables.md): FEAT_TLBIW, RME's PA
 * forms (op1=6), FEAT_D128's TLBIP (SYSP, not matched at all); none exists in QEMU 7.2. */
static inline uint8_t tkgt_tlbi_flags(uint32_t crm, uint32_t op2)
{
	switch (crm) {
	case 0:
		return TKGT_INNER | ((op2 & 3) >= 2 ? TKGT_FLAG_RANGE : 0);
	case 1:
		return TKGT_OUTER;
	case 2:
		return TKGT_INNER | (op2 & 1 ? TKGT_FLAG_RANGE : 0);
	case 3:
		return TKGT_INNER;
	case 4:
		/* op2 0,3,4,7: IPAS2(L)E1OS and RIPAS2(L)E1OS; 1,2,5,6: the local forms. */
		return ((op2 & 3) == 0 || (op2 & 3) == 3 ? TKGT_OUTER : TKGT_NONSHARED) |
		       ((op2 & 3) >= 2 ? TKGT_FLAG_RANGE : 0);
	case 5:
		return TKGT_OUTER | (op2 & 1 ? TKGT_FLAG_RANGE : 0);
	case 6:
		return TKGT_NONSHARED | (op2 & 1 ? TKGT_FLAG_RANGE : 0);
	default:
		return TKGT_NONSHARED;
	}
}

/* DSB CRm<3:2> domain: 00 OSH, 01 NSH, 10 ISH, 11 SY. */
static inline uint8_t tkgt_dsb_share(uint32_t domain)
{
	static const uint8_t share[4] = { TKGT_OUTER, TKGT_NONSHARED, TKGT_INNER, TKGT_SYSTEM };

	return share[domain & 3];
}

/* 1 if `w` is logged, with its kind and flags; 0 for every other instruction. */
static inline int tkgt_classify(uint32_t w, uint8_t *kind, uint8_t *flags)
{
	uint32_t crm = (w >> 8) & 0xf, op2 = (w >> 5) & 7;

	if ((w & 0xfff8f000u) == 0xd5088000u || (w & 0xfff8f000u) == 0xd5089000u) {
		*kind = (w & 0x1000u) ? TKGT_TLBI_NXS : TKGT_TLBI;
		*flags = tkgt_tlbi_flags(crm, op2);
		return 1;
	}
	if ((w & 0xfffff0ffu) == 0xd503309fu && (crm == 0 || crm == 4)) {
		*kind = TKGT_SSB;
		*flags = 0;
		return 1;
	}
	/* CRm 8 and 12 are reserved DSB options: the Arm ARM has every reserved option
	 * execute as a full-system DSB, so they are logged as DSB SY. */
	if ((w & 0xfffff0ffu) == 0xd503309fu && (crm & 3) == 0) {
		*kind = TKGT_DSB;
		*flags = TKGT_SYSTEM | 3u << 2;
		return 1;
	}
	if ((w & 0xfffff0ffu) == 0xd503309fu) {
		*kind = TKGT_DSB;
		*flags = (uint8_t)(tkgt_dsb_share(crm >> 2) | (crm & 3) << 2);
		return 1;
	}
	if ((w & 0xfffff3ffu) == 0xd503323fu) {
		*kind = TKGT_DSB_NXS;
		*flags = (uint8_t)(tkgt_dsb_share(crm >> 2) | 3u << 2);
		return 1;
	}
	/* IC IALLUIS (op1=0 CRn=7 CRm=1 op2=0) and IC IALLU (CRm=5), any Rt. */
	if ((w & 0xffffffe0u) == 0xd5087100u || (w & 0xffffffe0u) == 0xd5087500u) {
		*kind = TKGT_IC;
		*flags = crm == 1 ? TKGT_INNER : TKGT_NONSHARED;
		return 1;
	}
	if (w == TKGT_MARKER) {
		*kind = TKGT_MARK;
		*flags = 0;
		return 1;
	}
	return 0;
}

#endif
