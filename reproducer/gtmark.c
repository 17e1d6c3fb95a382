// SPDX-License-Identifier: GPL-2.0-only
/*
 * gtmark: executes tracekit's ground-truth marker (HINT #0x77, a NOP architecturally)
 * on each chosen CPU in turn and prints, for each, CLOCK_BOOTTIME just before and just
 * after it. The QEMU plugin logs the same instruction with the x86 host's clock and
 * the vCPU that ran it: pairs of the two fit one clock to the other per boot, and the
 * CPU each marker was pinned to checks QEMU's vCPU index -> Linux CPU mapping.
 *
 * The marker's identity travels in its address: a table of 64 "hint #0x77; ret" pairs,
 * 512-byte aligned, entered at slot (cpu % 63), so the plugin's logged VA gives
 * (VA >> 3) & 63 without reading any register (slot 63 is the VMM's and the probe's
 * sync marker, common.c gt_sync_mark). The entries, reached by BLR, have no
 * `bti c` (it would not fit the 8-byte slot), so gtmark is built with
 * -mbranch-protection=none (Makefile): never mapped PROT_BTI, even on FEAT_BTI cores.
 *
 * Output, one line per marker (stdout):
 *   gtmark seq=S cpu=C slot=K t0=NS t1=NS
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gtmark.h"

__asm__(".text\n"
	".balign 512\n"
	".globl gt_marker_table\n"
	"gt_marker_table:\n"
	".rept " GT_SLOTS_STR "\n"
	"hint #" GT_HINT_STR "\n"
	"ret\n"
	".endr\n");

extern char gt_marker_table[];

static const char usage_text[] =
	"usage: gtmark [--cpus LIST] [--rounds N] [--trace-marker PATH]\n"
	"  --cpus LIST         CPUs to run the marker on, in turn (default: every CPU\n"
	"                      this process may use)\n"
	"  --rounds N          markers per CPU (default 4)\n"
	"  --trace-marker PATH also write each marker into this tracefs trace_marker\n";

/* Execute the marker at `slot` of the table. */
static void run_marker(unsigned int slot)
{
	void (*entry)(void) = (void (*)(void))(gt_marker_table + GT_SLOT_BYTES * slot);

	entry();
}

/* The CPUs this process may run on, in increasing order. */
static void allowed_cpus(struct cpu_list *out)
{
	cpu_set_t set;
	int cpu;

	if (sched_getaffinity(0, sizeof(set), &set))
		die(EXIT_SYSTEM, "sched_getaffinity: %s", strerror(errno));
	out->count = 0;
	for (cpu = 0; cpu < CPU_SETSIZE && out->count < MAX_CPUS; cpu++)
		if (CPU_ISSET(cpu, &set))
			out->cpus[out->count++] = cpu;
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{ "cpus", required_argument, NULL, 'c' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "trace-marker", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static struct cpu_list cpus;
	const char *marker_path = NULL;
	uint64_t rounds = 4, seq = 0, round;
	int opt, i, err, marker_fd;

	set_program_name("gtmark");
	allowed_cpus(&cpus);
	while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
		switch (opt) {
		case 'c':
			parse_cpu_list(optarg, &cpus);
			break;
		case 'r':
			rounds = parse_u64("--rounds", optarg, 1, 100000);
			break;
		case 't':
			marker_path = optarg;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return EXIT_OK;
		default:
			fputs(usage_text, stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc)
		die(EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
	marker_fd = trace_marker_open(marker_path);
	for (i = 0; i < cpus.count; i++) {
		int cpu = cpus.cpus[i];
		unsigned int slot = (unsigned int)cpu % GT_CPU_SLOTS;

		err = pin_to_cpu(cpu);
		if (err)
			die(EXIT_SYSTEM, "cannot pin to CPU %d: %s", cpu, strerror(err));
		for (round = 0; round < rounds; round++, seq++) {
			uint64_t t0 = now_ns(CLOCK_BOOTTIME), t1;

			run_marker(slot);
			t1 = now_ns(CLOCK_BOOTTIME);
			printf("gtmark seq=%llu cpu=%d slot=%u t0=%llu t1=%llu\n",
			       (unsigned long long)seq, cpu, slot, (unsigned long long)t0,
			       (unsigned long long)t1);
			trace_marker(marker_fd, "tracekit gtmark seq=%llu cpu=%d t0=%llu t1=%llu",
				     (unsigned long long)seq, cpu, (unsigned long long)t0,
				     (unsigned long long)t1);
		}
	}
	return fflush(stdout) ? EXIT_SYSTEM : EXIT_OK;
}
