// SPDX-License-Identifier: GPL-2.0-only
/*
 * tkgt: a QEMU TCG plugin that logs, per emulated CPU, every TLB invalidation, DSB,
 * IC IALLU/IALLUIS and tracekit's marker HINT the emulated arm64 machine executes.
 *
 * Filtering happens at translation time on the instruction word, so only those
 * instructions get an execution callback; everything else runs at full TCG speed.
 * The log is a file of fixed 32-byte records behind a 64-byte header (format in
 * docs/tables.md, "Ground-truth log"), mapped shared and filled lock-free: a slot is
 * reserved with one atomic add, so vCPU threads never wait for each other. The file
 * holds at most `limit` records, the last 4096 slots kept for markers (so a full log
 * still aligns its clock); reservations past either bound are counted, never lost
 * silently, and the header says how many. At exit the markers move up behind the other
 * records and the file is cut after them.
 *
 * Arguments: out=FILE (required), limit=N (records, default 16777216 = 512 MiB),
 * sim=MODEL simlog=FILE (both or neither: a simulated mechanism, tksim.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <qemu-plugin.h>

#include "tkgt.h"
#include "tksim.h"

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

static struct tkgt_header *header;
static struct tkgt_record *records;
static uint64_t capacity;
static size_t map_size;
static int log_fd = -1;

/* What translation found about one instruction; handed to its execution callback. */
struct site {
	uint64_t vaddr;
	uint64_t haddr;
	uint32_t insn;
	uint8_t kind;	/* 0: not logged (only the simulation wants it) */
	uint8_t flags;
	uint8_t sim;	/* enum tksim_role */
};

/*
 * Sites are interned by (vaddr, haddr, insn): a retranslated block (TB flush, another
 * CPU) reuses its site instead of growing memory on every translation.
 */
#define SITE_SLOTS (1u << 18)
static struct site *sites[SITE_SLOTS];
static pthread_mutex_t sites_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t site_hash(uint64_t vaddr, uint64_t haddr)
{
	uint64_t h = (vaddr ^ (haddr * 0x9e3779b97f4a7c15ull)) * 0xff51afd7ed558ccdull;

	return h ^ (h >> 29);
}

static struct site *intern_site(const struct site *want)
{
	uint64_t i = site_hash(want->vaddr, want->haddr);
	struct site *found = NULL;
	uint32_t probe;

	pthread_mutex_lock(&sites_lock);
	for (probe = 0; probe < SITE_SLOTS && !found; probe++) {
		struct site **slot = &sites[(i + probe) & (SITE_SLOTS - 1)];

		if (*slot == NULL) {
			*slot = malloc(sizeof(**slot));
			if (*slot)
				**slot = *want;
			found = *slot;
		} else if ((*slot)->vaddr == want->vaddr && (*slot)->haddr == want->haddr &&
			   (*slot)->insn == want->insn) {
			found = *slot;
		}
	}
	pthread_mutex_unlock(&sites_lock);
	/* A full table (2^18 distinct sites) falls back to one allocation per translation. */
	if (!found) {
		found = malloc(sizeof(*found));
		if (found)
			*found = *want;
	}
	return found;
}

static void log_record(unsigned int vcpu, const struct site *site);

static void on_exec(unsigned int vcpu, void *udata)
{
	const struct site *site = udata;

	/* The simulation's delay comes after the record: the log keeps the DSB's start. */
	if (site->kind)
		log_record(vcpu, site);
	if (site->sim)
		tksim_exec(vcpu, site->sim, site->vaddr);
}

