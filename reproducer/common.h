/* SPDX-License-Identifier: GPL-2.0-only */
/* Helpers shared by the VMM and the probe: CPU lists, pinning, clocks, trace markers. */
#ifndef TRACEKIT_COMMON_H
#define TRACEKIT_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* Exit codes shared by both tools (README "Exit codes"). */
enum exit_code {
	EXIT_OK = 0,
	EXIT_USAGE = 2,		/* bad option or value */
	EXIT_NO_KVM = 3,	/* /dev/kvm missing or unusable */
	EXIT_BAD_GUEST = 4,	/* guest file: not an ELF, wrong machine, no note, ... */
	EXIT_KVM_RUN = 5,	/* KVM_RUN itself failed */
	EXIT_UNEXPECTED = 6,	/* the guest exited for a reason the protocol lacks */
	EXIT_BAD_MARKER = 7,	/* a vCPU's marker word is not the expected value */
	EXIT_TIMEOUT = 8,	/* the run phase outlived --timeout */
	EXIT_IPA_SIZE = 9,	/* requested IPA size not supported by this host */
	EXIT_SYSTEM = 10,	/* another system call or KVM ioctl failed */
};

#define MAX_CPUS 1024

/* A CPU list in the kernel's notation, kept in the order given ("0-2,5"). */
struct cpu_list {
	int count;
	int cpus[MAX_CPUS];
};

/* Print "PROG: error: MESSAGE" as one line on stderr and exit with CODE. */
void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* Set the program name used in error lines. */
void set_program_name(const char *name);

/* Print TEXT with whitespace, '=' and '%' escaped (%XX) so key=value lines stay parseable. */
void fprint_escaped(FILE *out, const char *text);

/* Parse a kernel CPU list; dies with EXIT_USAGE on bad syntax. */
void parse_cpu_list(const char *text, struct cpu_list *out);

/* Format a CPU list back into "0-2,5" form (as given, consecutive runs folded). */
void format_cpu_list(const struct cpu_list *list, char *buf, size_t size);

/* Pin the calling thread to CPU; returns 0 or an errno value. */
int pin_to_cpu(int cpu);

/* Parse an unsigned decimal (or 0x hex) option value in [min, max]; dies otherwise. */
uint64_t parse_u64(const char *option, const char *text, uint64_t min, uint64_t max);

/* Parse "boottime" or "monotonic" into a clock id; dies otherwise. */
clockid_t parse_clock(const char *text);

/* The name of a clock id parse_clock accepts. */
const char *clock_name(clockid_t clock);

/* Current time of CLOCK in nanoseconds. */
uint64_t now_ns(clockid_t clock);

/* The virtual counter (CNTVCT_EL0), ordered by ISBs against surrounding code. */
static inline uint64_t read_cntvct(void)
{
	uint64_t value;

	__asm__ volatile("isb\n\tmrs %0, cntvct_el0\n\tisb" : "=r"(value) : : "memory");
	return value;
}

/* The counter frequency in Hz (CNTFRQ_EL0, set by firmware). */
static inline uint64_t read_cntfrq(void)
{
	uint64_t value;

	__asm__ volatile("mrs %0, cntfrq_el0" : "=r"(value));
	return value;
}

/* Open a trace_marker file for writing; -1 when PATH is NULL; dies if it cannot. */
int trace_marker_open(const char *path);

/* Write one formatted marker line (one write(), so lines never interleave). */
void trace_marker(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One ground-truth sync marker: CLOCK_BOOTTIME just before and just after it, and the CPU
 * it ran on (-1 if the thread moved across it). t1 == 0: never executed. */
struct gt_sync {
	uint64_t t0;
	uint64_t t1;
	int cpu;
};

/* Execute the ground-truth marker at the sync slot (gtmark.h) and time it. A NOP on a
 * board; in the emulated host the QEMU plugin logs it, so the clock fit gains a point. */
void gt_sync_mark(struct gt_sync *out);

/* Print one `record=sync` line (reproducer/README.md) for a marker that was executed. */
void gt_sync_print(const char *source, long long vm, const char *event,
		   const struct gt_sync *sync);

#endif /* TRACEKIT_COMMON_H */
