// SPDX-License-Identifier: GPL-2.0-only
/*
 * tracekit-vmm: a minimal KVM VMM for arm64. It loads one guest (an ELF with a tracekit
 * note), writes its knob block (the preset, --preset, --knob), runs it on one or more
 * vCPUs until PSCI SYSTEM_OFF, checks the markers the vCPUs wrote, and prints key=value
 * lines (reproducer/README.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/kvm.h>

#include "vmm.h"

static const char usage_text[] =
	"usage: vmm [options] GUEST.elf\n"
	"  --vcpus N            vCPUs (default 1)\n"
	"  --cpus LIST          pin vCPU i to the i-th CPU of LIST (cycled), e.g. 0-2,5\n"
	"  --ram-mb N           guest RAM at IPA 0x40000000 (default 16)\n"
	"  --ipa-bits LIST      requested IPA sizes, cycled over the VMs, e.g. 40,48\n"
	"  --preset NAME        run the guest as preset NAME (default: the ELF's own)\n"
	"  --knob NAME=VALUE    set one knob over the preset (repeatable; README)\n"
	"  --tlbi-count N       knob tlbi_count: TLBIs the guest issues (preset's)\n"
	"  --spin-us N          knob spin_us: spin on CNTVCT before the marker (0)\n"
	"  --touch-kb N         knob touch_kb: KiB each vCPU touches (cache-toggle; 0)\n"
	"  --backing KIND       guest RAM: default, 4k, thp or hugetlb\n"
	"  --dump-knobs FILE    write the knob block to FILE and print the run line only\n"
	"  --repeat N           create, run and tear down N VMs in turn (default 1)\n"
	"  --timeout S          watchdog for each run phase, 0 = none (default 60)\n"
	"  --clock NAME         boottime (default) or monotonic\n"
	"  --trace-marker PATH  write VM lifecycle markers to this trace_marker file\n"
	"  --hold-vm            keep one idle VM (no vCPU, never run) open over the series\n";

/* Empty handler: SIGUSR1 only exists to make KVM_RUN return with EINTR. */
static void on_kick(int sig)
{
	(void)sig;
}

/* Parse --ipa-bits "40,48" into OPTS (range checked later against the host). */
static void parse_ipa_list(const char *text, struct vmm_options *opts)
{
	char *copy = strdup(text), *save = NULL;

	opts->ipa_count = 0;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (opts->ipa_count == MAX_IPA_LIST)
			die(EXIT_USAGE, "--ipa-bits: at most %d sizes", MAX_IPA_LIST);
		opts->ipa_bits[opts->ipa_count++] = parse_u64("--ipa-bits", tok, 32, 52);
	}
	if (!opts->ipa_count)
		die(EXIT_USAGE, "--ipa-bits '%s': give sizes in bits, e.g. 40 or 40,48", text);
	free(copy);
}

/* Parse --backing. */
static enum backing parse_backing(const char *text)
{
	static const enum backing all[] = { BACKING_DEFAULT, BACKING_4K, BACKING_THP,
					    BACKING_HUGETLB };

	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (strcmp(text, backing_name(all[i])) == 0)
			return all[i];
	die(EXIT_USAGE, "--backing '%s': expected default, 4k (MADV_NOHUGEPAGE), thp "
	    "(2 MiB aligned, MADV_HUGEPAGE) or hugetlb (MAP_HUGETLB)", text);
}

/* Remember one --knob assignment (checked once the guest's block is known). */
static void add_knob_arg(struct vmm_options *opts, const char *text)
{
	if (opts->knob_count == MAX_KNOB_ARGS)
		die(EXIT_USAGE, "--knob: at most %d assignments", MAX_KNOB_ARGS);
	opts->knob_args[opts->knob_count++] = text;
}

