/* SPDX-License-Identifier: GPL-2.0-only */
/* mmu-on-asid: as mmu-on, but with non-global (nG) mappings tagged with ASID 42. */
#include "guest.h"

#define MARKER 0x746b000000000005
#define ASID 42

	guest_entry
	stage1_prepare ASID
	sctlr_set SCTLR_M | SCTLR_C | SCTLR_I
	spin_ticks
	write_marker MARKER
	finish
	level1_table PTE_NG

	note_begin
	note_kv variant, mmu-on-asid
	note_kv description, "as mmu-on with non-global mappings under a non-zero ASID in TTBR0"
	note_kv stage1, on
	note_kv caches, on
	note_kv asid, STR(ASID)
	note_kv tlbi, none
	note_kv setway, no
	note_kv touch, no
	note_kv marker, STR(MARKER)
	note_end
