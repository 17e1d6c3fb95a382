/* SPDX-License-Identifier: GPL-2.0-only */
/* mmu-on-vmalle1: as mmu-on, then a local TLBI VMALLE1 + DSB NSH before the spin. */
#include "guest.h"

#define MARKER 0x746b000000000006

	guest_entry
	stage1_prepare
	sctlr_set SCTLR_M | SCTLR_C | SCTLR_I
	tlbi_vmalle1_local
	spin_ticks
	write_marker MARKER
	finish
	level1_table

	note_begin
	note_kv variant, mmu-on-vmalle1
	note_kv description, "as mmu-on, then a local TLBI VMALLE1 completed by DSB NSH"
	note_kv stage1, on
	note_kv caches, on
	note_kv asid, 0
	note_kv tlbi, vmalle1
	note_kv setway, no
	note_kv touch, no
	note_kv marker, STR(MARKER)
	note_end