/* Parse the command line into OPTS; dies with EXIT_USAGE on mistakes. */
static void parse_options(int argc, char **argv, struct vmm_options *opts)
{
	static const struct option longopts[] = {
		{ "vcpus", required_argument, NULL, 'v' },
		{ "cpus", required_argument, NULL, 'c' },
		{ "ram-mb", required_argument, NULL, 'r' },
		{ "ipa-bits", required_argument, NULL, 'i' },
		{ "tlbi-count", required_argument, NULL, 'n' },
		{ "spin-us", required_argument, NULL, 's' },
		{ "touch-kb", required_argument, NULL, 'k' },
		{ "repeat", required_argument, NULL, 'R' },
		{ "timeout", required_argument, NULL, 't' },
		{ "clock", required_argument, NULL, 'C' },
		{ "trace-marker", required_argument, NULL, 'm' },
		{ "preset", required_argument, NULL, 'p' },
		{ "knob", required_argument, NULL, 'K' },
		{ "backing", required_argument, NULL, 'b' },
		{ "dump-knobs", required_argument, NULL, 'd' },
		{ "hold-vm", no_argument, NULL, 'H' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *marker_path = NULL;
	int opt;

	*opts = (struct vmm_options){ .ram_bytes = 16ull << 20, .vcpus = 1, .repeat = 1,
				      .timeout_s = 60, .clock = CLOCK_BOOTTIME, .trace_fd = -1 };
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'v': opts->vcpus = parse_u64("--vcpus", optarg, 1, MAX_VCPUS); break;
		case 'c': parse_cpu_list(optarg, &opts->cpus); break;
		case 'r': opts->ram_bytes = parse_u64("--ram-mb", optarg, 4, 1 << 20) << 20; break;
		case 'i': parse_ipa_list(optarg, opts); break;
		case 'n': opts->tlbi_count = parse_u64("--tlbi-count", optarg, 0, UINT32_MAX);
			opts->tlbi_count_set = true;
			break;
		case 's': opts->spin_us = parse_u64("--spin-us", optarg, 0, 3600000000ull);
			opts->spin_set = true;
			break;
		case 'k': opts->touch_bytes = parse_u64("--touch-kb", optarg, 0, 1 << 20) << 10;
			opts->touch_set = true;
			break;
		case 'p': opts->preset = optarg; break;
		case 'K': add_knob_arg(opts, optarg); break;
		case 'b': opts->backing = parse_backing(optarg); break;
		case 'd': opts->dump_knobs = optarg; break;
		case 'H': opts->hold_vm = true; break;
		case 'R': opts->repeat = parse_u64("--repeat", optarg, 1, 100000000); break;
		case 't': opts->timeout_s = parse_u64("--timeout", optarg, 0, 86400); break;
		case 'C': opts->clock = parse_clock(optarg); break;
		case 'm': marker_path = optarg; break;
		case 'h': fputs(usage_text, stdout); exit(EXIT_OK);
		default:
			die(EXIT_USAGE, "unknown or incomplete option '%s' (see --help)",
			    argv[optind - 1]);
		}
	}
	if (optind != argc - 1)
		die(EXIT_USAGE, "give exactly one guest ELF, e.g. build/guests/mmu-on.elf "
		    "(see --help)");
	opts->guest_path = argv[optind];
	opts->trace_fd = trace_marker_open(marker_path);
}

