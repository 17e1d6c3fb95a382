/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * tlbi-loop: x1 broadcast invalidations (TLBI VMALLE1IS; DSB ISH) with the MMU off,
 * so the broadcast load (HCR_EL2.FB case) is measured apart from the stage-1 trigger.
 */
#include "guest.h"

#define MARKER 0x746b000000000008

	guest_entry
	tlbi_loop
	spin_ticks
	write_marker MARKER
	finish

	note_begin
	note_kv variant, tlbi-loop
	note_kv description, "MMU off; x1 times TLBI VMALLE1IS + DSB ISH"
	note_kv stage1, off
	note_kv caches, off
	note_kv asid, 0
	note_kv tlbi, loop-vmalle1is
	note_kv setway, no
	note_kv touch, no
	note_kv marker, STR(MARKER)
	note_end
