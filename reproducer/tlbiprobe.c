// SPDX-License-Identifier: GPL-2.0-only
/*
 * tlbiprobe: time syscalls that make the kernel issue broadcast TLB invalidations.
 *
 * Pinned to one CPU, it changes the protection of (or unmaps) memory that helper
 * threads on other CPUs keep reading, so the kernel must invalidate with TLBI ...IS
 * and wait with DSB ISH. A sample is the whole syscall, timed with CNTVCT_EL0 between
 * ISBs: the TLBI and DSB are inside it, with everything else the syscall does. The DSB
 * waits for every CPU of the inner-shareable domain, so a sample says which CPU issued,
 * never which CPU was slow to respond.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "probe.h"

static const char usage_text[] =
	"usage: tlbiprobe [options]\n"
	"  --cpu N              CPU the timed calls run on (default 0)\n"
	"  --helpers LIST       CPUs whose threads keep reading the memory, e.g. 1-3\n"
	"  --mode MODE          page (default), range or munmap\n"
	"  --pages N            pages for range and munmap (default 511: below the kernel's\n"
	"                       512-page by-VA limit; page mode: 1)\n"
	"  --samples N          timed calls to make (default 10000)\n"
	"  --duration S         make timed calls for S seconds instead\n"
	"  --out FILE           write every sample to FILE (format in README.md)\n"
	"  --trace-marker PATH  mark start and stop in this trace_marker file\n";

/* The command line. */
struct probe_options {
	int cpu;
	struct cpu_list helpers;
	enum probe_mode mode;
	uint64_t pages;
	uint64_t samples;
	uint64_t duration_s;
	const char *out_path;
	int trace_fd;
};

/* What the helper threads read: a fixed region, re-read until STOP is set. */
struct helper_shared {
	volatile unsigned char *base;
	size_t bytes;
	atomic_int ready;
	atomic_bool stop;
};

/* One helper thread's CPU and the shared region. */
struct helper {
	pthread_t thread;
	int cpu;
	struct helper_shared *shared;
};

/* The growing array of samples. */
struct sample_buffer {
	struct probe_sample *samples;
	uint64_t count;
	uint64_t capacity;
};

static long page_size;

/* Parse the mode name. */
static enum probe_mode parse_mode(const char *text)
{
	if (strcmp(text, "page") == 0)
		return MODE_PAGE;
	if (strcmp(text, "range") == 0)
		return MODE_RANGE;
	if (strcmp(text, "munmap") == 0)
		return MODE_MUNMAP;
	die(EXIT_USAGE, "--mode '%s': expected page, range or munmap", text);
}

/* Parse the command line into OPTS. */
static void parse_options(int argc, char **argv, struct probe_options *opts)
{
	static const struct option longopts[] = {
		{ "cpu", required_argument, NULL, 'c' },
		{ "helpers", required_argument, NULL, 'H' },
		{ "mode", required_argument, NULL, 'm' },
		{ "pages", required_argument, NULL, 'p' },
		{ "samples", required_argument, NULL, 'n' },
		{ "duration", required_argument, NULL, 'd' },
		{ "out", required_argument, NULL, 'o' },
		{ "trace-marker", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *marker_path = NULL;
	bool pages_given = false;
	int opt;

	/*
	 * 511, not 512: with 4 KiB pages and no FEAT_TLBIRANGE the kernel issues one TLBI
	 * per page only below 512 pages (MAX_TLBI_OPS on 6.1, MAX_DVM_OPS later, both
	 * PTRS_PER_PTE); at 512 it flushes the whole ASID with one TLBI ASIDE1IS instead.
	 */
	*opts = (struct probe_options){ .mode = MODE_PAGE, .pages = 511, .samples = 10000 };
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'c': opts->cpu = parse_u64("--cpu", optarg, 0, MAX_CPUS - 1); break;
		case 'H': parse_cpu_list(optarg, &opts->helpers); break;
		case 'm': opts->mode = parse_mode(optarg); break;
		case 'p': opts->pages = parse_u64("--pages", optarg, 1, 1 << 24);
			pages_given = true;
			break;
		case 'n': opts->samples = parse_u64("--samples", optarg, 1, 1ull << 32); break;
		case 'd': opts->duration_s = parse_u64("--duration", optarg, 1, 86400); break;
		case 'o': opts->out_path = optarg; break;
		case 't': marker_path = optarg; break;
		case 'h': fputs(usage_text, stdout); exit(EXIT_OK);
		default:
			die(EXIT_USAGE, "unknown or incomplete option '%s' (see --help)",
			    argv[optind - 1]);
		}
	}
	if (optind != argc)
		die(EXIT_USAGE, "unexpected argument '%s' (see --help)", argv[optind]);
	if (opts->mode == MODE_PAGE) {
		if (pages_given && opts->pages != 1)
			die(EXIT_USAGE, "--pages %llu: page mode uses one page; use --mode range",
			    (unsigned long long)opts->pages);
		opts->pages = 1;
	}
	for (int i = 0; i < opts->helpers.count; i++)
		if (opts->helpers.cpus[i] == opts->cpu)
			die(EXIT_USAGE, "--helpers includes the probe's own CPU %d: helpers must run "
			    "on other CPUs so the invalidation is broadcast to them", opts->cpu);
	opts->trace_fd = trace_marker_open(marker_path);
}