/* Check the options against the guest RAM layout and the host's KVM limits. */
static void check_options(const struct vmm_options *opts, const struct kvm_host *host)
{
	uint64_t marker_end = MARKER_OFFSET + 8ull * opts->vcpus;
	uint64_t touch_end = TOUCH_OFFSET + opts->touch_bytes * opts->vcpus;

	if (marker_end > opts->ram_bytes || touch_end > opts->ram_bytes)
		die(EXIT_USAGE, "--ram-mb %llu is too small: %d vCPUs touching %llu KiB each need "
		    "%llu KiB of RAM (markers at +1 MiB, slices at +2 MiB)",
		    (unsigned long long)(opts->ram_bytes >> 20), opts->vcpus,
		    (unsigned long long)(opts->touch_bytes >> 10),
		    (unsigned long long)((touch_end > marker_end ? touch_end : marker_end) >> 10));
	if (opts->vcpus > host->max_vcpus)
		die(EXIT_USAGE, "--vcpus %d: this host's KVM allows at most %d", opts->vcpus,
		    host->max_vcpus);
	if (!opts->ipa_count && RAM_BASE + opts->ram_bytes > 1ull << 40)
		die(EXIT_USAGE, "--ram-mb %llu does not fit in the default 40-bit IPA space",
		    (unsigned long long)(opts->ram_bytes >> 20));
	for (int i = 0; i < opts->ipa_count; i++) {
		int bits = opts->ipa_bits[i];

		if (bits != 40 && bits > host->max_ipa_bits)
			die(EXIT_IPA_SIZE, "--ipa-bits %d: this host's KVM supports at most %d bits "
			    "(KVM_CAP_ARM_VM_IPA_SIZE)", bits,
			    host->max_ipa_bits ? host->max_ipa_bits : 40);
		if (RAM_BASE + opts->ram_bytes > 1ull << bits)
			die(EXIT_USAGE, "--ipa-bits %d is too small for RAM ending at 0x%llx", bits,
			    (unsigned long long)(RAM_BASE + opts->ram_bytes));
	}
}

/* The preset list, "a, b, c", for error messages. */
static void list_presets(char *buf, size_t size)
{
	size_t used = 0;

	buf[0] = '\0';
	for (int i = 0; i < preset_count && used < size; i++)
		used += snprintf(buf + used, size - used, "%s%s", i ? ", " : "", presets[i].name);
}

/* The block the guest gets: its preset (or --preset), the knob options, then --knob. */
static void resolve_knobs(struct vmm_options *opts, struct guest_image *image, uint64_t cntfrq)
{
	struct knob_block *block = &opts->knobs;
	char err[512];

	if (!image->knob_layout) {
		if (opts->preset || opts->knob_count)
			die(EXIT_USAGE, "guest %s has no knob block (built before the parametric "
			    "guest): rebuild it with make -C reproducer, or drop --preset/--knob",
			    image->path);
		opts->spin_ticks = (uint64_t)((unsigned __int128)opts->spin_us * cntfrq / 1000000);
		return;
	}
	*block = image->defaults;
	if (opts->preset) {
		const struct preset *preset = preset_find(opts->preset);

		if (!preset) {
			list_presets(err, sizeof(err));
			die(EXIT_USAGE, "--preset '%s': expected one of %s", opts->preset, err);
		}
		if (!knobs_from_preset(block, preset, err, sizeof(err)))
			die(EXIT_USAGE, "--preset %s: %s", opts->preset, err);
		snprintf(image->preset, sizeof(image->preset), "%s", preset->name);
	}
	if (opts->tlbi_count_set)
		block->w[KW_TLBI_COUNT] = opts->tlbi_count;
	if (opts->touch_set)
		block->w[KW_TOUCH_KB] = opts->touch_bytes >> 10;
	if (opts->spin_set)
		block->w[KW_SPIN_US] = opts->spin_us;
	for (int i = 0; i < opts->knob_count; i++)
		if (!knob_assign(block, opts->knob_args[i], err, sizeof(err)))
			die(EXIT_USAGE, "--knob %s", err);
	if (!knobs_derive(block, opts->ram_bytes, opts->vcpus, cntfrq, err, sizeof(err)))
		die(EXIT_USAGE, "%s", err);
	/* The entry registers and the run line show what the block says. */
	opts->knobbed = true;
	opts->tlbi_count = block->w[KW_TLBI_COUNT];
	opts->touch_bytes = block->w[KW_TOUCH_KB] << 10;
	opts->spin_us = block->w[KW_SPIN_US];
	opts->spin_ticks = block->w[KW_SPIN_TICKS];
	image->marker = block->w[KW_MARKER];
}

