// SPDX-License-Identifier: GPL-2.0-only
/* The knobs, the presets and what the VMM derives from them (see knobset.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "knobset.h"

#define RAM_START		0x40000000ull
#define GIB			(1ull << 30)
#define PAGE			4096ull
#define DOSE_OFFSET		0x200000ull	/* RAM + 2 MiB, where the slices start too */

/* A named value of an enumerated knob. */
struct knob_value {
	const char *name;
	uint64_t value;
};

/* One knob: its word, name, numeric range, and its value names (NULL: a number). */
struct knob_def {
	int word;
	const char *name;
	uint64_t max;
	const struct knob_value *values;
};

static const struct knob_value bool_values[] = { { "0", 0 }, { "1", 1 }, { 0 } };
static const struct knob_value leaf_values[] = { { "4k", 12 }, { "2m", 21 }, { "1g", 30 },
						 { 0 } };
static const struct knob_value cache_values[] = { { "nc", 0 }, { "wbwa", 1 }, { "wt", 2 },
						  { "wb", 3 }, { 0 } };
static const struct knob_value sh_values[] = { { "non", 0 }, { "outer", 2 }, { "inner", 3 },
					       { 0 } };
static const struct knob_value tlbi_values[] = {
	{ "none", TLBI_NONE }, { "vmalle1", TLBI_VMALLE1 }, { "vmalle1is", TLBI_VMALLE1IS },
	{ "aside1", TLBI_ASIDE1 }, { "aside1is", TLBI_ASIDE1IS }, { 0 },
};
static const struct knob_value setway_values[] = { { "none", SETWAY_NONE },
						   { "before", SETWAY_BEFORE },
						   { "after", SETWAY_AFTER }, { 0 } };

static const struct knob_def knob_defs[] = {
	{ KW_MMU, "mmu", 1, bool_values },
	{ KW_LEAF, "leaf", 30, leaf_values },
	{ KW_PRE_TLBI, "pre_tlbi", 1, bool_values },
	{ KW_PAGES, "pages", 1ull << 18, NULL },
	{ KW_ON_US, "on_us", 3600000000ull, NULL },
	{ KW_NG, "ng", 1, bool_values },
	{ KW_ASID, "asid", 255, NULL },
	{ KW_IRGN, "irgn", 3, cache_values },
	{ KW_ORGN, "orgn", 3, cache_values },
	{ KW_SH, "sh", 3, sh_values },
	{ KW_MMU_OFF, "mmu_off", 1, bool_values },
	{ KW_TLBI, "tlbi", 4, tlbi_values },
	{ KW_TLBI_COUNT, "tlbi_count", UINT32_MAX, NULL },
	{ KW_CACHES, "caches", 1, bool_values },
	{ KW_SETWAY, "setway", 2, setway_values },
	{ KW_TOUCH, "touch", 1, bool_values },
	{ KW_TOUCH_KB, "touch_kb", 1ull << 20, NULL },
	{ KW_SPIN_US, "spin_us", 3600000000ull, NULL },
};
#define NKNOBS ((int)(sizeof(knob_defs) / sizeof(knob_defs[0])))

/*
 * The presets: the guest variants tracekit has always had, as knob settings, plus the
 * report's own sequence. The TLBI presets read pages with the MMU on, turn it off, then
 * invalidate and finish with it off, so nothing refills the TLB after the TLBI
 * (mmu-on-off, same dose, no TLBI, is their control). Under KVM the guest's vmalle1 is
 * broadcast like vmalle1is (HCR_EL2.FB, BSU=IS): the two presets are one experiment,
 * kept apart only so old plans still name both.
 */
