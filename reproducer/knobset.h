/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The parametric guest's knobs in C: their names and values, the presets, and what the
 * VMM derives from them (register values, the stage-1 tables). Shared by the VMM and by
 * genguest, which turns each preset into a guest ELF at build time. The layout itself
 * is in guests/knobs.h. Functions report a mistake as one sentence in ERR, never exit.
 */
#ifndef TRACEKIT_KNOBSET_H
#define TRACEKIT_KNOBSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "guests/knobs.h"

/* One knob block, word for word as the guest reads it. */
struct knob_block {
	uint64_t w[KNOB_WORDS];
};

/* A named set of knob assignments ("mmu=1 caches=1") over the defaults. */
struct preset {
	const char *name;
	uint64_t marker;
	const char *description;
	const char *knobs;
};

extern const struct preset presets[];
extern const int preset_count;

/* The preset called NAME, or NULL. */
const struct preset *preset_find(const char *name);

/* The defaults every preset starts from: MMU off, 1 GiB blocks, write-back inner walks. */
void knobs_defaults(struct knob_block *block);

/* Defaults, then PRESET's assignments and marker; false (ERR set) if the table is wrong. */
bool knobs_from_preset(struct knob_block *block, const struct preset *preset, char *err,
		       size_t size);

/* Apply one "name=value" assignment; false (ERR set) on an unknown name or bad value. */
bool knob_assign(struct knob_block *block, const char *assignment, char *err, size_t size);

/* The name of knob word WORD, or NULL if WORD is not a knob. */
const char *knob_name(int word);

/* The value of knob word WORD as the command line writes it ("4k", "vmalle1", "16"). */
void knob_format(const struct knob_block *block, int word, char *buf, size_t size);

/* Fill the derived words for RAM_BYTES of guest RAM, VCPUS vCPUs and counter CNTFRQ;
 * false (ERR set) when the dose, the slices and the tables do not fit in RAM. */
bool knobs_derive(struct knob_block *block, uint64_t ram_bytes, int vcpus, uint64_t cntfrq,
		  char *err, size_t size);

/* Write the stage-1 tables the derived TTBR0 points to into RAM (the host mapping of
 * guest RAM); nothing when the MMU knob is off. */
void knobs_write_tables(const struct knob_block *block, unsigned char *ram, uint64_t ram_bytes);

/* The note's summary keys derived from the knobs (reproducer/README.md, the note). */
const char *knobs_stage1(const struct knob_block *block);
const char *knobs_tlbi_summary(const struct knob_block *block, char *buf, size_t size);

#endif /* TRACEKIT_KNOBSET_H */