/* hugetlb RAM comes in whole 2 MiB pages. */
static void check_backing(const struct vmm_options *opts)
{
	if (opts->backing == BACKING_HUGETLB && opts->ram_bytes % (2ull << 20))
		die(EXIT_USAGE, "--backing hugetlb needs --ram-mb to be a multiple of 2 (whole "
		    "2 MiB huge pages)");
}

/* Write the resolved knob block to PATH (--dump-knobs). */
static void dump_knobs(const struct vmm_options *opts, const char *path)
{
	FILE *out = fopen(path, "wb");

	if (!opts->knobbed)
		die(EXIT_USAGE, "--dump-knobs: guest %s has no knob block", opts->guest_path);
	if (!out || fwrite(opts->knobs.w, KNOB_BYTES, 1, out) != 1 || fclose(out))
		die(EXIT_SYSTEM, "--dump-knobs %s: %s", path, strerror(errno));
}

/* The host's THP mode, the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled. */
static void read_thp_mode(char *buf, size_t size)
{
	FILE *in = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	char line[128] = "", *open, *close;

	snprintf(buf, size, "unknown");
	if (!in)
		return;
	if (fgets(line, sizeof(line), in) && (open = strchr(line, '[')) &&
	    (close = strchr(open, ']'))) {
		*close = '\0';
		snprintf(buf, size, "%s", open + 1);
	}
	fclose(in);
}

/* The rest of the run line: backing, preset, revision, every knob and what was set. */
static void print_knobs(const struct vmm_options *opts, const struct guest_image *image)
{
	char thp[32], value[64];

	read_thp_mode(thp, sizeof(thp));
	printf(" backing=%s thp=%s preset=", backing_name(opts->backing), thp);
	fprint_escaped(stdout, image->preset);
	printf(" revision=");
	fprint_escaped(stdout, image->revision);
	printf(" knobs=%d", opts->knobbed ? KNOB_LAYOUT : 0);
	if (opts->knobbed) {
		for (int word = KW_FIRST_KNOB; word <= KW_LAST_KNOB; word++) {
			/* These three are printed above under their old names already. */
			if (word == KW_TLBI_COUNT || word == KW_TOUCH_KB || word == KW_SPIN_US)
				continue;
			knob_format(&opts->knobs, word, value, sizeof(value));
			printf(" %s=%s", knob_name(word), value);
		}
		printf(" tcr=0x%llx ttbr0=0x%llx", (unsigned long long)opts->knobs.w[KW_TCR],
		       (unsigned long long)opts->knobs.w[KW_TTBR0]);
	}
	/* The names only (values are above); they were checked, so need no escaping. */
	printf(" knobs_set=");
	for (int i = 0; i < opts->knob_count; i++)
		printf("%s%.*s", i ? "," : "", (int)strcspn(opts->knob_args[i], "="),
		       opts->knob_args[i]);
	printf("%s\n", opts->knob_count ? "" : "none");
}

/* The first output line: what ran and with which parameters and clock. */
static void print_run_line(const struct vmm_options *opts, const struct guest_image *image,
			   uint64_t cntfrq)
{
	char cpus[256] = "none";

	if (opts->cpus.count)
		format_cpu_list(&opts->cpus, cpus, sizeof(cpus));
	printf("record=run format=1 guest=");
	fprint_escaped(stdout, image->path);
	printf(" variant=");
	fprint_escaped(stdout, image->variant);
	printf(" marker=0x%016llx vcpus=%d cpus=%s ram_mb=%llu ipa_bits=",
	       (unsigned long long)image->marker, opts->vcpus, cpus,
	       (unsigned long long)(opts->ram_bytes >> 20));
	if (!opts->ipa_count)
		printf("40");
	for (int i = 0; i < opts->ipa_count; i++)
		printf("%s%d", i ? "," : "", opts->ipa_bits[i]);
	printf(" tlbi_count=%llu spin_us=%llu spin_ticks=%llu touch_kb=%llu repeat=%llu "
	       "timeout_s=%llu clock=%s cntfrq_hz=%llu hold_vm=%d",
	       (unsigned long long)opts->tlbi_count, (unsigned long long)opts->spin_us,
	       (unsigned long long)opts->spin_ticks,
	       (unsigned long long)(opts->touch_bytes >> 10), (unsigned long long)opts->repeat,
	       (unsigned long long)opts->timeout_s, clock_name(opts->clock),
	       (unsigned long long)cntfrq, opts->hold_vm ? 1 : 0);
	print_knobs(opts, image);
	fflush(stdout);
}