static void log_record(unsigned int vcpu, const struct site *site)
{
	struct timespec now;
	uint64_t slot;
	struct tkgt_record *rec;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if (site->kind == TKGT_MARK) {
		slot = __atomic_fetch_add(&header->markers_reserved, 1, __ATOMIC_RELAXED);
		if (slot >= header->marker_capacity)
			return; /* counted, like the others */
		slot += capacity - header->marker_capacity;
	} else {
		slot = __atomic_fetch_add(&header->reserved, 1, __ATOMIC_RELAXED);
		if (slot >= capacity - header->marker_capacity)
			return; /* counted: reserved past the bound were not written */
	}
	rec = &records[slot];
	rec->vaddr = site->vaddr;
	rec->haddr = site->haddr;
	rec->insn = site->insn;
	rec->vcpu = (uint16_t)vcpu;
	rec->kind = site->kind;
	rec->flags = site->flags;
	/* The timestamp goes last: a slot with ts 0 was reserved but never filled. */
	__atomic_store_n(&rec->ts_ns, (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec,
			 __ATOMIC_RELEASE);
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
	size_t n = qemu_plugin_tb_n_insns(tb);
	size_t i;

	(void)id;
	for (i = 0; i < n; i++) {
		struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
		struct site want;
		uint32_t word;

		/* Every 4-byte word goes through the A64 classifier: AArch32 code (A32/T32,
		 * e.g. an A32 STRLE matches the TLBI mask; MCR p15 c8 is never seen) is not
		 * told apart, as the 7.2 API says nothing of the ISA (docs/tables.md). */
		if (qemu_plugin_insn_size(insn) != 4)
			continue;
		memcpy(&word, qemu_plugin_insn_data(insn), 4);
		want.vaddr = qemu_plugin_insn_vaddr(insn);
		if (!tkgt_classify(word, &want.kind, &want.flags))
			want.kind = want.flags = 0;
		want.sim = tksim_role(word, want.vaddr, want.kind, want.flags);
		if (!want.kind && !want.sim)
			continue;
		want.haddr = (uint64_t)(uintptr_t)qemu_plugin_insn_haddr(insn);
		want.insn = word;
		struct site *site = intern_site(&want);
		if (!site) {
			/* Out of memory: count the instruction's executions as unknown. */
			__atomic_fetch_add(&header->untracked_sites, 1, __ATOMIC_RELAXED);
			continue;
		}
		qemu_plugin_register_vcpu_insn_exec_cb(insn, on_exec, QEMU_PLUGIN_CB_NO_REGS, site);
	}
}

static void at_exit(qemu_plugin_id_t id, void *udata)
{
	uint64_t kept, regular, marks;

	(void)id;
	(void)udata;
	regular = capacity - header->marker_capacity;
	kept = header->reserved < regular ? header->reserved : regular;
	marks = header->markers_reserved < header->marker_capacity ? header->markers_reserved :
								      header->marker_capacity;
	/* The markers' slots move up behind the other records: the file has no hole. */
	memmove(&records[kept], &records[regular], marks * sizeof(struct tkgt_record));
	kept += marks;
	tksim_finish();
	header->complete = 1;
	msync(header, map_size, MS_SYNC);
	munmap(header, map_size);
	/* The unused tail goes: the file ends after the last record written. */
	if (ftruncate(log_fd, (off_t)(sizeof(struct tkgt_header) + kept * sizeof(struct tkgt_record))))
		fprintf(stderr, "tkgt: cannot trim the log: %s\n", strerror(errno));
	close(log_fd);
}

static int open_log(const char *path, uint64_t limit)
{
	capacity = limit;
	map_size = sizeof(struct tkgt_header) + limit * sizeof(struct tkgt_record);
	log_fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (log_fd < 0 || ftruncate(log_fd, (off_t)map_size)) {
		fprintf(stderr, "tkgt: cannot create %s: %s\n", path, strerror(errno));
		return -1;
	}
	header = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, log_fd, 0);
	if (header == MAP_FAILED) {
		fprintf(stderr, "tkgt: cannot map %s: %s\n", path, strerror(errno));
		return -1;
	}
	memcpy(header->magic, TKGT_MAGIC, sizeof(header->magic));
	header->version = TKGT_VERSION;
	header->record_size = sizeof(struct tkgt_record);
	header->capacity = limit;
	/* A tiny log keeps at most half of itself for markers. */
	header->marker_capacity = limit / 2 < TKGT_MARKER_SLOTS ? (uint32_t)(limit / 2) : TKGT_MARKER_SLOTS;
	header->clock = CLOCK_MONOTONIC;
	records = (struct tkgt_record *)(header + 1);
	return 0;
}

/* Register the callbacks: at install, and again after the simulation's qemu_plugin_reset. */
static void arm(qemu_plugin_id_t id)
{
	qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
	qemu_plugin_register_atexit_cb(id, at_exit, NULL);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
					   char **argv)
{
	const char *out = NULL, *sim = NULL, *simlog = NULL;
	uint64_t limit = TKGT_DEFAULT_LIMIT;
	int i;

	if (strcmp(info->target_name, "aarch64") != 0) {
		fprintf(stderr, "tkgt: target is %s, not aarch64\n", info->target_name);
		return -1;
	}
	for (i = 0; i < argc; i++) {
		if (strncmp(argv[i], "out=", 4) == 0) {
			out = argv[i] + 4;
		} else if (strncmp(argv[i], "sim=", 4) == 0) {
			sim = argv[i] + 4;
		} else if (strncmp(argv[i], "simlog=", 7) == 0) {
			simlog = argv[i] + 7;
		} else if (strncmp(argv[i], "limit=", 6) == 0) {
			char *end;

			limit = strtoull(argv[i] + 6, &end, 10);
			if (*end || limit == 0 || limit > TKGT_MAX_LIMIT) {
				fprintf(stderr, "tkgt: limit=%s: want 1..%llu records\n", argv[i] + 6,
					(unsigned long long)TKGT_MAX_LIMIT);
				return -1;
			}
		} else {
			fprintf(stderr, "tkgt: unknown argument %s (want out=FILE, limit=N, sim=MODEL, simlog=FILE)\n", argv[i]);
			return -1;
		}
	}
	if (!out) {
		fprintf(stderr, "tkgt: out=FILE is required\n");
		return -1;
	}
	if (!sim != !simlog) {
		fprintf(stderr, "tkgt: sim=MODEL and simlog=FILE go together\n");
		return -1;
	}
	if (open_log(out, limit))
		return -1;
	header->vcpus = (uint32_t)info->system.max_vcpus;
	/* qemu-user reports no vCPU bound: its threads are vCPUs, numbered from 0. */
	if (sim && tksim_load(sim, simlog, info->system_emulation ? header->vcpus : TKSIM_MAX_VCPUS,
			      info->system_emulation) < 0)
		return -1;
	tksim_set_plugin(id, arm);
	arm(id);
	return 0;
}