const struct preset presets[] = {
	{ "mmu-off", 0x746b000000000001ull,
	  "MMU and caches stay off; spin, write the marker, power off", "" },
	{ "mmu-on", 0x746b000000000002ull,
	  "identity-mapped stage 1 with MMU, data and instruction caches on, no TLBI",
	  "mmu=1 caches=1" },
	{ "mmu-on-nocache", 0x746b000000000003ull,
	  "identity-mapped stage 1 with the MMU on and both caches off", "mmu=1" },
	{ "mmu-on-off", 0x746b000000000004ull,
	  "MMU and caches on, read 16 pages, MMU and caches off; the rest with the MMU off",
	  "mmu=1 caches=1 pages=16 mmu_off=1" },
	{ "mmu-on-asid", 0x746b000000000005ull,
	  "as mmu-on with non-global mappings under ASID 42 in TTBR0",
	  "mmu=1 caches=1 ng=1 asid=42" },
	{ "mmu-on-vmalle1", 0x746b000000000006ull,
	  "as mmu-on-off, then TLBI VMALLE1 + DSB NSH with the MMU off (broadcast under "
	  "KVM's HCR_EL2.FB and BSU=IS: the same experiment as mmu-on-vmalle1is)",
	  "mmu=1 caches=1 pages=16 mmu_off=1 tlbi=vmalle1 tlbi_count=1" },
	{ "mmu-on-vmalle1is", 0x746b000000000007ull,
	  "as mmu-on-off, then TLBI VMALLE1IS + DSB ISH with the MMU off",
	  "mmu=1 caches=1 pages=16 mmu_off=1 tlbi=vmalle1is tlbi_count=1" },
	{ "tlbi-loop", 0x746b000000000008ull,
	  "MMU off; --tlbi-count times TLBI VMALLE1IS + DSB ISH", "tlbi=vmalle1is" },
	{ "cache-toggle", 0x746b000000000009ull,
	  "touch x3 bytes per vCPU, set/way clean+invalidate, then MMU and caches on",
	  "touch=1 setway=before mmu=1 caches=1" },
	{ "setway-after-on", 0x746b00000000000aull,
	  "touch x3 bytes per vCPU, MMU and caches on, then set/way clean+invalidate",
	  "touch=1 mmu=1 caches=1 setway=after" },
	{ "mmu-on-report", 0x746b00000000000bull,
	  "the report's guest: TLBI VMALLE1; DSB ISH; ISB, then MMU and caches on",
	  "pre_tlbi=1 mmu=1 caches=1" },
};
const int preset_count = (int)(sizeof(presets) / sizeof(presets[0]));

const struct preset *preset_find(const char *name)
{
	for (int i = 0; i < preset_count; i++)
		if (strcmp(presets[i].name, name) == 0)
			return &presets[i];
	return NULL;
}

void knobs_defaults(struct knob_block *block)
{
	memset(block, 0, sizeof(*block));
	block->w[KW_MAGIC] = KNOB_MAGIC;
	block->w[KW_LAYOUT] = KNOB_LAYOUT;
	block->w[KW_SIZE] = KNOB_BYTES;
	block->w[KW_LEAF] = 30;
	block->w[KW_IRGN] = 1;
	block->w[KW_ORGN] = 1;
	block->w[KW_SH] = 3;
}

/* The definition of the knob called NAME (LEN bytes), or NULL. */
static const struct knob_def *find_def(const char *name, size_t len)
{
	for (int i = 0; i < NKNOBS; i++)
		if (strlen(knob_defs[i].name) == len && strncmp(knob_defs[i].name, name, len) == 0)
			return &knob_defs[i];
	return NULL;
}

/* The definition of knob word WORD, or NULL. */
static const struct knob_def *def_of_word(int word)
{
	for (int i = 0; i < NKNOBS; i++)
		if (knob_defs[i].word == word)
			return &knob_defs[i];
	return NULL;
}

const char *knob_name(int word)
{
	const struct knob_def *def = def_of_word(word);

	return def ? def->name : NULL;
}

/* The value names of an enumerated knob, "a|b|c", for error messages. */
static void list_values(const struct knob_def *def, char *buf, size_t size)
{
	size_t used = 0;

	buf[0] = '\0';
	for (const struct knob_value *v = def->values; v->name && used < size; v++)
		used += snprintf(buf + used, size - used, "%s%s", v == def->values ? "" : "|",
				 v->name);
}

/* Parse TEXT as DEF's value into OUT; false (ERR set) when it is not one. */
static bool parse_value(const struct knob_def *def, const char *text, uint64_t *out, char *err,
			size_t size)
{
	char names[128], *end;

	if (def->values) {
		for (const struct knob_value *v = def->values; v->name; v++)
			if (strcmp(v->name, text) == 0) {
				*out = v->value;
				return true;
			}
		list_values(def, names, sizeof(names));
		snprintf(err, size, "%s='%s': expected one of %s", def->name, text, names);
		return false;
	}
	*out = strtoull(text, &end, 0);
	if (*text == '\0' || *text == '-' || *end != '\0' || *out > def->max) {
		snprintf(err, size, "%s='%s': expected a number from 0 to %" PRIu64, def->name,
			 text, def->max);
		return false;
	}
	return true;
}

