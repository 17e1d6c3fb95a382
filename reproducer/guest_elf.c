// SPDX-License-Identifier: GPL-2.0-only
/* Read a guest ELF: check it, find its PT_LOAD segments and its tracekit variant note. */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vmm.h"

#define MAX_GUEST_FILE (64ull << 20)

/* Read the whole file into memory (guests are a few KiB; the cap catches mistakes). */
static void read_whole_file(const char *path, struct guest_image *image)
{
	struct stat st;
	size_t done = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		die(EXIT_BAD_GUEST, "guest %s: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		die(EXIT_BAD_GUEST, "guest %s: not a regular file (give a built guest, e.g. "
		    "build/guests/mmu-on.elf)", path);
	if ((uint64_t)st.st_size > MAX_GUEST_FILE)
		die(EXIT_BAD_GUEST, "guest %s: %lld bytes is too large for a guest ELF", path,
		    (long long)st.st_size);
	image->file_size = st.st_size;
	image->file = malloc(image->file_size + 1);
	if (!image->file)
		die(EXIT_SYSTEM, "out of memory reading %s", path);
	while (done < image->file_size) {
		ssize_t got = read(fd, image->file + done, image->file_size - done);

		if (got <= 0)
			die(EXIT_BAD_GUEST, "guest %s: read failed: %s", path,
			    got < 0 ? strerror(errno) : "file shrank");
		done += got;
	}
	close(fd);
}

/* True when [offset, offset + size) lies inside the file. */
static bool in_file(const struct guest_image *image, uint64_t offset, uint64_t size)
{
	return offset <= image->file_size && size <= image->file_size - offset;
}

/* Check the ELF header: 64-bit little-endian AArch64 executable. */
static const Elf64_Ehdr *check_header(const struct guest_image *image)
{
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *)image->file;
	const char *path = image->path;

	if (image->file_size < sizeof(*eh) || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0)
		die(EXIT_BAD_GUEST, "guest %s: not an ELF file (build the guests with make)", path);
	if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_ident[EI_DATA] != ELFDATA2LSB)
		die(EXIT_BAD_GUEST, "guest %s: not a 64-bit little-endian ELF", path);
	if (eh->e_machine != EM_AARCH64)
		die(EXIT_BAD_GUEST, "guest %s: ELF machine %u is not AArch64 (%u)", path,
		    eh->e_machine, EM_AARCH64);
	if (eh->e_type != ET_EXEC)
		die(EXIT_BAD_GUEST, "guest %s: not an executable ELF (type %u)", path, eh->e_type);
	if (eh->e_phentsize != sizeof(Elf64_Phdr) ||
	    !in_file(image, eh->e_phoff, (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr)))
		die(EXIT_BAD_GUEST, "guest %s: program headers lie outside the file", path);
	return eh;
}

/* Record one PT_LOAD segment after checking it fits in RAM below the marker area. */
static void add_segment(struct guest_image *image, const Elf64_Phdr *ph, uint64_t ram_bytes)
{
	const char *path = image->path;
	uint64_t limit = RAM_BASE + MARKER_OFFSET;
	struct guest_segment *seg;

	if (ph->p_filesz > ph->p_memsz || !in_file(image, ph->p_offset, ph->p_filesz))
		die(EXIT_BAD_GUEST, "guest %s: a PT_LOAD segment lies outside the file", path);
	if (ram_bytes < MARKER_OFFSET)
		limit = RAM_BASE + ram_bytes;
	if (ph->p_paddr < RAM_BASE || ph->p_memsz > limit - RAM_BASE ||
	    ph->p_paddr - RAM_BASE > limit - RAM_BASE - ph->p_memsz)
		die(EXIT_BAD_GUEST, "guest %s: segment 0x%llx-0x%llx is outside guest RAM below "
		    "the marker area (0x%llx-0x%llx); link guests at 0x40000000 with guest.ld",
		    path, (unsigned long long)ph->p_paddr,
		    (unsigned long long)(ph->p_paddr + ph->p_memsz), RAM_BASE,
		    (unsigned long long)limit);
	if (image->nsegments == (int)(sizeof(image->segments) / sizeof(image->segments[0])))
		die(EXIT_BAD_GUEST, "guest %s: too many PT_LOAD segments", path);
	seg = &image->segments[image->nsegments++];
	seg->ipa = ph->p_paddr;
	seg->file_size = ph->p_filesz;
	seg->mem_size = ph->p_memsz;
	seg->data = image->file + ph->p_offset;
}

/* Copy note value VALUE into FIELD (SIZE bytes); dies when it does not fit. */
static void note_string(const struct guest_image *image, const char *key, const char *value,
			char *field, size_t size)
{
	if (strlen(value) >= size)
		die(EXIT_BAD_GUEST, "guest %s: note %s longer than %zu bytes", image->path, key,
		    size - 1);
	memcpy(field, value, strlen(value) + 1);
}

