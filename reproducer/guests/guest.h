/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Shared constants and assembler macros of the tracekit guest variants.
 *
 * A guest is a few dozen instructions that run at EL1 from the first byte of guest RAM
 * (IPA 0x40000000). The VMM starts every vCPU at the ELF entry with:
 *   x0 = vCPU index, x1 = TLBI count, x2 = spin time in counter ticks,
 *   x3 = bytes to touch per vCPU, x4 = number of vCPUs.
 * The macros below never clobber x0-x4; they use x9-x17 as scratch and no stack.
 * Only the guests include this file (it holds assembler macros); the VMM keeps its own
 * copy of the layout constants in vmm.h, and reproducer/README.md documents both.
 */
#ifndef TRACEKIT_GUEST_H
#define TRACEKIT_GUEST_H

#define RAM_BASE		0x40000000
#define MARKER_BASE		(RAM_BASE + 0x100000)	/* RAM + 1 MiB, 8 bytes per vCPU */
#define TOUCH_BASE		(RAM_BASE + 0x200000)	/* RAM + 2 MiB, x3 bytes per vCPU */
#define DOORBELL_DONE		0x3f000000		/* MMIO, outside RAM: secondary done */
#define DOORBELL_BARRIER	0x3f000008		/* MMIO: vCPU 0 waits for the others */
#define PSCI_SYSTEM_OFF		0x84000008

/* The ELF note that describes a variant (format in reproducer/README.md). */
#define NT_TRACEKIT_VARIANT	0x544b0001

/* SCTLR_EL1 bits the variants set. */
#define SCTLR_M			(1 << 0)
#define SCTLR_C			(1 << 2)
#define SCTLR_I			(1 << 12)

/* MAIR_EL1: attr0 = Device-nGnRnE (0x00), attr1 = Normal write-back RW-allocate (0xff). */
#define MAIR_VALUE		0xff00

/*
 * TCR_EL1: T0SZ=25 (39-bit VA, walk starts at level 1), IRGN0=ORGN0=write-back,
 * SH0=inner shareable, TG0=4 KiB, EPD1=1 (no TTBR1 walks), IPS=40-bit, 8-bit ASIDs.
 */
#define TCR_T0SZ		25
#define TCR_IRGN0_WB		(1 << 8)
#define TCR_ORGN0_WB		(1 << 10)
#define TCR_SH0_INNER		(3 << 12)
#define TCR_EPD1		(1 << 23)
#define TCR_IPS_40BIT		(2 << 32)
#define TCR_VALUE		(TCR_T0SZ | TCR_IRGN0_WB | TCR_ORGN0_WB | TCR_SH0_INNER | \
				 TCR_EPD1 | TCR_IPS_40BIT)

/* Level-1 block descriptor fields (4 KiB granule, 1 GiB blocks). */
#define PTE_BLOCK		1
#define PTE_ATTR_DEVICE		(0 << 2)
#define PTE_ATTR_NORMAL		(1 << 2)
#define PTE_SH_INNER		(3 << 8)
#define PTE_AF			(1 << 10)
#define PTE_NG			(1 << 11)
#define PTE_PXN			(1 << 53)
#define PTE_UXN			(1 << 54)
#define PTE_GB0_DEVICE		(0x00000000 | PTE_BLOCK | PTE_ATTR_DEVICE | PTE_AF | \
				 PTE_PXN | PTE_UXN)
#define PTE_GB1_NORMAL		(0x40000000 | PTE_BLOCK | PTE_ATTR_NORMAL | PTE_SH_INNER | \
				 PTE_AF)

#define STR_(x)			#x
#define STR(x)			STR_(x)

/* Entry point: every variant begins with this label in the first section. */
.macro guest_entry
	.section .text.entry, "ax"
	.global _start
	.type _start, %function
_start:
.endm

/* Static level-1 table: GB 0 Device (XN), GB 1 Normal WB; \ng = PTE_NG for nG mappings. */
.macro level1_table ng=0
	.pushsection .data.tables, "aw"
	.balign 4096
level1_table:
	.quad PTE_GB0_DEVICE | \ng
	.quad PTE_GB1_NORMAL | \ng
	.fill 510, 8, 0
	.popsection
.endm

/* Program MAIR, TCR and TTBR0 (table + ASID); the MMU stays off until sctlr_set. */
.macro stage1_prepare asid=0
	ldr	x9, =MAIR_VALUE
	msr	mair_el1, x9
	ldr	x9, =TCR_VALUE
	msr	tcr_el1, x9
	adr	x9, level1_table
	mov	x10, #\asid
	orr	x9, x9, x10, lsl #48
	msr	ttbr0_el1, x9
	/* No TLBI here on purpose: a new VMID starts with a clean TLB (README). */
	isb
.endm

/* Set SCTLR_EL1 bits (turn the MMU and/or caches on); one write, so one trap at most. */
.macro sctlr_set bits
	mrs	x9, sctlr_el1
	ldr	x10, =\bits
	orr	x9, x9, x10
	msr	sctlr_el1, x9
	isb
.endm

/* Clear SCTLR_EL1 bits (turn the MMU and/or caches off again). */
.macro sctlr_clear bits
	mrs	x9, sctlr_el1
	ldr	x10, =\bits
	bic	x9, x9, x10
	msr	sctlr_el1, x9
	isb
.endm

/* Local invalidation of this VMID's stage-1 entries, completed on this CPU only. */
.macro tlbi_vmalle1_local
	tlbi	vmalle1
	dsb	nsh
	isb
