/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * setway-after-on: as cache-toggle, but the set/way maintenance comes after the MMU and
 * caches are on. On CPUs without FWB, KVM resets a vCPU with HCR_EL2.TVM set and only
 * clears it once the caches are on (kvm_toggle_cache), and kvm_set_way_flush flushes
 * and traces only when TVM is clear: so only this order shows kvm_set_way_flush.
 */
#include "guest.h"

#define MARKER 0x746b00000000000a

	guest_entry
	touch_slice
	stage1_prepare
	sctlr_set SCTLR_M | SCTLR_C | SCTLR_I
	setway_clean_invalidate_all
	spin_ticks
	write_marker MARKER
	finish
	level1_table

	note_begin
	note_kv variant, setway-after-on
	note_kv description, "touch x3 bytes per vCPU, MMU and caches on, then set/way clean+invalidate"
	note_kv stage1, on
	note_kv caches, on
	note_kv asid, 0
	note_kv tlbi, none
	note_kv setway, yes
	note_kv touch, yes
	note_kv marker, STR(MARKER)
	note_end
