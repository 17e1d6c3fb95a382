/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * mmu-on-nocache: stage 1 on with SCTLR.C and .I clear. KVM's flush on cache toggle
 * (kvm_toggle_cache) needs both M and C, so this separates "stage 1 on" from it.
 */
#include "guest.h"

#define MARKER 0x746b000000000003

	guest_entry
	stage1_prepare
	sctlr_set SCTLR_M
	spin_ticks
	write_marker MARKER
	finish
	level1_table

	note_begin
	note_kv variant, mmu-on-nocache
	note_kv description, "identity-mapped stage 1 with the MMU on and both caches off"
	note_kv stage1, on
	note_kv caches, off
	note_kv asid, 0
	note_kv tlbi, none
	note_kv setway, no
	note_kv touch, no
	note_kv marker, STR(MARKER)
	note_end