.endm

/* Broadcast invalidation of this VMID's stage-1 entries, completed inner-shareable. */
.macro tlbi_vmalle1_broadcast
	tlbi	vmalle1is
	dsb	ish
	isb
.endm

/* x1 times "tlbi vmalle1is; dsb ish": the forced-broadcast load (x1 = 0: none). */
.macro tlbi_loop
	mov	x9, x1
	cbz	x9, 2f
1:	tlbi	vmalle1is
	dsb	ish
	subs	x9, x9, #1
	b.ne	1b
	isb
2:
.endm

/* Spin on CNTVCT_EL0 for x2 ticks (x2 = 0: no spin). */
.macro spin_ticks
	cbz	x2, 2f
	isb
	mrs	x9, cntvct_el0
	add	x10, x9, x2
1:	isb
	mrs	x9, cntvct_el0
	cmp	x9, x10
	b.lo	1b
2:
.endm

/* Write one word per 4 KiB page of this vCPU's slice: TOUCH_BASE + x0 * x3, x3 bytes. */
.macro touch_slice
	cbz	x3, 2f
	ldr	x9, =TOUCH_BASE
	madd	x9, x0, x3, x9
	add	x10, x9, x3
1:	str	x0, [x9]
	add	x9, x9, #4096
	cmp	x9, x10
	b.lo	1b
	dsb	sy
2:
.endm

/*
 * Clean and invalidate every data/unified cache level up to the LoC by set/way
 * (DC CISW). KVM traps set/way operations (HCR_EL2.TSW) into kvm_set_way_flush.
 * CCSIDR_EL1 has two layouts; ID_AA64MMFR2_EL1.CCIDX says which one this CPU uses.
 */
.macro setway_clean_invalidate_all
	mrs	x9, clidr_el1
	ubfx	x10, x9, #24, #3		/* x10 = level of coherence */
	cbz	x10, 9f
	mov	x11, #0				/* x11 = cache level (0-based) */
1:	add	x12, x11, x11, lsl #1		/* 3 bits of Ctype per level */
	lsr	x12, x9, x12
	and	x12, x12, #7
	cmp	x12, #2				/* < 2: no data or unified cache */
	b.lo	8f
	lsl	x12, x11, #1
	msr	csselr_el1, x12
	isb
	mrs	x13, ccsidr_el1
	and	x14, x13, #7
	add	x14, x14, #4			/* x14 = log2(line size in bytes) */
	mrs	x15, id_aa64mmfr2_el1
	ubfx	x15, x15, #20, #4		/* CCIDX: 64-bit CCSIDR layout */
	cbnz	x15, 2f
	ubfx	x15, x13, #3, #10		/* x15 = ways - 1 */
	ubfx	x16, x13, #13, #15		/* x16 = sets - 1 */
	b	3f
2:	ubfx	x15, x13, #3, #21
	ubfx	x16, x13, #32, #24
3:	clz	w17, w15			/* way field sits at the top of 32 bits */
4:	mov	x13, x16			/* x13 = set, counting down */
5:	lsl	x9, x15, x17
	lsl	x10, x13, x14
	orr	x9, x9, x10
	orr	x9, x9, x12
	dc	cisw, x9
	subs	x13, x13, #1
	b.ge	5b
	subs	x15, x15, #1
	b.ge	4b
	/* x9/x10 were reused above: reload CLIDR and the LoC for the next level. */
	mrs	x9, clidr_el1
	ubfx	x10, x9, #24, #3
8:	add	x11, x11, #1
	cmp	x11, x10
	b.lo	1b
	dsb	sy
	isb
9:
.endm

/* Store the variant's marker at MARKER_BASE + 8 * x0 and make it reach memory. */
.macro write_marker value
	ldr	x9, =MARKER_BASE
	ldr	x10, =\value
	str	x10, [x9, x0, lsl #3]
	dsb	sy
.endm

/*
 * End of every variant. Secondary vCPUs ring "done" and park; vCPU 0 rings "barrier"
 * when there are other vCPUs (the VMM holds it until all are done), then powers the
 * VM off with PSCI SYSTEM_OFF, which stops every vCPU in KVM.
 */
.macro finish
	cbz	x0, 1f
	ldr	x9, =DOORBELL_DONE
	str	x0, [x9]
	b	3f
1:	cmp	x4, #1
	b.ls	2f
	ldr	x9, =DOORBELL_BARRIER
	str	x0, [x9]
2:	ldr	x0, =PSCI_SYSTEM_OFF
	hvc	#0
3:	wfi
	b	3b
	.ltorg
.endm

/* Start of the variant note: name "tracekit", type NT_TRACEKIT_VARIANT, text desc. */
.macro note_begin
	.pushsection .note.tracekit, "a", %note
	.balign 4
	.long	9
	.long	tracekit_note_desc_end - tracekit_note_desc
	.long	NT_TRACEKIT_VARIANT
	.asciz	"tracekit"
	.balign 4
tracekit_note_desc:
	.ascii	"format=1\n"
.endm

/* One "key=value" line of the note's description. */
.macro note_kv key, value
	.ascii	"\key=\value\n"
.endm

/* End of the variant note: the registers every variant honours, then padding. */
.macro note_end
	.ascii	"registers=x0:vcpu,x1:tlbi_count,x2:spin_ticks,x3:touch_bytes,x4:vcpus\n"
tracekit_note_desc_end:
	.balign 4
	.popsection
.endm

#endif /* TRACEKIT_GUEST_H */
