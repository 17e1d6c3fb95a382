/* SPDX-License-Identifier: GPL-2.0-only */
/* mmu-on: the main case's trigger: stage 1 and both caches on (M+C+I in one write). */
#include "guest.h"

#define MARKER 0x746b000000000002

	guest_entry
	stage1_prepare
	sctlr_set SCTLR_M | SCTLR_C | SCTLR_I
	spin_ticks
	write_marker MARKER
	finish
	level1_table

	note_begin
	note_kv variant, mmu-on
	note_kv description, "identity-mapped stage 1 with MMU, data and instruction caches on"
	note_kv stage1, on
	note_kv caches, on
	note_kv asid, 0
	note_kv tlbi, none
	note_kv setway, no
	note_kv touch, no
	note_kv marker, STR(MARKER)
	note_end