/* Helper thread: pin, then read one byte per page of the region until told to stop. */
static void *helper_thread(void *arg)
{
	struct helper *helper = arg;
	struct helper_shared *shared = helper->shared;
	int err = pin_to_cpu(helper->cpu);

	if (err)
		die(EXIT_USAGE, "cannot pin a helper to CPU %d: %s (is it online and allowed?)",
		    helper->cpu, strerror(err));
	atomic_fetch_add(&shared->ready, 1);
	while (!atomic_load_explicit(&shared->stop, memory_order_relaxed))
		for (size_t off = 0; off < shared->bytes; off += page_size)
			(void)shared->base[off];
	return NULL;
}

/*
 * What the regions' THP opt-out did: "nohugepage" once madvise accepted it, "unsupported"
 * on a kernel without THP (EINVAL: nothing to opt out of). Printed in the summary.
 */
static const char *thp_state = "nohugepage";

/*
 * Map N pages read-write and write one byte per page, so every PTE exists. 6.12's
 * __get_unmapped_area (mm/mmap.c) 2 MiB-aligns an anonymous mapping whose length is a
 * 2 MiB multiple (512 pages), which THP=always then maps huge, so mprotect/munmap would
 * take the huge-PMD paths; 6.1 does not align. Opt out before the first touch, so every
 * kernel maps (and invalidates) 4 KiB pages.
 */
static unsigned char *map_touched(uint64_t pages)
{
	size_t bytes = pages * page_size;
	unsigned char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die(EXIT_SYSTEM, "mmap of %llu pages: %s", (unsigned long long)pages,
		    strerror(errno));
	if (madvise(p, bytes, MADV_NOHUGEPAGE) != 0) {
		if (errno != EINVAL)
			die(EXIT_SYSTEM, "madvise(MADV_NOHUGEPAGE): %s", strerror(errno));
		thp_state = "unsupported";
	}
	for (uint64_t i = 0; i < pages; i++)
		p[i * page_size] = (unsigned char)i;
	return p;
}

/* Read one byte per page (the region is read-only now, but its PTEs stay live). */
static void read_pages(volatile unsigned char *p, uint64_t pages)
{
	for (uint64_t i = 0; i < pages; i++)
		(void)p[i * page_size];
}

/* Append one sample, growing the buffer as needed. */
static void add_sample(struct sample_buffer *buf, uint64_t timestamp, uint64_t ticks,
		       uint64_t hz, enum probe_direction direction)
{
	if (buf->count == buf->capacity) {
		buf->capacity = buf->capacity ? buf->capacity * 2 : 65536;
		buf->samples = realloc(buf->samples, buf->capacity * sizeof(*buf->samples));
		if (!buf->samples)
			die(EXIT_SYSTEM, "out of memory after %llu samples",
			    (unsigned long long)buf->count);
	}
	buf->samples[buf->count++] = (struct probe_sample){
		.timestamp_ns = timestamp,
		.duration_ns = (uint64_t)((unsigned __int128)ticks * 1000000000u / hz),
		.direction = direction,
	};
}

/* Time one mprotect of REGION to PROT (RW->RO or RO->RW, as DIRECTION says). */
static void timed_mprotect(struct sample_buffer *buf, void *region, size_t bytes, int prot,
			   uint64_t hz, enum probe_direction direction)
{
	uint64_t ts = now_ns(CLOCK_BOOTTIME), c0, c1;
	int ret;

	c0 = read_cntvct();
	ret = mprotect(region, bytes, prot);
	c1 = read_cntvct();
	if (ret)
		die(EXIT_SYSTEM, "mprotect: %s", strerror(errno));
	add_sample(buf, ts, c1 - c0, hz, direction);
}

/* One round of page/range mode: RW->RO and RO->RW, touching before each change. */
static void round_mprotect(struct sample_buffer *buf, unsigned char *region, uint64_t pages,
			   uint64_t hz)
{
	size_t bytes = pages * page_size;

	for (uint64_t i = 0; i < pages; i++)
		region[i * page_size]++;
	timed_mprotect(buf, region, bytes, PROT_READ, hz, DIRECTION_RW_TO_RO);
	read_pages(region, pages);
	timed_mprotect(buf, region, bytes, PROT_READ | PROT_WRITE, hz, DIRECTION_RO_TO_RW);
}

