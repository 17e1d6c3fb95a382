/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * cache-toggle: every vCPU writes one word per page of its own x3-byte slice of RAM,
 * cleans+invalidates all caches by set/way (each DC CISW traps to KVM), then turns the
 * MMU and caches on (trapped SCTLR write: kvm_toggle_cache flushes the stage 2). With
 * the caches still off, KVM's kvm_set_way_flush does nothing: see setway-after-on.
 */
#include "guest.h"

#define MARKER 0x746b000000000009

	guest_entry
	touch_slice
	setway_clean_invalidate_all
	stage1_prepare
	sctlr_set SCTLR_M | SCTLR_C | SCTLR_I
	spin_ticks
	write_marker MARKER
	finish
	level1_table

	note_begin
	note_kv variant, cache-toggle
	note_kv description, "touch x3 bytes per vCPU, set/way clean+invalidate, then MMU and caches on"
	note_kv stage1, on
	note_kv caches, on
	note_kv asid, 0
	note_kv tlbi, none
	note_kv setway, yes
	note_kv touch, yes
	note_kv marker, STR(MARKER)
	note_end
