// SPDX-License-Identifier: GPL-2.0-only
/* Helpers shared by the VMM and the probe: CPU lists, pinning, clocks, trace markers. */
#define _GNU_SOURCE
#include "common.h"
#include "gtmark.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *program_name = "tracekit";

/*
 * The sync marker: HINT #0x77 at slot GT_SYNC_SLOT of a 512-byte aligned block, so the
 * plugin's logged VA ((VA >> 3) & 63) tells it from gtmark's per-CPU ones. Reached by a
 * direct BL (never BLR), so it needs no `bti c` in binaries built with branch protection.
 */
__asm__(".pushsection .text\n"
	".balign 512\n"
	".skip " GT_SYNC_OFFSET_STR "\n"
	".type gt_sync_entry, %function\n"
	"gt_sync_entry:\n"
	"hint #" GT_HINT_STR "\n"
	"ret\n"
	".size gt_sync_entry, . - gt_sync_entry\n"
	".popsection\n");

void gt_sync_entry(void);

/* Set the name that prefixes error lines. */
void set_program_name(const char *name)
{
	program_name = name;
}

/* Print one error line and exit; newlines in the message become spaces. */
void die(int code, const char *fmt, ...)
{
	char message[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(message, sizeof(message), fmt, ap);
	va_end(ap);
	/* One line, even if a caller's message carried a newline. */
	for (char *p = message; *p; p++)
		if (*p == '\n')
			*p = ' ';
	fflush(stdout);
	fprintf(stderr, "%s: error: %s\n", program_name, message);
	exit(code);
}

/* Parse one non-negative CPU number starting at *text; advances *text past it. */
static int parse_cpu_number(const char *whole, const char **text)
{
	char *end;
	long value;

	if (**text < '0' || **text > '9')
		die(EXIT_USAGE, "bad CPU list '%s': expected a CPU number at '%s' (write e.g. 0-2,5)",
		    whole, *text);
	errno = 0;
	value = strtol(*text, &end, 10);
	if (errno || value >= MAX_CPUS)
		die(EXIT_USAGE, "bad CPU list '%s': CPU numbers go up to %d", whole, MAX_CPUS - 1);
	*text = end;
	return (int)value;
}

/* Parse "0-2,5" into CPU numbers, in the order given. */
void parse_cpu_list(const char *text, struct cpu_list *out)
{
	const char *p = text;

	out->count = 0;
	if (!*p)
		die(EXIT_USAGE, "empty CPU list: give CPUs as the kernel writes them, e.g. 0-2,5");
	for (;;) {
		int lo = parse_cpu_number(text, &p);
		int hi = lo;

		if (*p == '-') {
			p++;
			hi = parse_cpu_number(text, &p);
		}
		if (hi < lo)
			die(EXIT_USAGE, "bad CPU list '%s': range %d-%d is backwards", text, lo, hi);
		for (int cpu = lo; cpu <= hi; cpu++) {
			if (out->count == MAX_CPUS)
				die(EXIT_USAGE, "CPU list '%s' is too long", text);
			out->cpus[out->count++] = cpu;
		}
		if (*p == '\0')
			return;
		if (*p != ',')
			die(EXIT_USAGE, "bad CPU list '%s': unexpected '%c' (write e.g. 0-2,5)", text,
			    *p);
		p++;
	}
}

/* Write a CPU list back as "0-2,5", folding consecutive runs. */
void format_cpu_list(const struct cpu_list *list, char *buf, size_t size)
{
	size_t used = 0;

	buf[0] = '\0';
	for (int i = 0; i < list->count && used < size; i++) {
		int j = i;

		while (j + 1 < list->count && list->cpus[j + 1] == list->cpus[j] + 1)
			j++;
		if (j == i)
			used += snprintf(buf + used, size - used, "%s%d", i ? "," : "",
					 list->cpus[i]);
		else
			used += snprintf(buf + used, size - used, "%s%d-%d", i ? "," : "",
					 list->cpus[i], list->cpus[j]);
		i = j;
	}
}

/* Restrict the calling thread to one CPU. */
int pin_to_cpu(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

/* Parse a whole option value within [min, max] or die naming the option. */
uint64_t parse_u64(const char *option, const char *text, uint64_t min, uint64_t max)
{
	char *end;
	unsigned long long value;

	errno = 0;
	if (*text == '-' || *text == '\0')
		die(EXIT_USAGE, "%s '%s': expected a number from %llu to %llu", option, text,
		    (unsigned long long)min, (unsigned long long)max);
	value = strtoull(text, &end, 0);
	if (errno || *end != '\0' || value < min || value > max)
		die(EXIT_USAGE, "%s '%s': expected a number from %llu to %llu", option, text,
		    (unsigned long long)min, (unsigned long long)max);
	return value;
}

/* Map --clock names to clock ids. */
clockid_t parse_clock(const char *text)
{
	if (strcmp(text, "boottime") == 0)
		return CLOCK_BOOTTIME;
	if (strcmp(text, "monotonic") == 0)
		return CLOCK_MONOTONIC;
	die(EXIT_USAGE, "--clock '%s': expected boottime (ftrace's 'boot' clock) or monotonic",
	    text);
}

/* Name of a clock id for the output lines. */
const char *clock_name(clockid_t clock)
{
	return clock == CLOCK_BOOTTIME ? "boottime" : "monotonic";
}

/* Read CLOCK in nanoseconds. */
uint64_t now_ns(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Open the trace_marker file given on the command line, if any. */
int trace_marker_open(const char *path)
{
	int fd;

	if (!path)
		return -1;
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		die(EXIT_USAGE, "--trace-marker %s: %s (give a tracefs trace_marker file, e.g. "
		    "/sys/kernel/tracing/instances/NAME/trace_marker, and run as root)",
		    path, strerror(errno));
	return fd;
}

/* Write one marker line; a failed write warns once and never stops a run. */
void trace_marker(int fd, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int len;

	if (fd < 0)
		return;
	va_start(ap, fmt);
	len = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (len < 0)
		return;
	if (len > (int)sizeof(line) - 2)
		len = sizeof(line) - 2;
	line[len++] = '\n';
	/* A lost marker must not stop a measurement; a short write is reported once. */
	if (write(fd, line, len) != len) {
		static bool warned;

		if (!warned)
			fprintf(stderr, "warning: trace marker write failed: %s\n",
				strerror(errno));
		warned = true;
	}
}

/* Execute the sync marker between two CLOCK_BOOTTIME reads, noting the CPU. */
void gt_sync_mark(struct gt_sync *out)
{
	int before = sched_getcpu();

	out->t0 = now_ns(CLOCK_BOOTTIME);
	gt_sync_entry();
	out->t1 = now_ns(CLOCK_BOOTTIME);
	out->cpu = sched_getcpu() == before ? before : -1;
}

/* One record=sync line on stdout; a marker never executed (t1 == 0) prints nothing. */
void gt_sync_print(const char *source, long long vm, const char *event,
		   const struct gt_sync *sync)
{
	if (!sync->t1)
		return;
	printf("record=sync source=%s vm=%lld event=%s cpu=%d t0=%llu t1=%llu\n", source, vm,
	       event, sync->cpu, (unsigned long long)sync->t0, (unsigned long long)sync->t1);
}

void fprint_escaped(FILE *out, const char *text)
{
	for (const char *p = text; *p; p++) {
		if (*p == '%' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '=')
			fprintf(out, "%%%02X", (unsigned char)*p);
		else
			fputc(*p, out);
	}
}