bool knob_assign(struct knob_block *block, const char *assignment, char *err, size_t size)
{
	const char *eq = strchr(assignment, '=');
	const struct knob_def *def = eq ? find_def(assignment, eq - assignment) : NULL;
	uint64_t value;

	if (!def) {
		snprintf(err, size, "'%s': expected NAME=VALUE with NAME one of mmu, leaf, "
			 "pre_tlbi, pages, on_us, ng, asid, irgn, orgn, sh, mmu_off, tlbi, "
			 "tlbi_count, caches, setway, touch, touch_kb, spin_us", assignment);
		return false;
	}
	if (!parse_value(def, eq + 1, &value, err, size))
		return false;
	block->w[def->word] = value;
	return true;
}

bool knobs_from_preset(struct knob_block *block, const struct preset *preset, char *err,
		       size_t size)
{
	char *copy = strdup(preset->knobs), *save = NULL;
	bool ok = copy != NULL;

	knobs_defaults(block);
	block->w[KW_MARKER] = preset->marker;
	for (char *tok = ok ? strtok_r(copy, " ", &save) : NULL; tok && ok;
	     tok = strtok_r(NULL, " ", &save))
		ok = knob_assign(block, tok, err, size);
	if (!copy)
		snprintf(err, size, "out of memory");
	free(copy);
	return ok;
}

void knob_format(const struct knob_block *block, int word, char *buf, size_t size)
{
	const struct knob_def *def = def_of_word(word);
	uint64_t value = block->w[word];

	if (def && def->values)
		for (const struct knob_value *v = def->values; v->name; v++)
			if (v->value == value) {
				snprintf(buf, size, "%s", v->name);
				return;
			}
	snprintf(buf, size, "%" PRIu64, value);
}

/* Bytes of stage-1 tables the MMU knob needs: level 1, then level 2 and 3 as the leaf
 * size asks (4 KiB pages map the first GiB of RAM at most, one level-3 table a 2 MiB). */
static uint64_t table_bytes(const struct knob_block *block, uint64_t ram_bytes)
{
	uint64_t mapped = ram_bytes < GIB ? ram_bytes : GIB;

	if (!block->w[KW_MMU])
		return 0;
	if (block->w[KW_LEAF] == 30)
		return PAGE;
	if (block->w[KW_LEAF] == 21)
		return 2 * PAGE;
	return (2 + (mapped + (2ull << 20) - 1) / (2ull << 20)) * PAGE;
}

/* Counter ticks in US microseconds at CNTFRQ Hz. */
static uint64_t us_to_ticks(uint64_t us, uint64_t cntfrq)
{
	return (uint64_t)((unsigned __int128)us * cntfrq / 1000000u);
}

bool knobs_derive(struct knob_block *block, uint64_t ram_bytes, int vcpus, uint64_t cntfrq,
		  char *err, size_t size)
{
	uint64_t *w = block->w;
	uint64_t tables = table_bytes(block, ram_bytes);
	uint64_t table_base = RAM_START + ((ram_bytes - tables) & ~(PAGE - 1));
	uint64_t dose_end = RAM_START + DOSE_OFFSET + w[KW_PAGES] * PAGE;
	uint64_t touch_end = RAM_START + DOSE_OFFSET + (w[KW_TOUCH_KB] << 10) * (uint64_t)vcpus;
	uint64_t limit = tables ? table_base : RAM_START + ram_bytes;

	if (w[KW_LEAF] != 12 && w[KW_LEAF] != 21 && w[KW_LEAF] != 30) {
		snprintf(err, size, "knob leaf=%" PRIu64 ": expected 4k, 2m or 1g", w[KW_LEAF]);
		return false;
	}
	if (w[KW_SH] == 1) {
		snprintf(err, size, "knob sh: 1 is reserved; expected non, outer or inner");
		return false;
	}
	if (dose_end > limit || (w[KW_TOUCH] && touch_end > limit) || tables + (4ull << 20) >
	    ram_bytes) {
		snprintf(err, size, "--ram-mb %" PRIu64 " is too small for %" PRIu64 " dose pages, "
			 "%d vCPU slices of %" PRIu64 " KiB and %" PRIu64 " KiB of stage-1 tables (dose "
			 "and slices start at RAM + 2 MiB, tables sit at the top): raise --ram-mb",
			 ram_bytes >> 20, w[KW_PAGES], vcpus, w[KW_TOUCH_KB], tables >> 10);
		return false;
	}
	w[KW_MAIR] = 0xff00;		/* attr0 Device-nGnRnE, attr1 Normal WB RW-allocate */
	/* T0SZ=25 (walks start at level 1), 4 KiB granule, EPD1 (no TTBR1), IPS 40 bits. */
	w[KW_TCR] = 25 | w[KW_IRGN] << 8 | w[KW_ORGN] << 10 | w[KW_SH] << 12 | 1ull << 23 |
		    2ull << 32;
	w[KW_TTBR0] = tables ? table_base | w[KW_ASID] << 48 : 0;
	w[KW_SCTLR_BITS] = w[KW_MMU] ? 1 | (w[KW_CACHES] ? 1 << 2 | 1 << 12 : 0) : 0;
	w[KW_ON_TICKS] = us_to_ticks(w[KW_ON_US], cntfrq);
	w[KW_SPIN_TICKS] = us_to_ticks(w[KW_SPIN_US], cntfrq);
	w[KW_DOSE_BASE] = RAM_START + DOSE_OFFSET;
	w[KW_TLBI_ARG] = w[KW_ASID] << 48;
	return true;
}