/* Summary statistics of one duration over all VMs. */
static void print_stat(const char *name, const uint64_t *values, uint64_t count)
{
	uint64_t min = UINT64_MAX, max = 0;
	long double sum = 0;

	for (uint64_t i = 0; i < count; i++) {
		min = values[i] < min ? values[i] : min;
		max = values[i] > max ? values[i] : max;
		sum += values[i];
	}
	printf(" %s_min=%llu %s_mean=%llu %s_max=%llu", name, (unsigned long long)min, name,
	       (unsigned long long)(sum / count), name, (unsigned long long)max);
}

/* Durations of every VM of a --repeat run, for the summary line. */
struct vm_series {
	uint64_t *create;
	uint64_t *run;
	uint64_t *teardown;
	uint64_t done;
};

/* One record=vm line, printed (and flushed) as soon as the VM is gone. */
static void print_vm_line(uint64_t index, int bits, const struct vm_timing *t,
			  const struct vm_result *result)
{
	const char *how = result->code ? "error" : result->stopped ? "stopped" : "ok";

	const uint64_t *r = result->results;

	gt_sync_print("vmm", (long long)index, "create", &t->create_sync);
	gt_sync_print("vmm", (long long)index, "run", &t->run_sync);
	gt_sync_print("vmm", (long long)index, "teardown", &t->teardown_sync);
	printf("record=vm vm=%llu ipa_bits=%d create_start_ns=%llu create_ns=%llu run_ns=%llu "
	       "teardown_ns=%llu teardown_end_ns=%llu result=%s",
	       (unsigned long long)index, bits ? bits : 40, (unsigned long long)t->create_start,
	       (unsigned long long)t->create_ns, (unsigned long long)t->run_ns,
	       (unsigned long long)t->teardown_ns, (unsigned long long)t->teardown_end, how);
	/* What vCPU 0 of a knob guest reports it did (RW_* of guests/knobs.h). */
	if (result->has_results)
		printf(" sctlr_on=0x%llx guest_tcr=0x%llx guest_ttbr0=0x%llx pages_read=%llu "
		       "tlbis=%llu sctlr_end=0x%llx", (unsigned long long)r[RW_SCTLR_ON],
		       (unsigned long long)r[RW_TCR], (unsigned long long)r[RW_TTBR0],
		       (unsigned long long)r[RW_PAGES_READ], (unsigned long long)r[RW_TLBIS],
		       (unsigned long long)r[RW_SCTLR_END]);
	printf("\n");
	fflush(stdout);
}

/* Run opts->repeat VMs in turn, stopping at the first failure; return how it ended. */
static struct vm_result run_series(const struct kvm_host *host, const struct vmm_options *opts,
				   const struct guest_image *image, struct vm_series *series)
{
	struct vm_result result = { 0 };

	series->create = calloc(opts->repeat, sizeof(uint64_t));
	series->run = calloc(opts->repeat, sizeof(uint64_t));
	series->teardown = calloc(opts->repeat, sizeof(uint64_t));
	if (!series->create || !series->run || !series->teardown)
		die(EXIT_SYSTEM, "out of memory for %llu VM timings",
		    (unsigned long long)opts->repeat);
	for (uint64_t i = 0; i < opts->repeat && !result.code && !vmm_stop_signal; i++) {
		int bits = opts->ipa_count ? opts->ipa_bits[i % opts->ipa_count] : 0;
		struct vm_timing t = { 0 };

		result = vm_run_one(host, opts, image, (int)i, bits, &t);
		print_vm_line(i, bits, &t, &result);
		series->create[i] = t.create_ns;
		series->run[i] = t.run_ns;
		series->teardown[i] = t.teardown_ns;
		series->done++;
	}
	return result;
}

