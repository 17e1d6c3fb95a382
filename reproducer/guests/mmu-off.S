/* SPDX-License-Identifier: GPL-2.0-only */
/* mmu-off: stage 1 stays off for the whole run; the control for the main case. */
#include "guest.h"

#define MARKER 0x746b000000000001

	guest_entry
	spin_ticks
	write_marker MARKER
	finish

	note_begin
	note_kv variant, mmu-off
	note_kv description, "MMU and caches stay off; spin, write the marker, power off"
	note_kv stage1, off
	note_kv caches, off
	note_kv asid, 0
	note_kv tlbi, none
	note_kv setway, no
	note_kv touch, no
	note_kv marker, STR(MARKER)
	note_end