/* Descriptor attributes: AttrIndx, inner shareable, access flag, nG by the knob. */
#define DESC_AF			(1ull << 10)
#define DESC_NG			(1ull << 11)
#define DESC_SH_INNER		(3ull << 8)
#define DESC_NORMAL		(1ull << 2 | DESC_SH_INNER | DESC_AF)
#define DESC_DEVICE		(0ull << 2 | DESC_AF | 1ull << 53 | 1ull << 54)	/* XN */

/* The table word at IPA in the host mapping RAM. */
static uint64_t *table_at(unsigned char *ram, uint64_t ipa)
{
	return (uint64_t *)(ram + (ipa - RAM_START));
}

void knobs_write_tables(const struct knob_block *block, unsigned char *ram, uint64_t ram_bytes)
{
	uint64_t tables = table_bytes(block, ram_bytes);
	uint64_t base = block->w[KW_TTBR0] & ((1ull << 48) - 1);
	uint64_t ng = block->w[KW_NG] ? DESC_NG : 0;
	uint64_t mapped = ram_bytes < GIB ? ram_bytes : GIB;
	uint64_t *l1, *l2;

	if (!tables)
		return;
	memset(ram + (base - RAM_START), 0, tables);
	l1 = table_at(ram, base);
	/* GB 0 (the doorbells) is a Device block whatever the leaf: only RAM varies. */
	l1[0] = 0 | 1 | DESC_DEVICE | ng;
	if (block->w[KW_LEAF] == 30) {
		l1[1] = RAM_START | 1 | DESC_NORMAL | ng;
		return;
	}
	l1[1] = (base + PAGE) | 3;
	l2 = table_at(ram, base + PAGE);
	for (uint64_t i = 0; i < 512; i++) {
		uint64_t ipa = RAM_START + (i << 21);

		if (block->w[KW_LEAF] == 21) {
			l2[i] = ipa | 1 | DESC_NORMAL | ng;
		} else if (ipa < RAM_START + mapped) {
			uint64_t l3_ipa = base + (2 + i) * PAGE;
			uint64_t *l3 = table_at(ram, l3_ipa);

			l2[i] = l3_ipa | 3;
			for (uint64_t j = 0; j < 512 && ipa + j * PAGE < RAM_START + mapped; j++)
				l3[j] = (ipa + j * PAGE) | 3 | DESC_NORMAL | ng;
		}
	}
}

const char *knobs_stage1(const struct knob_block *block)
{
	if (!block->w[KW_MMU])
		return "off";
	return block->w[KW_MMU_OFF] ? "on-then-off" : "on";
}

const char *knobs_tlbi_summary(const struct knob_block *block, char *buf, size_t size)
{
	char name[32];

	knob_format(block, KW_TLBI, name, sizeof(name));
	/* "loop-X": X issued --tlbi-count times rather than once (the old tlbi-loop name). */
	snprintf(buf, size, "%s%s", block->w[KW_TLBI] && block->w[KW_TLBI_COUNT] != 1 ? "loop-" :
		 "", name);
	return buf;
}
