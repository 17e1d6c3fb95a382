/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * mmu-on-off: stage 1 and caches on, then off again at once; the spin, the marker and
 * the power-off happen with the MMU off. Nothing is written while the caches are on,
 * so nothing needs cleaning before they go off.
 */
#include "guest.h"

#define MARKER 0x746b000000000004

	guest_entry
	stage1_prepare
	sctlr_set SCTLR_M | SCTLR_C | SCTLR_I
	sctlr_clear SCTLR_M | SCTLR_C | SCTLR_I
	spin_ticks
	write_marker MARKER
	finish
	level1_table

	note_begin
	note_kv variant, mmu-on-off
	note_kv description, "stage 1 and caches on then straight off again; spin and marker with MMU off"
	note_kv stage1, on-then-off
	note_kv caches, on
	note_kv asid, 0
	note_kv tlbi, none
	note_kv setway, no
	note_kv touch, no
	note_kv marker, STR(MARKER)
	note_end