/* Take the variant, marker, preset, revision and knob layout out of the note's lines. */
static void parse_note_desc(struct guest_image *image, const char *desc, size_t size)
{
	const char *p = desc, *end = desc + size;
	bool have_marker = false;

	while (p < end) {
		const char *eol = memchr(p, '\n', end - p);
		size_t len = (eol ? eol : end) - p;
		char line[256];

		if (len >= sizeof(line))
			len = sizeof(line) - 1;
		memcpy(line, p, len);
		line[len] = '\0';
		if (strncmp(line, "variant=", 8) == 0) {
			note_string(image, "variant", line + 8, image->variant,
				    sizeof(image->variant));
		} else if (strncmp(line, "preset=", 7) == 0) {
			note_string(image, "preset", line + 7, image->preset, sizeof(image->preset));
		} else if (strncmp(line, "revision=", 9) == 0) {
			note_string(image, "revision", line + 9, image->revision,
				    sizeof(image->revision));
		} else if (strncmp(line, "knobs=", 6) == 0) {
			image->knob_layout = atoi(line + 6);
		} else if (strncmp(line, "marker=", 7) == 0) {
			char *stop;

			errno = 0;
			image->marker = strtoull(line + 7, &stop, 0);
			have_marker = !errno && *stop == '\0' && stop != line + 7;
		}
		p = eol ? eol + 1 : end;
	}
	if (!image->variant[0] || !have_marker)
		die(EXIT_BAD_GUEST, "guest %s: the tracekit note lacks a valid variant= or marker= "
		    "line (see reproducer/README.md, 'The variant note')", image->path);
}

/* Walk the notes of one PT_NOTE segment; true if the tracekit note was found. */
static bool scan_notes(struct guest_image *image, const Elf64_Phdr *ph)
{
	uint64_t off = ph->p_offset, end = ph->p_offset + ph->p_filesz;

	if (!in_file(image, ph->p_offset, ph->p_filesz))
		die(EXIT_BAD_GUEST, "guest %s: PT_NOTE lies outside the file", image->path);
	while (end - off >= sizeof(Elf64_Nhdr)) {
		const Elf64_Nhdr *nh = (const Elf64_Nhdr *)(image->file + off);
		uint64_t name_off = off + sizeof(*nh);
		uint64_t desc_off = name_off + ((nh->n_namesz + 3ull) & ~3ull);
		uint64_t next = desc_off + ((nh->n_descsz + 3ull) & ~3ull);

		if (next > end)
			die(EXIT_BAD_GUEST, "guest %s: a note runs past its PT_NOTE", image->path);
		if (nh->n_type == NT_TRACEKIT_VARIANT && nh->n_namesz == 9 &&
		    memcmp(image->file + name_off, "tracekit", 9) == 0) {
			parse_note_desc(image, (const char *)image->file + desc_off, nh->n_descsz);
			return true;
		}
		off = next;
	}
	return false;
}

/* Check that the entry point is inside a loaded segment. */
static void check_entry(const struct guest_image *image)
{
	for (int i = 0; i < image->nsegments; i++) {
		const struct guest_segment *seg = &image->segments[i];

		if (image->entry >= seg->ipa && image->entry < seg->ipa + seg->file_size)
			return;
	}
	die(EXIT_BAD_GUEST, "guest %s: entry 0x%llx is not inside a loaded segment", image->path,
	    (unsigned long long)image->entry);
}

/* A knob guest's default block from the segment holding KNOB_BASE; checks its layout. */
static void load_default_knobs(struct guest_image *image)
{
	if (image->knob_layout != KNOB_LAYOUT)
		die(EXIT_BAD_GUEST, "guest %s: knob layout %d, this VMM reads layout %d; build the "
		    "guest and the VMM from the same tree", image->path, image->knob_layout,
		    KNOB_LAYOUT);
	for (int i = 0; i < image->nsegments; i++) {
		const struct guest_segment *seg = &image->segments[i];

		if (seg->ipa <= KNOB_BASE && KNOB_BASE + KNOB_BYTES <= seg->ipa + seg->file_size) {
			memcpy(&image->defaults, seg->data + (KNOB_BASE - seg->ipa), KNOB_BYTES);
			if (image->defaults.w[KW_MAGIC] == KNOB_MAGIC &&
			    image->defaults.w[KW_LAYOUT] == KNOB_LAYOUT)
				return;
		}
	}
	die(EXIT_BAD_GUEST, "guest %s: its note announces a knob block but none is at 0x%x; "
	    "rebuild it with make -C reproducer", image->path, KNOB_BASE);
}

/* Read PATH, check header, segments, note and entry; die on any problem. */
void guest_load_file(const char *path, uint64_t ram_bytes, struct guest_image *image)
{
	const Elf64_Ehdr *eh;
	bool found_note = false;

	memset(image, 0, sizeof(*image));
	image->path = path;
	strcpy(image->preset, "none");
	strcpy(image->revision, "unknown");
	read_whole_file(path, image);
	eh = check_header(image);
	image->entry = eh->e_entry;
	for (int i = 0; i < eh->e_phnum; i++) {
		const Elf64_Phdr *ph =
			(const Elf64_Phdr *)(image->file + eh->e_phoff) + i;

		if (ph->p_type == PT_LOAD && ph->p_memsz)
			add_segment(image, ph, ram_bytes);
		else if (ph->p_type == PT_NOTE && !found_note)
			found_note = scan_notes(image, ph);
	}
	if (!image->nsegments)
		die(EXIT_BAD_GUEST, "guest %s: no PT_LOAD segment to load", path);
	if (!found_note)
		die(EXIT_BAD_GUEST, "guest %s: no tracekit variant note (name \"tracekit\", type "
		    "0x%x); build guests from reproducer/guests", path, NT_TRACEKIT_VARIANT);
	check_entry(image);
	if (image->knob_layout)
		load_default_knobs(image);
}

/* Copy each PT_LOAD segment to its place in the RAM mapping. */
void guest_copy_to_ram(const struct guest_image *image, unsigned char *host)
{
	/* RAM comes from a fresh anonymous mapping, so the bss part is already zero. */
	for (int i = 0; i < image->nsegments; i++) {
		const struct guest_segment *seg = &image->segments[i];

		memcpy(host + (seg->ipa - RAM_BASE), seg->data, seg->file_size);
	}
}