/* The record=summary line: VMs done, VMs that succeeded, whether a signal stopped the
 * series, then min/mean/max per phase. */
static void print_summary(const struct vm_series *series, bool last_not_ok)
{
	int sig = vmm_stop_signal;	/* read once: stopped= and the stop fields agree */

	printf("record=summary vms=%llu ok=%llu stopped=%d", (unsigned long long)series->done,
	       (unsigned long long)(last_not_ok ? series->done - 1 : series->done),
	       sig ? 1 : 0);
	stop_signals_print(stdout, sig);
	print_stat("create_ns", series->create, series->done);
	print_stat("run_ns", series->run, series->done);
	print_stat("teardown_ns", series->teardown, series->done);
	printf("\n");
	fflush(stdout);
}

/* End by the stop signal itself, so the parent sees how the VMM ended (after teardown). */
static void exit_by_stop_signal(void)
{
	signal(vmm_stop_signal, SIG_DFL);
	raise(vmm_stop_signal);
	exit(128 + vmm_stop_signal);	/* not reached unless the signal is blocked */
}

/*
 * --hold-vm: a VM with no vCPU, created before the series and closed after it. With
 * no other VM alive, each VM's create and destroy enables and disables virtualisation
 * on every CPU (KVM's usage count goes 0 -> 1 -> 0: EL2 init and reset, an IPI each
 * to every CPU) on a kernel that does not keep it enabled from module load (6.1, or
 * 6.12 with kvm.enable_virt_at_load=0). Holding one VM keeps the count above zero. It
 * never runs, so it gets no VMID. Returns its fd, closed at exit.
 */
static int hold_idle_vm(const struct kvm_host *host)
{
	int fd = ioctl(host->fd, KVM_CREATE_VM, 0);

	if (fd < 0)
		die(EXIT_SYSTEM, "--hold-vm: KVM_CREATE_VM: %s", strerror(errno));
	return fd;
}

/* Check everything that can be checked before the first VM, then run the series. */
int main(int argc, char **argv)
{
	struct vmm_options opts;
	struct kvm_host host;
	struct guest_image image;
	struct vm_series series = { 0 };
	struct sigaction kick = { .sa_handler = on_kick };	/* no SA_RESTART */
	struct vm_result result;
	uint64_t cntfrq;
	int held;

	set_program_name("tracekit-vmm");
	parse_options(argc, argv, &opts);
	guest_load_file(opts.guest_path, opts.ram_bytes, &image);
	check_backing(&opts);
	cntfrq = read_cntfrq();
	resolve_knobs(&opts, &image, cntfrq);
	if (opts.dump_knobs) {
		dump_knobs(&opts, opts.dump_knobs);
		print_run_line(&opts, &image, cntfrq);
		return EXIT_OK;
	}
	kvm_host_open(&host);
	check_options(&opts, &host);
	if (opts.cpus.count && pin_to_cpu(opts.cpus.cpus[0]))
		die(EXIT_USAGE, "cannot pin to CPU %d (is it online and allowed?)",
		    opts.cpus.cpus[0]);
	sigaction(SIGUSR1, &kick, NULL);
	stop_signals_install();

	held = opts.hold_vm ? hold_idle_vm(&host) : -1;
	print_run_line(&opts, &image, cntfrq);
	result = run_series(&host, &opts, &image, &series);
	print_summary(&series, result.code != 0 || result.stopped);
	if (held >= 0)
		close(held);	/* after the series: the last VM's destroy left EL2 up */
	if (result.code)
		die(result.code, "%s", result.message);
	if (vmm_stop_signal)
		exit_by_stop_signal();
	return EXIT_OK;
}