/* One round of munmap mode: map and touch a fresh region, time its munmap. */
static void round_munmap(struct sample_buffer *buf, uint64_t pages, uint64_t hz)
{
	unsigned char *region = map_touched(pages);
	uint64_t ts = now_ns(CLOCK_BOOTTIME), c0, c1;
	int ret;

	c0 = read_cntvct();
	ret = munmap(region, pages * page_size);
	c1 = read_cntvct();
	if (ret)
		die(EXIT_SYSTEM, "munmap: %s", strerror(errno));
	add_sample(buf, ts, c1 - c0, hz, DIRECTION_UNMAP);
}

/* Start the helpers on REGION and wait until each has read it once. */
static struct helper *start_helpers(const struct probe_options *opts,
				    struct helper_shared *shared)
{
	struct helper *helpers = calloc(opts->helpers.count + 1, sizeof(*helpers));

	if (!helpers)
		die(EXIT_SYSTEM, "out of memory for %d helpers", opts->helpers.count);

	for (int i = 0; i < opts->helpers.count; i++) {
		helpers[i] = (struct helper){ .cpu = opts->helpers.cpus[i], .shared = shared };
		if (pthread_create(&helpers[i].thread, NULL, helper_thread, &helpers[i]))
			die(EXIT_SYSTEM, "cannot start helper thread %d", i);
	}
	while (atomic_load(&shared->ready) < opts->helpers.count)
		sched_yield();
	return helpers;
}

/* Run the timed calls until the sample count or the duration is reached. */
static void measure(const struct probe_options *opts, unsigned char *region, uint64_t hz,
		    struct sample_buffer *buf)
{
	uint64_t start = now_ns(CLOCK_BOOTTIME);
	uint64_t end = start + opts->duration_s * 1000000000ull;

	for (;;) {
		if (opts->mode == MODE_MUNMAP)
			round_munmap(buf, opts->pages, hz);
		else
			round_mprotect(buf, region, opts->pages, hz);
		if (opts->duration_s ? now_ns(CLOCK_BOOTTIME) >= end : buf->count >= opts->samples)
			break;
	}
	/* mprotect rounds add two samples; keep exactly --samples. */
	if (!opts->duration_s && buf->count > opts->samples)
		buf->count = opts->samples;
}

/* Pin, start the helpers, measure, then write the file and the summary. */
int main(int argc, char **argv)
{
	struct probe_options opts;
	struct helper_shared shared = { 0 };
	struct sample_buffer buf = { 0 };
	struct probe_header header = { .magic = PROBE_MAGIC };
	struct probe_sync sync = { 0 };
	struct helper *helpers;
	unsigned char *region, *live_page;
	uint64_t hz = read_cntfrq();
	char helper_text[256] = "";
	int err;

	set_program_name("tlbiprobe");
	page_size = sysconf(_SC_PAGESIZE);
	parse_options(argc, argv, &opts);
	if (!hz)
		die(EXIT_SYSTEM, "CNTFRQ_EL0 reads 0: the firmware did not set the counter "
		    "frequency, so ticks cannot be converted to ns");
	err = pin_to_cpu(opts.cpu);
	if (err)
		die(EXIT_USAGE, "cannot pin to CPU %d: %s (is it online and allowed?)", opts.cpu,
		    strerror(err));
	format_cpu_list(&opts.helpers, helper_text, sizeof(helper_text));

	/* munmap mode unmaps its regions, so helpers keep a separate page live instead. */
	live_page = map_touched(1);
	region = opts.mode == MODE_MUNMAP ? NULL : map_touched(opts.pages);
	shared.base = region ? region : live_page;
	shared.bytes = (region ? opts.pages : 1) * page_size;
	helpers = start_helpers(&opts, &shared);

	trace_marker(opts.trace_fd, "tracekit-probe: event=start mode=%s cpu=%d pages=%llu "
		     "helpers=%s", probe_mode_name(opts.mode), opts.cpu,
		     (unsigned long long)opts.pages, helper_text[0] ? helper_text : "none");
	/* Pinned: both markers run on the probe CPU, bracketing the samples. */
	gt_sync_mark(&sync.start);
	measure(&opts, region, hz, &buf);
	gt_sync_mark(&sync.stop);
	trace_marker(opts.trace_fd, "tracekit-probe: event=stop count=%llu",
		     (unsigned long long)buf.count);

	atomic_store(&shared.stop, true);
	for (int i = 0; i < opts.helpers.count; i++)
		pthread_join(helpers[i].thread, NULL);
	header = (struct probe_header){
		.magic = PROBE_MAGIC, .version = PROBE_VERSION, .header_size = PROBE_HEADER_SIZE,
		.record_size = sizeof(struct probe_sample), .cpu = opts.cpu, .mode = opts.mode,
		.pages = opts.pages, .counter_hz = hz, .count = buf.count,
		.clock_id = CLOCK_BOOTTIME, .helpers = opts.helpers.count,
	};
	if (opts.out_path)
		probe_write_file(opts.out_path, &header, buf.samples);
	probe_print_summary(stdout, &header, helper_text, thp_state, buf.samples, &sync);
	return EXIT_OK;
}
