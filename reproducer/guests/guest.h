/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Shared constants and assembler macros of the tracekit guest (guest.S).
 *
 * The guest runs at EL1 from the first byte of guest RAM (IPA 0x40000000). The VMM
 * starts every vCPU at the ELF entry with x0 = vCPU index and x4 = number of vCPUs; what
 * the guest does comes from the knob block (knobs.h), which also gives x2 (spin ticks)
 * and x3 (bytes to touch). The macros below never clobber x0-x4 or x19-x28; they use
 * x9-x17 as scratch and no stack. Only the guest includes this file (it holds assembler
 * macros); the VMM keeps its own copy of the layout constants in vmm.h, and
 * reproducer/README.md documents both.
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

#define STR_(x)			#x
#define STR(x)			STR_(x)

/* Entry point: the guest begins with this label in the first section. */
.macro guest_entry
	.section .text.entry, "ax"
	.global _start
	.type _start, %function
_start:
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

/*
 * End of the guest. Secondary vCPUs ring "done" and park; vCPU 0 rings "barrier"
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

/* End of the variant note: the entry registers the guest honours, then padding. */
.macro note_end
	.ascii	"registers=x0:vcpu,x4:vcpus\n"
tracekit_note_desc_end:
	.balign 4
	.popsection
.endm

#endif /* TRACEKIT_GUEST_H */
